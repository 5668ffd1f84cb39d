"""One session's life, whatever its wire protocol and transport: the same checks, slots, persona
prefill, tick thread, metrics and logs for `/api/chat` (chat.py) and `/v1/realtime` (realtime.py)
over a WebSocket, and for `/v1/realtime/calls` (webrtc/routes.py) over a WebRTC call.

    (the host check, app.py's middleware: 403)  ->  origin check (403)  ->  token check
    (401)  ->  upgrade  ->  a free slot, or the protocol's refusal and close 1013 (1001 while
    stopping)  ->  the session's persona (the protocol says when it is known)  ->  its
    conversation opened and prefilled on the prefill thread  ->  the protocol's "ready"
    message  ->  audio in / answers out, until the client leaves, sends what ends its session,
    stops reading, or the server stops  ->  the protocol's last words, close, the row and the
    slot freed.

A protocol is a `Wire`: it builds its `Session` subclass, reads the client's messages, and
encodes its refusals, its ready message and its last words. A `Transport` carries those
messages: a WebSocket here (`serve_websocket`), a call's data channel in webrtc/call.py; both
run `converse`. Reading starts at the upgrade, so a client that leaves at any point ends its
session (and frees its slot) at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from concurrent.futures import Future
from dataclasses import dataclass
from typing import AsyncIterator

from aiohttp import WSCloseCode, WSMsgType, web

from personaplex_edge.errors import PersonaPlexError

from .auth import authorized, origin_allowed
from .params import ChatParams, ParamError
from .session import ClientError, Session
from .state import STATE, ServerState

log = logging.getLogger("personaplex_edge.serve")

CLOSE_TIMEOUT = 1.0  # seconds for the last messages and the close handshake of a session
# Bytes of answers the kernel and aiohttp may hold for a client before a send waits (several
# seconds of Opus, half a second of PCM16): past them a client that stopped reading fills its
# session's send queue and is cut off, instead of answers piling up as latency.
SOCKET_SEND_BUFFER = 32 << 10
LINGER_SECONDS = 10.0  # a closed connection whose peer does not read is cut off after this
WRITER_LIMIT = 32 << 10
_CLOSE_REASON_BYTES = 123  # what a WebSocket close frame can carry
TOKEN_NEEDED = "this server needs a token: ?token=... or 'Authorization: Bearer ...'"


class Wire:
    """A wire protocol's side of one connection (one instance per request)."""

    name = ""  # the protocol's name in the logs
    max_message_bytes = 1 << 20  # aiohttp closes (1009) past this, before the handler sees it
    # what a client may send that ends its session (1008), its message the reason
    client_errors: tuple[type[Exception], ...] = (ClientError,)

    def __init__(self, request: web.Request):
        self.request = request
        self.state: ServerState = request.app[STATE]

    def refusal(self, reason: str, stopping: bool) -> list[bytes | str]:
        """The messages that tell a client it gets no session (busy, or the server stops)."""
        raise NotImplementedError

    def open_session(self, **core) -> Session:
        """The protocol's Session, built from the core's arguments; it may queue greetings."""
        raise NotImplementedError

    async def params(self, session: Session) -> ChatParams:
        """The session's sampling and persona, once the protocol knows them. ParamError
        ends the session with its message."""
        raise NotImplementedError

    def receive(self, session: Session, data: str | bytes) -> None:
        """One message of the client, text (str) or binary (bytes), on the event loop."""
        raise NotImplementedError

    def ready(self, session: Session) -> None:
        """The conversation is prefilled and about to be stepped: tell the client."""

    def extra_tasks(self, session: Session) -> list:
        """Coroutines that run beside the conversation (cancelled when it ends)."""
        return []

    def farewell(self, session: Session, reason: str | None, code: int) -> list[bytes | str]:
        """The last messages before the close (`reason` None: the client left)."""
        return []

    def close_session(self, session: Session) -> None:
        """The session is over: drop whatever the protocol still holds for it."""


