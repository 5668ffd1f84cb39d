"""The messages of the OpenAI Realtime protocol as `/v1/realtime` speaks them: JSON text
messages `{"type": ..., "event_id": ...}` over one WebSocket.

This module is the wire format only: the client events this server reads (`parse`, the
`session.update` fields it honours, base64 audio), the PCM both ways, and the server events it
writes (`ServerEvents`: every one with a unique `event_id`, named in the GA or the beta
vocabulary). What the events mean for a session lives in realtime.py.

GA names are the default; a client that sends `OpenAI-Beta: realtime=v1` (the SDK's beta
client, older integrations) gets the beta names and the flat session fields, never both:

    GA                                        beta
    response.output_audio.delta / .done       response.audio.delta / .done
    response.output_audio_transcript.*        response.audio_transcript.*
    conversation.item.added / .done           conversation.item.created / (none)
    session.audio.input.format, ...           session.input_audio_format, voice, ...
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass, field

from personaplex_edge.streams import CODEBOOKS_PER_SPEAKER

from ..pcm_frames import F32, PCM16

RATE = 24000  # Hz, both ways: the model's own rate, and the only one OpenAI's PCM has
MAX_EVENT_BYTES = 15 << 20  # what OpenAI allows a client event (an append of ~5 minutes)

# The client events of OpenAI's Realtime API. Those this server does not act on are read and
# let go (a turn-based client sends them as a matter of course); any other type is an error.
CLIENT_EVENTS = frozenset({
    "session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
    "input_audio_buffer.clear", "output_audio_buffer.clear", "conversation.item.create",
    "conversation.item.retrieve", "conversation.item.truncate", "conversation.item.delete",
    "response.create", "response.cancel"})


class EventError(Exception):
    """A client event this server cannot take: answered with one `error` event of type
    `invalid_request_error`; the session goes on."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None,
                 event_id: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param
        self.event_id = event_id


# -- client events ------------------------------------------------------------------------------
def parse(text: str | bytes) -> dict:
    """One text message -> the event (a dict with a known `type`); EventError otherwise."""
    if len(text) > MAX_EVENT_BYTES:
        raise EventError(f"event of {len(text)} bytes is over the limit of {MAX_EVENT_BYTES}",
                         code="event_too_large")
    try:
        event = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise EventError(f"not a JSON event ({e})", code="invalid_json") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise EventError("an event is a JSON object with a string `type`",
                         code="invalid_event", param="type")
    event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
    if event["type"] not in CLIENT_EVENTS:
        raise EventError(f"unknown event type {event['type']!r}; this server takes "
                         + ", ".join(sorted(CLIENT_EVENTS)),
                         code="invalid_event_type", param="type", event_id=event_id)
    return event


def audio_bytes(event: dict) -> bytes:
    """An append's `audio` (base64) -> bytes; EventError for anything else."""
    data = event.get("audio")
    if not isinstance(data, str):
        raise EventError("input_audio_buffer.append needs `audio`: base64 PCM",
                         param="audio", event_id=event.get("event_id"))
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise EventError(f"`audio` is not base64 ({e})", param="audio",
                         event_id=event.get("event_id")) from None


def assistant_item(event: dict) -> tuple[str, str] | None:
    """A `conversation.item.create` of an assistant message -> (its id, its text: the text or
    transcript of its content parts, joined); None for any other item (user, system, tool
    items are let go: the model hears only audio). EventError for a malformed one."""
    item = event.get("item")
    if not isinstance(item, dict):
        raise EventError("conversation.item.create needs an `item` object", param="item",
                         event_id=event.get("event_id"))
    if item.get("type", "message") != "message" or item.get("role") != "assistant":
        return None
    content = item.get("content")
    parts = content if isinstance(content, list) else []
    texts = [p.get("text", p.get("transcript")) for p in parts if isinstance(p, dict)]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise EventError("an assistant item to say holds content parts with a string `text` "
                         '(e.g. [{"type": "output_text", "text": "Your tea is ready."}])',
                         param="item.content", event_id=event.get("event_id"))
    item_id = item.get("id") if isinstance(item.get("id"), str) else new_id("item")
    return item_id, " ".join(texts)


@dataclass(frozen=True)
class SessionUpdate:
    """The fields of a `session.update` this server honours (None: not given). The rest
    (model, tools, turn_detection, temperature, ...) is read and let go."""

    instructions: str | None = None
    voice: str | None = None
    input_format: str | None = None
    voice_param: str = "session.audio.output.voice"  # where the client put the voice
    # the user's words: on (an object), off (null), or not given (None); where the client put it
    transcription: bool | None = None
    transcription_param: str = "session.audio.input.transcription"


