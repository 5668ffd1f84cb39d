"""`GET /api/chat`: the moshi/PersonaPlex protocol (protocol.py) on the shared session flow
(lifecycle.py): one WebSocket, one conversation on the shared model.

    the query parameters are the persona and sampling (ERROR naming a bad one)  ->  HANDSHAKE
    once the persona prefill is done  ->  Ogg/Opus in, Ogg/Opus and text pieces out (SAY in:
    words for the model to say; their events out. HEARD in: the user's words out, from a
    model with a transcriber)  ->  ERROR with the reason before the close (unless the client
    left).

Whatever a client sends ends at most its own session: its bytes are parsed and decoded here,
on the event loop, and only whole 1920-sample frames reach the model.
"""

from __future__ import annotations

import asyncio

import numpy as np
from aiohttp import web

from . import protocol
from .lifecycle import Wire, serve_websocket
from .opus import OpusDecoder, OpusEncoder, OpusError
from ..words.heard import Heard
from ..words.heard_message import HeardMessageError, no_transcriber, parse_request
from ..words.heard_message import event_payload as heard_payload
from ..words.say import SayError, SayEvent
from ..words.say_message import SayCommand, event_payload, parse_command, queued_payload
from .params import ChatParams, parse_params
from .session import ClientError, Session

STATS_INTERVAL = 1.0  # seconds between the metadata messages a `stats=1` client gets


class ChatSession(Session):
    """A session whose audio is Ogg/Opus both ways and whose text goes out piece by piece."""

    protocol = "chat"

    def __init__(self, **core):
        super().__init__(**core)
        self.decoder = OpusDecoder(self.sample_rate, self.frame_size)
        self.encoder = OpusEncoder(self.sample_rate)

    def receive_audio(self, pages: bytes) -> int:
        """A client's audio message -> frames into the backlog; returns the frames dropped.
        OpusError for bytes that are not Ogg/Opus."""
        frames = self.decoder.feed(pages)
        return self.receive_frames(frames, sum(f.shape[0] for f in frames))

    def _answer(self, pcm: np.ndarray, piece: str) -> None:
        if piece:
            self.send(protocol.text(piece))
        pages = self.encoder.encode(pcm)
        if pages:
            self.send(protocol.audio(pages))

    def command(self, command: SayCommand) -> None:
        if command.cancel:
            self.with_conversation(lambda conv: conv.cancel_say())
        else:
            self.with_conversation(lambda conv: conv.say(command.text),
                                   lambda said: self.send(protocol.say(queued_payload(said))))

    def _word(self, event: SayEvent) -> None:
        self.send(protocol.say(event_payload(event, self.conv.prompt_frames)))

    hearing = False  # the client asked for HEARD messages

    def _heard(self, event: Heard) -> None:
        if self.hearing:
            self.send(protocol.heard(heard_payload(event)))


class ChatWire(Wire):
    name = "chat"
    # aiohttp's own limit sits above the protocol's: past it aiohttp closes (1009) before the
    # handler sees the message, so a message just over MAX_MESSAGE_BYTES still gets its ERROR
    max_message_bytes = 4 * protocol.MAX_MESSAGE_BYTES
    client_errors = (protocol.ProtocolError, OpusError, ClientError, SayError,
                     HeardMessageError)

    def refusal(self, reason: str, stopping: bool) -> list[bytes | str]:
        return [protocol.error(reason)]

    def open_session(self, **core) -> ChatSession:
        return ChatSession(**core)

    async def params(self, session: Session) -> ChatParams:
        state = self.state
        return parse_params(self.request.query, state.sampling, state.persona, state.voices,
                            state.top_k_max)

    def ready(self, session: Session) -> None:
        session.send(protocol.HANDSHAKE)

    def extra_tasks(self, session: Session) -> list:
        return [_report(session)] if session.params.stats else []

    def farewell(self, session: Session, reason: str | None, code: int) -> list[bytes | str]:
        return [protocol.error(reason)] if reason is not None else []

    def receive(self, session: ChatSession, data: str | bytes) -> None:
        if isinstance(data, str):
            raise protocol.ProtocolError("text WebSocket frames are not part of the protocol "
                                         "(every message is binary)")
        kind, payload = protocol.parse(data)
        if kind == protocol.Kind.AUDIO:
            dropped = session.receive_audio(payload)
            if dropped:
                self.state.stats.dropped.inc(dropped)
        elif kind == protocol.Kind.SAY:
            session.command(parse_command(payload))
        elif kind == protocol.Kind.HEARD:
            wanted = parse_request(payload)
            if wanted and self.state.model.loaded.transcriber is None:
                raise no_transcriber()  # a client is not told where the files are
            session.hearing = wanted


async def _report(session: Session) -> None:
    while True:
        await asyncio.sleep(STATS_INTERVAL)
        session.send(protocol.metadata(session.stats()))


async def chat(request: web.Request) -> web.StreamResponse:
    return await serve_websocket(request, ChatWire(request))