class Transport:
    """What carries one session's messages both ways (a WebSocket, a call's data channel)."""

    @property
    def closed(self) -> bool:
        """The client can no longer be reached: nothing more to start for it."""
        raise NotImplementedError

    def messages(self) -> AsyncIterator[str | bytes]:
        """The client's messages until it leaves (the iteration ends); ClientError for one
        that breaks the transport's own rules."""
        raise NotImplementedError

    async def send(self, message: str | bytes) -> None:
        """One message to the client; ConnectionError or RuntimeError once it is gone."""
        raise NotImplementedError

    async def close(self, messages: list[bytes | str], reason: str | None, code: int) -> None:
        """The last messages, then the end of the connection; never waits long on a peer
        that does not read."""
        raise NotImplementedError


class WebSocketTransport(Transport):
    def __init__(self, ws: web.WebSocketResponse, request: web.Request):
        self.ws = ws
        self.request = request

    @property
    def closed(self) -> bool:
        return self.ws.closed

    async def messages(self) -> AsyncIterator[str | bytes]:
        async for msg in self.ws:
            if msg.type == WSMsgType.ERROR:
                raise ClientError(f"bad WebSocket message: {self.ws.exception()}")
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                yield msg.data

    async def send(self, message: str | bytes) -> None:
        if isinstance(message, str):
            await self.ws.send_str(message)
        else:
            await self.ws.send_bytes(message)

    async def close(self, messages: list[bytes | str], reason: str | None, code: int) -> None:
        await close(self.ws, self.request, messages, reason, code)


@dataclass(frozen=True)
class Refusal:
    """Why a request may not open a session: its HTTP status, a message that says what to do,
    and OpenAI's error code for it (what an HTTP client of the calls' routes reads)."""

    status: int
    message: str
    code: str


def origin_refusal(request: web.Request, state: ServerState,
                   required: bool = False) -> Refusal | None:
    """The origin check (403) of every route that opens a session, counted and logged; None
    when it passes. `required`: a CORS preflight, which only a page sends, must name the
    page's origin."""
    origin = request.headers.get("Origin")
    if not ((required and origin is None) or not origin_allowed(request, state.allowed_origins)):
        return None
    state.stats.refused.labels(reason="origin").inc()
    log.info("%s: refused %s%s: origin %s is not allowed (--allowed-origins)",
             request.remote or "?", "the preflight of " if required else "", request.path,
             origin)
    return Refusal(403, f"origin {origin} may not open this server's sessions; serve with "
                        f"--allowed-origins {origin} to admit it", "origin_not_allowed")


def client_refusal(request: web.Request, state: ServerState, authorized_by=authorized,
                   unauthorized: str = TOKEN_NEEDED) -> Refusal | None:
    """The origin (403) and token (401) checks of every route that opens a session, counted
    and logged; None when both pass. `unauthorized`: what a 401 tells the client."""
    refusal = origin_refusal(request, state)
    if refusal is not None:
        return refusal
    if authorized_by(request, state.auth_token):
        return None
    state.stats.refused.labels(reason="unauthorized").inc()
    log.info("%s: refused %s: no valid token", request.remote or "?", request.path)
    return Refusal(401, unauthorized, "invalid_api_key")


def check_origin(request: web.Request, state: ServerState, required: bool = False) -> None:
    """origin_refusal as aiohttp's plain-text 403."""
    refusal = origin_refusal(request, state, required)
    if refusal is not None:
        raise web.HTTPForbidden(text=refusal.message + "\n")


def check_client(request: web.Request, state: ServerState, authorized_by=authorized) -> None:
    """client_refusal as aiohttp's plain-text 403 or 401 (a WebSocket's handshake)."""
    refusal = client_refusal(request, state, authorized_by)
    if refusal is None:
        return
    if refusal.status == 403:
        raise web.HTTPForbidden(text=refusal.message + "\n")
    raise web.HTTPUnauthorized(text=refusal.message + "\n",
                               headers={"WWW-Authenticate": "Bearer"})