def _path(session: dict, *keys: str):
    node = session
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _input_format(value, param: str, event_id) -> str | None:
    """A format in either vocabulary -> PCM16 or F32; EventError for one this server lacks."""
    if value is None:
        return None
    rate = RATE
    if isinstance(value, dict):  # GA: {"type": "audio/pcm", "rate": 24000}
        rate = value.get("rate", RATE)
        value = value.get("type")
    name = {"audio/pcm": PCM16, PCM16: PCM16, F32: F32}.get(value)
    if name is None or rate != RATE:
        raise EventError(f"{param}: {value!r} at {rate} Hz is not taken here; this server takes "
                         f"PCM16 (audio/pcm, pcm16) or {F32}, mono at {RATE} Hz",
                         code="unsupported_audio_format", param=param, event_id=event_id)
    return name


def parse_session_update(event: dict) -> SessionUpdate:
    """A `session.update`'s fields, from the GA shape (`audio.input.format`,
    `audio.output.voice`) or the beta flat one (`input_audio_format`, `voice`), whichever the
    client uses (vllm-omni's client sends flat fields without the beta header)."""
    event_id = event.get("event_id")
    session = event.get("session")
    if not isinstance(session, dict):
        raise EventError("session.update needs a `session` object", param="session",
                         event_id=event_id)
    instructions = session.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise EventError("session.instructions must be a string", param="session.instructions",
                         event_id=event_id)
    voice, voice_param = _path(session, "audio", "output", "voice"), "session.audio.output.voice"
    if voice is None and "voice" in session:
        voice, voice_param = session["voice"], "session.voice"
    if isinstance(voice, dict):  # GA: a custom voice as {"id": ...}
        voice = voice.get("id")
    if voice is not None and not isinstance(voice, str):
        raise EventError(f"{voice_param} must be a voice name", param=voice_param,
                         event_id=event_id)
    for param, value in (("session.audio.output.format", _path(session, "audio", "output",
                                                                "format")),
                         ("session.output_audio_format", session.get("output_audio_format"))):
        if value is not None and _input_format(value, param, event_id) != PCM16:
            raise EventError(f"{param}: answers are PCM16 at {RATE} Hz only",
                             code="unsupported_audio_format", param=param, event_id=event_id)
    fmt = _input_format(_path(session, "audio", "input", "format"),
                        "session.audio.input.format", event_id)
    if fmt is None:
        fmt = _input_format(session.get("input_audio_format"), "session.input_audio_format",
                            event_id)
    transcription, transcription_param = _transcription(session, event_id)
    return SessionUpdate(instructions=instructions, voice=voice, input_format=fmt,
                         voice_param=voice_param, transcription=transcription,
                         transcription_param=transcription_param)


def _transcription(session: dict, event_id) -> tuple[bool | None, str]:
    """Whether the update turns the user's transcription on or off (None: it says nothing):
    GA `audio.input.transcription`, beta `input_audio_transcription` - an object (its model,
    language, prompt are the server's own) or null."""
    audio_input = _path(session, "audio", "input")
    for present, value, param in (
            (isinstance(audio_input, dict) and "transcription" in audio_input,
             audio_input.get("transcription") if isinstance(audio_input, dict) else None,
             "session.audio.input.transcription"),
            ("input_audio_transcription" in session, session.get("input_audio_transcription"),
             "session.input_audio_transcription")):
        if present:
            if value is not None and not isinstance(value, dict):
                raise EventError(f"{param} is an object (e.g. {{\"model\": ...}}) or null",
                                 param=param, event_id=event_id)
            return value is not None, param
    return None, "session.audio.input.transcription"


# -- server events --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dialect:
    """The names that differ between the GA and the beta vocabularies."""

    audio_delta: str
    audio_done: str
    transcript_delta: str
    transcript_done: str
    item_added: str
    item_done: str | None  # the beta has no such event
    content_type: str  # of the assistant item's audio content
    text_type: str  # of an assistant item's text content


GA = Dialect("response.output_audio.delta", "response.output_audio.done",
             "response.output_audio_transcript.delta", "response.output_audio_transcript.done",
             "conversation.item.added", "conversation.item.done", "output_audio", "output_text")
