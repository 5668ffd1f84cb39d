"""The SAY message (kind 0x08) of the moshi-protocol wires, `stdio` and `/api/chat`: words a
client has the model say, and what became of them. The payload is one JSON object.

    client -> server   {"say": "Your tea is ready."}   queue these words (after any queued)
                       {"cancel": true}                drop the queued words (the one being
                                                       spoken ends at its end)
    server -> client   {"event": "queued", "utterance": 1, "words": ["Your", "tea", ...]}
                       {"event": "started" | "done" | "cancelled", "word": "tea",
                        "utterance": 1, "index": 1, "step": 12, "last": false}

`step` counts the conversation's frames from the first after the persona (the client's first
audio frame is step 0); a word's "started" step is the frame whose text token is its EPAD, which
the answer to the next frame carries. Only a client that sends SAY gets SAY messages back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .say import SayError, SayEvent, Utterance, check_say_text


class SayMessageError(SayError):
    """A SAY payload that is not a command this side takes (the reason names the fix)."""


@dataclass(frozen=True)
class SayCommand:
    text: str | None = None  # words to say
    cancel: bool = False


def parse_command(payload: bytes) -> SayCommand:
    try:
        data = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SayMessageError(f"a SAY message holds one JSON object ({e})") from None
    if isinstance(data, dict) and data.get("cancel") is True and "say" not in data:
        return SayCommand(cancel=True)
    text = data.get("say") if isinstance(data, dict) else None
    if not isinstance(text, str):
        raise SayMessageError('a SAY message is {"say": "text"} or {"cancel": true}')
    return SayCommand(text=check_say_text(text, "a SAY message's text"))


def _json(data: dict) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def queued_payload(utterance: Utterance) -> bytes:
    return _json({"event": "queued", "utterance": utterance.id, "words": list(utterance.words)})


def event_payload(event: SayEvent, first_step: int) -> bytes:
    """A word event, its step counted from `first_step` (the first frame after the persona)."""
    return _json(event.to_dict(first_step))