def busy_reason(state: ServerState, peer: str, path: str) -> str | None:
    """Why a new session cannot start now (busy, or the server stops), counted and logged;
    None when a slot is free."""
    if not (state.stopping or state.slots_used >= state.max_sessions):
        return None
    reason = ("the server is shutting down" if state.stopping else
              f"busy: {state.slots_used} of {state.max_sessions} sessions")
    state.stats.refused.labels(reason="shutting_down" if state.stopping else "busy").inc()
    log.info("%s: refused %s: %s", peer, path, reason)
    return reason


async def serve_websocket(request: web.Request, wire: Wire) -> web.StreamResponse:
    state = wire.state
    peer = request.remote or "?"
    check_client(request, state)
    # no permessage-deflate: Opus does not compress, and PCM barely does for its CPU
    ws = web.WebSocketResponse(max_msg_size=wire.max_message_bytes, heartbeat=10.0,
                               timeout=CLOSE_TIMEOUT, compress=False, writer_limit=WRITER_LIMIT)
    await ws.prepare(request)
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SEND_BUFFER)
    transport = WebSocketTransport(ws, request)
    reason = busy_reason(state, peer, request.path)
    if reason is not None:
        await transport.close(wire.refusal(reason, state.stopping), reason,
                              WSCloseCode.GOING_AWAY if state.stopping
                              else WSCloseCode.TRY_AGAIN_LATER)
        return ws
    take_slot(state)
    try:
        await converse(state, wire, transport, peer)
    finally:
        free_slot(state)
    return ws


def take_slot(state: ServerState) -> None:
    state.slots_used += 1
    state.stats.open.set(state.slots_used)


def free_slot(state: ServerState) -> None:
    state.slots_used -= 1
    state.stats.open.set(state.slots_used)


async def converse(state: ServerState, wire: Wire, transport: Transport, peer: str,
                   session: Session | None = None) -> None:
    """One session on a slot already taken: its persona, prefill, ticks, until it ends, then
    its last words on `transport`. `session`: one the caller opened already (wire.open_session),
    else it is opened here."""
    if session is None:
        session = open_session(state, wire, peer)
    state.sessions.add(session)
    prefill: Future | None = None
    reason: str | None = None
    code = WSCloseCode.OK
    tasks: list[asyncio.Task] = [asyncio.create_task(_read(wire, transport, session)),
                                 asyncio.create_task(_write(transport, session))]
    try:
        session.params = await _until_ended(session, asyncio.ensure_future(wire.params(session)))
        if session.params is not None:
            prefill = state.prefill_pool.submit(_open_conversation, state, session.params)
            session.conv = await _until_ended(session, asyncio.wrap_future(prefill))
        if session.conv is None or transport.closed:
            if session.ended.done():
                reason, code = session.ended.result()
            return
        state.stats.prefill.observe(session.conv.prefill_seconds)
        wire.ready(session)
        state.stats.opened.inc()
        log.info("session %d (%s, %s): open, persona %s in %.2f s%s", session.id, peer,
                 wire.name, session.params.persona.voice or "default",
                 session.conv.prefill_seconds, " (cached)" if session.conv.persona_cached else "")
        session.conversation_ready()
        state.ticker.attach(session)
        tasks.extend(asyncio.create_task(c) for c in wire.extra_tasks(session))
        reason, code = await session.ended
    except (ParamError, PersonaPlexError) as e:  # a persona this model cannot run, said why
        reason, code = str(e), WSCloseCode.POLICY_VIOLATION
    except Exception as e:  # a fault of the server, not of the client: said, logged, contained
        log.exception("session %d (%s, %s): internal error", session.id, peer, wire.name)
        reason, code = f"internal error: {e}", WSCloseCode.INTERNAL_ERROR
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        wire.close_session(session)
        if session.conv is not None:
            await asyncio.wrap_future(state.ticker.detach(session))
        elif prefill is not None and not prefill.cancel():  # still queued: it never runs
            prefill.add_done_callback(_close_abandoned)
        cause = "client" if reason is None else (
            "shutdown" if state.stopping else "error")
        state.stats.ended.labels(cause=cause).inc()
        summary = session.summary()
        state.history.append(summary)
        state.sessions.discard(session)
        log.info("session %d (%s, %s): %s after %d frames, %d dropped, frame p99 %.1f ms",
                 session.id, peer, wire.name,
                 "ended: " + reason if reason else "client left",
                 session.frames_answered, session.backlog.dropped,
                 summary.get("frame_p99_ms", 0.0))
        await transport.close(wire.farewell(session, reason, code), reason, code)