BETA = Dialect("response.audio.delta", "response.audio.done", "response.audio_transcript.delta",
               "response.audio_transcript.done", "conversation.item.created", None, "audio",
               "text")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


@dataclass
class SessionView:
    """What `session.created` / `session.updated` show: the effective session."""

    id: str
    model: str
    instructions: str
    voice: str | None
    input_format: str = PCM16
    transcription: dict | None = None  # {"model": the transcriber} while the user is heard


@dataclass
class Response:
    """The one response open while the model speaks: its ids, its transcript so far, and the
    frames it has answered."""

    id: str = field(default_factory=lambda: new_id("resp"))
    item_id: str = field(default_factory=lambda: new_id("item"))
    transcript: list[str] = field(default_factory=list)  # the text pieces sent
    frames: int = 0  # answer frames sent, each one step: one frame heard, one spoken

    def usage(self) -> dict:
        """What the response used, in the shape of OpenAI's `usage`, counted in the model's own
        tokens: each frame the model reads the user's 8 Mimi codes and writes its own 8
        (CODEBOOKS_PER_SPEAKER a frame: 100 audio tokens a second each way, so seconds =
        audio_tokens / 100), and each text piece sent is one text token (padding is none)."""
        audio = self.frames * CODEBOOKS_PER_SPEAKER
        text = len(self.transcript)
        return {"total_tokens": 2 * audio + text, "input_tokens": audio,
                "output_tokens": audio + text,
                "input_token_details": {"text_tokens": 0, "audio_tokens": audio,
                                        "cached_tokens": 0},
                "output_token_details": {"text_tokens": text, "audio_tokens": audio}}


def _message(item_id: str, status: str, content: list[dict]) -> dict:
    """An assistant message item: a client's text to say, or a response's audio."""
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
            "status": status, "content": content}


