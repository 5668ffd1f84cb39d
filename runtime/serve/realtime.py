"""`GET /v1/realtime` (and `/v1/duplex`, vllm-omni's name for it): the OpenAI Realtime protocol
(realtime_events.py) on the shared session flow (lifecycle.py), so voice-agent frameworks
(the openai SDK, pipecat, LiveKit) can talk to a local PersonaPlex. The query (`model`,
`duplex`, ...) is accepted and ignored. A WebRTC call (webrtc/call.py) runs this same session
on its data channel, its audio on an RTP track instead of in the events.

    session.created at once  ->  the persona: the instructions and voice of the session.update
    events sent before it is fixed, merged (an AgentSession sends its voice and its
    instructions in two), fixed when audio comes after one or SETTLE_S after the first; the
    server's defaults when audio comes and no update follows within GRACE_S  ->  its prefill
    ->  session.updated (audio sent before it is dropped, but for its last
    frame)  ->  PCM appends in, re-framed into 1920-sample steps  ->  one response out while
    the model speaks: response.created, the assistant item, then per answer frame a
    transcript delta (if the frame has a text piece) and an audio delta  ->  on Ctrl-C the
    response's done events, then close 1001.

The model listens and speaks at once, so the turn-based events change nothing here: commit,
clear and the other conversation.item.* events are read and let go, response.create opens a
response at the next frame when none is open, response.cancel ends the open one (status
`cancelled`) and its audio stops until the model starts a new word. A bad event is one `error`
event; the session goes on.

What the user says, where the model has a transcriber and the session turns transcription on
(GA `audio.input.transcription`, beta `input_audio_transcription`; runtime/words/heard.py): each of
the user's turns is a user item (conversation.item.added), its transcript comes as
conversation.item.input_audio_transcription.delta events while it is heard and .completed (with
`usage`) when the turn is over. Asked of a model without one: an `error` naming the field.

What an app has the model say (runtime/words/say.py) is an assistant message:
conversation.item.create with an assistant item's text (echoed as an added item), then
response.create. That response closes the open one and carries the words: it is done
(`completed`) two frames after the last word's last token, when the frame that holds it has gone
out, and the model's own speech goes on in a new response; response.cancel drops the words not
started (the one being spoken ends at its end) and ends it `cancelled`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from aiohttp import WSCloseCode, web

from personaplex_edge.audio import pcm16_bytes
from personaplex_edge.transcriber import no_transcriber

from ..pcm_frames import PCM16, PcmFrames
from .lifecycle import Wire, serve_websocket
from .params import MAX_TEXT_PROMPT_CHARS, ChatParams, ParamError
from ..words.heard import Heard
from ..words.say import SayError, SayEvent, Utterance, check_say_text
from .realtime_events import (MAX_EVENT_BYTES, EventError, Response, ServerEvents,
                              SessionUpdate, SessionView, assistant_item, audio_bytes,
                              beta_requested, new_id, parse, parse_session_update)
from .session import Session
from .state import ServerState

log = logging.getLogger("personaplex_edge.serve")

# seconds a client that streams before any session.update has to send one: pipecat, say, sends
# its update when session.created arrives, while its audio may already be flowing
GRACE_S = 0.5
# seconds after a first session.update that the persona stays open to more updates, when no
# audio comes first: a client that waits for session.updated before streaming waits this long
SETTLE_S = 0.1
# OpenAI's own voices: a framework's default (LiveKit's `marin`) more often than a choice. The
# bank's default voice speaks instead, said in the log and named in session.updated; any other
# name this model lacks is an error (a typo of a bank voice should not pass unnoticed).
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer",
                           "verse", "marin", "cedar"})


@dataclass
class UserTurn:
    """A user item being transcribed: one turn of what the transcriber hears (Heard.item)."""

    item_id: str  # the conversation item the client sees
    pieces: int = 0  # the deltas sent: the transcriber's text tokens written


class RealtimeSession(Session):
    """A session whose audio is base64 PCM in JSON events, answered as one open response."""

    protocol = "realtime"

    def __init__(self, events: ServerEvents, **core):
        super().__init__(**core)
        self.events = events
        self.input_format = PCM16
        self.frames = PcmFrames(self.frame_size)
        self.response: Response | None = None
        self._open_next = True  # the next answer frame opens a response, speech or not
        self._to_say = ""  # assistant text items waiting for response.create, joined
        self._saying = False  # the open (or next) response carries words the client gave
        self._utterance: int | None = None  # the say() behind it, once the tick thread took it
        self._closing: int | None = None  # answer frames until that response is done
        self.transcription = False  # the client asked for the user's words
        self._user_turns: dict[int, UserTurn] = {}  # by Heard.item

    def _heard(self, event: Heard) -> None:
        """What the transcriber heard, as the client's transcription events: each piece a
        delta (joined, they are the transcript), each turn's end its item completed."""
        if not self.transcription:
            return
        turn = self._user_turns.get(event.item)
        if turn is None:
            if event.kind == "turn":  # a turn heard before transcription was turned on
                return
            turn = self._user_turns[event.item] = UserTurn(new_id("item"))
            self.send(self.events.user_item_added(turn.item_id))
        if event.kind == "piece":
            turn.pieces += 1
            self.send(self.events.input_transcription_delta(turn.item_id, event.text))
        elif event.kind == "turn":
            del self._user_turns[event.item]
            for out in self.events.input_transcription_completed(turn.item_id, event.text,
                                                                 self._usage(event, turn)):
                self.send(out)

    def _usage(self, end: Heard, turn: UserTurn) -> dict:
        """A turn's usage in the transcriber's own tokens: the codes it read from the frame
        the speech began in (the turn's start) to the one that ended it, the pieces it
        wrote."""
        transcriber = self.conv.group.transcriber
        began = math.floor(end.start * transcriber.frame_rate + 1e-6)
        audio = (end.frame - began + 1) * transcriber.cfg.num_audio_codebooks
        return {"type": "tokens", "input_tokens": audio, "output_tokens": turn.pieces,
                "total_tokens": audio + turn.pieces,
                "input_token_details": {"audio_tokens": audio, "text_tokens": 0}}

    def receive_audio(self, data: bytes) -> int:
        """An append's bytes -> whole frames into the backlog; returns the frames dropped.
        Before the conversation is ready only the newest frame is kept: what the client
        said while the persona was being prefilled is not answered late."""
        frames, samples = self.frames.feed(data, self.input_format)
        dropped = self.receive_frames(frames, samples)
        if self.conv is None:
            dropped += self.backlog.trim(1)
        return dropped

    def set_input_format(self, fmt: str) -> None:
        if fmt != self.input_format:
            self.input_format = fmt
            self.frames.reset()  # a partial frame of the old format is not audio of the new

    def _answer(self, pcm: np.ndarray, piece: str) -> None:
        if self.response is None:
            if not (self._open_next or piece):
                return  # cancelled: quiet until the model starts a new word
            self._open_next = False
            self.response = Response()
            for event in self.events.response_opened(self.response):
                self.send(event)
        if piece:
            self.response.transcript.append(piece)
            self.send(self.events.transcript_delta(self.response, piece))
        self.response.frames += 1
        self.send_audio(pcm)
        if self._closing is not None:
            self._closing -= 1
            if self._closing <= 0:  # the said words' response is done; the model goes on
                for event in self.close_response("completed", None):
                    self.send(event)
                self._saying, self._closing, self._open_next = False, None, True

    def send_audio(self, pcm: np.ndarray) -> None:
        """One answer frame's audio to the client: an audio delta of the open response (a
        call sends it on its RTP track instead: webrtc/call.py)."""
        self.send(self.events.audio_delta(self.response, pcm16_bytes(pcm)))

    def add_assistant_text(self, text: str) -> None:
        """An assistant item's text, joined to those waiting for response.create; EventError
        (nothing kept) when together they are more than one say takes."""
        joined = " ".join(t for t in (self._to_say, text.strip()) if t)
        if joined:
            try:
                check_say_text(joined, "the assistant text waiting for response.create")
            except SayError as e:
                raise EventError(str(e), param="item.content") from None
        self._to_say = joined

    def want_response(self) -> None:
        """response.create: with assistant text waiting, a response that says it; else, while
        one is open it is that one, and without one the next frame opens one."""
        text, self._to_say = self._to_say, ""
        if not text:
            if self.response is None:
                self._open_next = True
            return
        for event in self.close_response("completed", None):
            self.send(event)
        self._open_next, self._saying, self._utterance, self._closing = True, True, None, None
        self.with_conversation(lambda conv: conv.say(text), self._said)

    def _said(self, utterance: Utterance) -> None:
        if self._saying:  # not cancelled meanwhile
            self._utterance = utterance.id
            if not utterance.words:  # nothing to wait for
                self._closing = 1

    def refused(self, reason: str) -> None:
        """The conversation took none of the words (its queue is full): an error event, and
        the response goes on as the model's own speech."""
        if self._saying and self._utterance is None:
            self._saying, self._closing = False, None
        self.send(self.events.error(reason, code="say_refused", param="item.content"))

    def _word(self, event: SayEvent) -> None:
        if self._saying and event.utterance == self._utterance and event.last:
            self._closing = 2  # the frame holding its last token goes out with the next answer

    def cancel_response(self) -> None:
        if self._saying:
            self.with_conversation(lambda conv: conv.cancel_say())
            self._saying, self._utterance, self._closing = False, None, None
        if self.response is not None:
            for event in self.close_response("cancelled", {"type": "cancelled",
                                                           "reason": "client_cancelled"}):
                self.send(event)
        self._open_next = False

    def close_response(self, status: str, details: dict | None) -> list[str]:
        """The open response's done events (none when none is open); it is closed."""
        if self.response is None:
            return []
        events = self.events.response_closed(self.response, status, details)
        self.response = None
        return events


