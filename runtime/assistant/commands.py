"""The control socket's commands: one entry of COMMANDS each.

A command is a function (assistant, request) -> the reply's fields; the request is the client's
JSON object (its "cmd" and any arguments). It runs on the socket's thread: it sets what the
audio loop reads at its next frame (IdleGate.request, .muted) rather than stepping anything
itself. Adding a command is one entry here (the Assistant in service.py reaches the
conversation core as `a.gate.conv`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from ..words.say import check_say_text
from .idle import IdleGate


class Assistant(Protocol):
    """What a command reaches of the service (service.Assistant)."""

    gate: IdleGate

    def status(self) -> dict: ...

    def emit(self, event: dict) -> None: ...


@dataclass(frozen=True)
class Command:
    run: Callable[[Assistant, dict], dict]
    help: str


def _mute(a: Assistant, muted: bool) -> dict:
    a.gate.muted = muted
    a.emit({"event": "muted" if muted else "unmuted"})
    return {"muted": muted}


def _request(a: Assistant, what: str) -> dict:
    a.gate.request(what)
    return {"requested": what}


def _say(a: Assistant, request: dict) -> dict:
    text = check_say_text(request.get("text"), 'say\'s "text" ({"cmd": "say", "text": "Your '
                                               'tea is ready."})')
    utterance = a.gate.say(text)
    return {"utterance": utterance.id, "words": list(utterance.words)}


def _cancel(a: Assistant, request: dict) -> dict:
    a.gate.cancel_say()
    return {"cancelled": True}


COMMANDS: dict[str, Command] = {
    "status": Command(lambda a, req: a.status(), "state, devices, persona and the figures"),
    "mute": Command(lambda a, req: _mute(a, True),
                    "the model hears silence and no voice wakes it"),
    "unmute": Command(lambda a, req: _mute(a, False), "the microphone again"),
    "sleep": Command(lambda a, req: _request(a, "sleep"),
                     "sleep now (the next conversation is made ready)"),
    "wake": Command(lambda a, req: _request(a, "wake"), "wake now, without a voice"),
    "say": Command(_say, "the model says TEXT in its voice (queued after any words still "
                         "queued; wakes it); say events follow each word"),
    "cancel": Command(_cancel, "drop the words `say` queued (the word being spoken ends)"),
    "help": Command(lambda a, req: {"commands": {n: c.help for n, c in COMMANDS.items()}},
                    "the commands"),
}


def dispatch(assistant: Assistant, request: dict) -> dict:
    """A client's request -> its reply (an error names what to send instead)."""
    name = request.get("cmd")
    command = COMMANDS.get(name) if isinstance(name, str) else None
    if command is None:
        return {"ok": False, "error": f"unknown command {name!r}; the commands: "
                                      + ", ".join(COMMANDS) + ' (e.g. {"cmd": "status"})'}
    return {"ok": True, "cmd": name, **command.run(assistant, request)}