def open_session(state: ServerState, wire: Wire, peer: str) -> Session:
    """The wire's Session on this server's model and limits."""
    model = state.model
    return wire.open_session(peer=peer, max_backlog=state.max_backlog,
                             send_queue=state.send_queue, sample_rate=model.sample_rate,
                             frame_size=model.frame_size, wake=state.ticker.wake,
                             call=state.ticker.call, piece=model.text.piece,
                             max_ahead_s=state.max_ahead_s)


def _open_conversation(state: ServerState, params: ChatParams):
    """On the prefill thread: a row of the model, its persona run (or restored)."""
    conv = state.model.open_conversation(params.sampling, params.persona)
    try:
        conv.prefill()
    except BaseException:
        conv.close()
        raise
    return conv


def _close_abandoned(fut: Future) -> None:
    """A prefill that finished after its client had gone: its row is given back (the
    conversation never reached the tick thread, so closing it here races with nothing); its
    error, if it failed, is the gone client's and goes no further."""
    if not fut.cancelled() and fut.exception() is None:
        fut.result().close()


async def _until_ended(session: Session, work: asyncio.Future):
    """`work`'s result, or None when the session ends first (the client left, or sent what
    ends its session); `work` is then cancelled where it still can be."""
    done, _ = await asyncio.wait([work, session.ended], return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        return work.result()
    work.cancel()
    return None


async def _read(wire: Wire, transport: Transport, session: Session) -> None:
    """The client's messages, until it leaves or sends what ends its session."""
    try:
        async for data in transport.messages():
            wire.receive(session, data)
    except wire.client_errors as e:
        session.end(str(e), WSCloseCode.POLICY_VIOLATION)
        return
    except asyncio.CancelledError:
        raise
    except Exception as e:  # the server's fault: the session ends with it, said and logged
        log.exception("session %d (%s, %s): internal error reading", session.id, session.peer,
                      wire.name)
        session.end(f"internal error: {e}", WSCloseCode.INTERNAL_ERROR)
        return
    session.end(None)  # the client closed


async def _write(transport: Transport, session: Session) -> None:
    try:
        while True:
            await transport.send(await session.outbox.get())
    except (ConnectionError, RuntimeError):  # the connection is gone or closing
        session.end(None)


async def close(ws: web.WebSocketResponse, request: web.Request, messages: list[bytes | str],
                reason: str | None, code: int = WSCloseCode.OK) -> None:
    """Sends `messages`, then closes with `code` and the reason in the close frame. Neither
    waits longer than CLOSE_TIMEOUT for a peer that does not read: its connection is then
    closed from this side (what is buffered still goes out if it reads again) and cut off
    after LINGER_SECONDS, so a client that stopped reading never holds a slot."""
    try:
        for message in messages:
            if ws.closed:
                break
            # the frame is in the transport's buffer once the send starts waiting to drain
            send = ws.send_str(message) if isinstance(message, str) else ws.send_bytes(message)
            await asyncio.wait_for(send, CLOSE_TIMEOUT)
        # close() itself waits CLOSE_TIMEOUT for the client's close frame
        await asyncio.wait_for(ws.close(code=code, message=_close_reason(reason)),
                               2 * CLOSE_TIMEOUT)
    except (asyncio.TimeoutError, ConnectionError, RuntimeError):
        transport = request.transport
        if transport is not None and not transport.is_closing():
            transport.close()  # flushes what it can, then FIN
            asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.abort)


def _close_reason(reason: str | None) -> bytes:
    """The reason cut to what a close frame holds, on a character boundary."""
    data = (reason or "").encode("utf-8")[:_CLOSE_REASON_BYTES]
    return data.decode("utf-8", "ignore").encode("utf-8")