class ServerEvents:
    """The server events of one connection, as JSON text, in its client's vocabulary."""

    def __init__(self, beta: bool = False):
        self.beta = beta
        self.names = BETA if beta else GA

    def _encode(self, type_: str, **fields) -> str:
        return json.dumps({"type": type_, "event_id": new_id("event"), **fields},
                          ensure_ascii=False, separators=(",", ":"))

    # -- the session ------------------------------------------------------------------------------
    def _session(self, s: SessionView) -> dict:
        pcm = {"type": "audio/pcm", "rate": RATE}
        if self.beta:
            return {"id": s.id, "object": "realtime.session", "model": s.model,
                    "modalities": ["audio", "text"], "instructions": s.instructions,
                    "voice": s.voice, "input_audio_format": s.input_format,
                    "output_audio_format": PCM16, "turn_detection": None,
                    "input_audio_transcription": s.transcription,
                    "tools": [], "tool_choice": "auto", "max_response_output_tokens": "inf"}
        fmt = pcm if s.input_format == PCM16 else {"type": F32, "rate": RATE}
        return {"type": "realtime", "object": "realtime.session", "id": s.id, "model": s.model,
                "output_modalities": ["audio"], "instructions": s.instructions,
                "audio": {"input": {"format": fmt, "turn_detection": None,
                                    "transcription": s.transcription},
                          "output": {"format": pcm, "voice": s.voice, "speed": 1.0}},
                "tools": [], "tool_choice": "auto", "max_output_tokens": "inf"}

    def session_object(self, s: SessionView) -> dict:
        """The session as this vocabulary shows it, outside an event: what a client key's
        answer holds (client_secrets, the beta's /v1/realtime/sessions)."""
        return self._session(s)

    def session_created(self, s: SessionView) -> str:
        return self._encode("session.created", session=self._session(s))

    def session_updated(self, s: SessionView) -> str:
        return self._encode("session.updated", session=self._session(s))

    def error(self, message: str, type_: str = "invalid_request_error",
              code: str | None = None, param: str | None = None,
              event_id: str | None = None) -> str:
        return self._encode("error", error={"type": type_, "code": code, "message": message,
                                            "param": param, "event_id": event_id})

    def input_cleared(self) -> str:
        return self._encode("input_audio_buffer.cleared")

    def output_buffer(self, change: str, response_id: str) -> str:
        """`output_audio_buffer.started`, `.stopped` or `.cleared` (a call's, WebRTC only)."""
        return self._encode(f"output_audio_buffer.{change}", response_id=response_id)

    def item_created(self, item_id: str, text: str) -> list[str]:
        """A client's assistant text item, taken into the conversation."""
        item = _message(item_id, "completed", [{"type": self.names.text_type, "text": text}])
        events = [self._encode(self.names.item_added, previous_item_id=None, item=item)]
        if self.names.item_done is not None:
            events.append(self._encode(self.names.item_done, previous_item_id=None, item=item))
        return events

    # -- the user's words (a model with a transcriber, a session that asked) -------------------
    def _user_item(self, item_id: str, status: str, transcript: str | None) -> dict:
        return {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
                "status": status, "content": [{"type": "input_audio",
                                               "transcript": transcript}]}

    def user_item_added(self, item_id: str) -> str:
        """The user's audio of one turn, as an item (its transcript comes as it is heard)."""
        return self._encode(self.names.item_added, previous_item_id=None,
                            item=self._user_item(item_id, "in_progress", None))

    def input_transcription_delta(self, item_id: str, text: str) -> str:
        return self._encode("conversation.item.input_audio_transcription.delta",
                            item_id=item_id, content_index=0, delta=text)

    def input_transcription_completed(self, item_id: str, transcript: str,
                                      usage: dict) -> list[str]:
        """The turn's transcript, and (GA) its item done."""
        events = [self._encode("conversation.item.input_audio_transcription.completed",
                               item_id=item_id, content_index=0, transcript=transcript,
                               usage=usage)]
        if self.names.item_done is not None:
            events.append(self._encode(self.names.item_done, previous_item_id=None,
                                       item=self._user_item(item_id, "completed", transcript)))
        return events

    # -- the response -----------------------------------------------------------------------------
    def _item(self, r: Response, status: str, transcript: str | None = None) -> dict:
        content = [] if transcript is None else [{"type": self.names.content_type,
                                                  "transcript": transcript}]
        return _message(r.item_id, status, content)

    def _response(self, r: Response, status: str, output: list, **more) -> dict:
        modalities = {"modalities": ["audio", "text"]} if self.beta else \
            {"output_modalities": ["audio"]}
        return {"id": r.id, "object": "realtime.response", "status": status, "output": output,
                **modalities, **more}

    def response_opened(self, r: Response) -> list[str]:
        """response.created, the assistant item, its output item and its audio part."""
        item = self._item(r, "in_progress")
        part = {"type": "audio", "transcript": ""}
        where = {"response_id": r.id, "item_id": r.item_id, "output_index": 0,
                 "content_index": 0}
        return [
            self._encode("response.created",
                         response=self._response(r, "in_progress", [], status_details=None)),
            self._encode(self.names.item_added, previous_item_id=None, item=item),
            self._encode("response.output_item.added", response_id=r.id, output_index=0,
                         item=item),
            self._encode("response.content_part.added", part=part, **where)]

    def audio_delta(self, r: Response, pcm: bytes) -> str:
        return self._encode(self.names.audio_delta, response_id=r.id, item_id=r.item_id,
                            output_index=0, content_index=0,
                            delta=base64.b64encode(pcm).decode("ascii"))

    def transcript_delta(self, r: Response, text: str) -> str:
        return self._encode(self.names.transcript_delta, response_id=r.id, item_id=r.item_id,
                            output_index=0, content_index=0, delta=text)

    def response_closed(self, r: Response, status: str, details: dict | None) -> list[str]:
        """The done events of a response that ends with `status` (completed, cancelled,
        incomplete, failed)."""
        transcript = "".join(r.transcript)
        # an item is completed or incomplete, never cancelled
        item = self._item(r, "completed" if status == "completed" else "incomplete",
                          transcript)
        where = {"response_id": r.id, "item_id": r.item_id, "output_index": 0,
                 "content_index": 0}
        events = [
            self._encode(self.names.audio_done, **where),
            self._encode(self.names.transcript_done, transcript=transcript, **where),
            self._encode("response.content_part.done",
                         part={"type": "audio", "transcript": transcript}, **where),
            self._encode("response.output_item.done", response_id=r.id, output_index=0,
                         item=item)]
        if self.names.item_done is not None:
            events.append(self._encode(self.names.item_done, previous_item_id=None, item=item))
        events.append(self._encode("response.done", response=self._response(
            r, status, [item], status_details=details, usage=r.usage())))
        return events


def beta_requested(header: str | None) -> bool:
    """Whether an `OpenAI-Beta` header asks for the beta Realtime vocabulary."""
    return any(part.strip().lower() == "realtime=v1" for part in (header or "").split(","))