class RealtimeWire(Wire):
    name = "realtime"
    # aiohttp's own limit sits above the protocol's, so an event just over MAX_EVENT_BYTES
    # still gets its error event
    max_message_bytes = 2 * MAX_EVENT_BYTES

    def __init__(self, request: web.Request):
        super().__init__(request)
        state = self.state
        self.events = ServerEvents(beta=beta_requested(request.headers.get("OpenAI-Beta")))
        self.view = SessionView(id=new_id("sess"), model=state.model_name,
                                instructions=state.persona.text_prompt or "",
                                voice=state.default_voice)
        self._persona: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending: ChatParams | None = None  # the updates' persona, until it is fixed
        self._streaming = False  # the client's audio has begun
        self._updates_unanswered = 0  # session.update events waiting for the persona
        self._timer: asyncio.TimerHandle | None = None  # GRACE_S or SETTLE_S

    def refusal(self, reason: str, stopping: bool) -> list[bytes | str]:
        if stopping:
            return [self.events.error(reason, "server_error", "server_shutting_down")]
        return [self.events.error(reason, "rate_limit_error", "resource_exhausted")]

    def open_session(self, **core) -> RealtimeSession:
        session = RealtimeSession(self.events, **core)
        session.send(self.events.session_created(self.view))
        return session

    async def params(self, session: Session) -> ChatParams:
        return await self._persona

    def ready(self, session: Session) -> None:
        for _ in range(self._updates_unanswered):
            session.send(self.events.session_updated(self.view))
        self._updates_unanswered = 0

    def farewell(self, session: RealtimeSession, reason: str | None,
                 code: int) -> list[bytes | str]:
        if reason is None:  # the client left: nobody to tell
            return []
        if code == WSCloseCode.GOING_AWAY:  # the server stops: the close frame says why
            return session.close_response("incomplete", {"type": "incomplete"})
        kind = "server_error" if code == WSCloseCode.INTERNAL_ERROR else "invalid_request_error"
        return session.close_response("failed", {"type": "failed", "error": {
            "type": kind, "message": reason}}) + [self.events.error(reason, kind)]

    def close_session(self, session: Session) -> None:
        if self._timer is not None:
            self._timer.cancel()

    # -- the client's events ----------------------------------------------------------------------
    def receive(self, session: RealtimeSession, data: str | bytes) -> None:
        if isinstance(data, bytes):
            session.send(self.events.error("binary messages are not part of the protocol: "
                                           "send JSON text events", code="invalid_event"))
        else:
            event = None
            try:
                event = parse(data)
                self._handle(session, event)
            except EventError as e:  # answered; the session goes on
                client_id = e.event_id or (event or {}).get("event_id")
                session.send(self.events.error(str(e), code=e.code, param=e.param,
                                               event_id=client_id))

    def _handle(self, session: RealtimeSession, event: dict) -> None:
        kind = event["type"]
        if kind == "input_audio_buffer.append":
            dropped = session.receive_audio(audio_bytes(event))
            if dropped:
                self.state.stats.dropped.inc(dropped)
            self.audio_came()
        elif kind == "session.update":
            self._update(session, parse_session_update(event))
        elif kind == "response.create":
            session.want_response()
        elif kind == "response.cancel":
            session.cancel_response()
        elif kind == "input_audio_buffer.commit" and session.transcription:
            # the client's own turn detection: the user's turn is over
            session.with_conversation(lambda conv: conv.end_turn())
        elif kind == "input_audio_buffer.clear":
            # what was appended has been heard already: there is no buffer to clear
            session.send(self.events.input_cleared())
        elif kind == "conversation.item.create":
            item = assistant_item(event)
            if item is not None:  # words for the next response.create to say
                session.add_assistant_text(item[1])
                for out in self.events.item_created(*item):
                    session.send(out)
        # commit (without transcription), output_audio_buffer.clear, other
        # conversation.item.*: nothing to do in full duplex

    def audio_came(self) -> None:
        """The client streams: the persona is fixed now if no update is to be waited for,
        else after GRACE_S for one to come."""
        self._streaming = True
        if not self._update_may_come():
            self._fix()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(GRACE_S, self._fix)

    def _update_may_come(self) -> bool:
        """Whether a session.update may still shape the persona: none has given one yet."""
        return self._pending is None

    def _update(self, session: RealtimeSession, update: SessionUpdate) -> None:
        """Formats apply at once; instructions and voice only until the persona is fixed;
        the effective session is echoed once the persona is ready."""
        if update.transcription is not None:
            refused = self._transcribe(session, update)
            if refused is not None:
                session.send(refused)
        params = None if self._persona.done() else self._params(session, update)  # EventError
        if update.input_format is not None:
            session.set_input_format(update.input_format)
            self.view.input_format = update.input_format
        if params is not None:
            self._pending = params
            if self._streaming:  # the client streams already: no later update to wait for
                self._fix()
            elif self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(SETTLE_S, self._fix)
        if session.conv is not None:
            session.send(self.events.session_updated(self.view))
        else:
            self._updates_unanswered += 1

    def _transcribe(self, session: RealtimeSession, update: SessionUpdate) -> dict | None:
        """Transcription on or off. Asked of a model without a transcriber: the error event
        naming the field, for the caller to send, and the rest of the update applies (LiveKit
        and OpenAI's Agents SDK ask for it by default)."""
        transcriber = self.state.model.loaded.transcriber
        if update.transcription and transcriber is None:
            return self.events.error(
                f"{update.transcription_param}: {no_transcriber()}",
                code="transcription_unavailable", param=update.transcription_param)
        session.transcription = bool(update.transcription)
        name = None if transcriber is None else transcriber.source
        if name and Path(name).is_absolute():  # a directory on the server: its name only
            name = Path(name).name
        self.view.transcription = {"model": name} if update.transcription else None
        return None

    def _params(self, session: Session, update: SessionUpdate) -> ChatParams:
        """The update's persona over the earlier updates' (or the server's defaults);
        EventError naming a bad field. The view shows it once it is valid."""
        state = self.state
        persona = (self._pending.persona if self._pending is not None else state.persona)
        view = {}
        check_instructions(update)
        if update.instructions is not None:
            persona = replace(persona, text_prompt=update.instructions.strip() or None)
            view["instructions"] = persona.text_prompt or ""
        if update.voice is not None and update.voice.strip():
            voice = bank_voice(state, update)
            if voice is None:
                log.warning("session %d (%s, realtime): voice %r is OpenAI's, not in this "
                            "model's bank: %s speaks instead (name one of /api/voices)",
                            session.id, session.peer, update.voice,
                            state.default_voice or "the model's default voice")
                voice = state.persona.voice  # the server's, as if none were named
            persona = replace(persona, voice=voice)
            # a --voice-dir file by its name, never its path
            view["voice"] = Path(voice).name if voice else state.default_voice
        self.view = replace(self.view, **view)
        return ChatParams(state.sampling, persona)

    def _fix(self) -> None:
        """The persona is fixed (its prefill starts): the updates' so far, or the server's."""
        if self._timer is not None:
            self._timer.cancel()
        if not self._persona.done():
            self._persona.set_result(self._pending or ChatParams(self.state.sampling,
                                                                  self.state.persona))


def check_instructions(update: SessionUpdate) -> None:
    """EventError for instructions over MAX_TEXT_PROMPT_CHARS (a session.update's, a call's
    starting session's: webrtc/starting.py)."""
    if update.instructions is not None and len(update.instructions) > MAX_TEXT_PROMPT_CHARS:
        raise EventError(f"session.instructions: {len(update.instructions)} characters, over "
                         f"the limit of {MAX_TEXT_PROMPT_CHARS}", param="session.instructions")


def bank_voice(state: ServerState, update: SessionUpdate) -> str | None:
    """The voice the update names, from this server's bank or --voice-dir; None for one of
    OpenAI's own (the server's voice speaks instead); EventError for any other."""
    try:
        return state.voices.resolve(update.voice)
    except ParamError as e:
        if update.voice.strip().lower() not in OPENAI_VOICES:
            raise EventError(f"{update.voice_param}: {e.reason}",
                             param=update.voice_param) from None
        return None


async def realtime(request: web.Request) -> web.StreamResponse:
    return await serve_websocket(request, RealtimeWire(request))
