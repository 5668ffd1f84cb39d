"""`GET /api/chat`: one WebSocket, one conversation on the shared model.

    token check (401 without it)  ->  upgrade  ->  a free slot, or ERROR "busy: N of N sessions"
    ->  query parameters (ERROR naming a bad one)  ->  open the conversation and run its persona
    prefill (on the prefill thread)  ->  HANDSHAKE  ->  audio in / audio and text out, until
    the client leaves, sends what the protocol does not allow, stops reading, or the server
    stops  ->  ERROR with the reason (unless the client left), close, the row and slot freed.

Whatever a client sends ends at most its own session: its bytes are parsed and decoded here,
on the event loop, and only whole 1920-sample frames reach the model.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from concurrent.futures import Future

from aiohttp import WSCloseCode, WSMsgType, web

from personaplex_edge.errors import PersonaPlexError

from . import protocol
from .auth import authorized
from .opus import OpusError
from .params import ChatParams, ParamError, parse_params
from .session import ChatSession
from .state import STATE, ServerState

log = logging.getLogger("personaplex_edge.serve")

CLOSE_TIMEOUT = 1.0  # seconds for the last message and the close handshake of a session
STATS_INTERVAL = 1.0  # seconds between the metadata messages a `stats=1` client gets
# Bytes of answers the kernel and aiohttp may hold for a client before a send waits (the
# answers' Opus is ~4 KB/s: each is several seconds): past them a client that stopped reading
# fills its session's send queue and is cut off, instead of answers piling up as latency.
SOCKET_SEND_BUFFER = 32 << 10
LINGER_SECONDS = 10.0  # a closed connection whose peer does not read is cut off after this
WRITER_LIMIT = 32 << 10


async def chat(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    peer = request.remote or "?"
    if not authorized(request, state.auth_token):
        state.stats.refused.labels(reason="unauthorized").inc()
        log.info("%s: refused: no valid token", peer)
        raise web.HTTPUnauthorized(text="this server needs a token: ?token=... or "
                                   "'Authorization: Bearer ...'\n",
                                   headers={"WWW-Authenticate": "Bearer"})
    # aiohttp's own limit sits above the protocol's: past it aiohttp closes (1009) before the
    # handler sees the message, so a message just over MAX_MESSAGE_BYTES still gets its ERROR.
    # Opus does not compress: no permessage-deflate.
    ws = web.WebSocketResponse(max_msg_size=4 * protocol.MAX_MESSAGE_BYTES, heartbeat=10.0,
                               timeout=CLOSE_TIMEOUT, compress=False, writer_limit=WRITER_LIMIT)
    await ws.prepare(request)
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SEND_BUFFER)
    if state.stopping or state.slots_used >= state.max_sessions:
        reason = ("the server is shutting down" if state.stopping else
                  f"busy: {state.slots_used} of {state.max_sessions} sessions")
        state.stats.refused.labels(reason="shutting_down" if state.stopping else "busy").inc()
        log.info("%s: refused: %s", peer, reason)
        await _close(ws, request, reason, WSCloseCode.GOING_AWAY if state.stopping
                     else WSCloseCode.TRY_AGAIN_LATER)
        return ws
    state.slots_used += 1
    state.stats.open.set(state.slots_used)
    try:
        await _converse(state, ws, request, peer)
    finally:
        state.slots_used -= 1
        state.stats.open.set(state.slots_used)
    return ws


async def _converse(state: ServerState, ws: web.WebSocketResponse, request: web.Request,
                    peer: str) -> None:
    try:
        params = parse_params(request.query, state.sampling, state.persona, state.voices,
                              state.top_k_max)
    except ParamError as e:  # names the parameter
        reason, code = str(e), WSCloseCode.POLICY_VIOLATION
    except Exception as e:  # the server's fault (reading --voice-dir, say): said and logged
        log.exception("%s: internal error reading the query", peer)
        reason, code = f"internal error: {e}", WSCloseCode.INTERNAL_ERROR
    else:
        reason = None
    if reason is not None:
        state.stats.ended.labels(cause="error").inc()
        log.info("%s: refused: %s", peer, reason)
        await _close(ws, request, reason, code)
        return
    model = state.model
    session = ChatSession(params, peer, state.max_backlog, state.send_queue, model.sample_rate,
                          model.frame_size, state.ticker.wake, model.text.piece,
                          state.max_ahead_s)
    state.sessions.add(session)
    prefill: Future | None = None
    reason: str | None = None
    code = WSCloseCode.OK
    # reading starts now, not at the handshake: a client that leaves during its prefill ends
    # its session (and frees its slot) at once; audio sent before the handshake waits in the
    # backlog, bounded as always
    tasks: list[asyncio.Task] = [asyncio.create_task(_read(ws, session, state))]
    try:
        prefill = state.prefill_pool.submit(_open_conversation, state, params)
        session.conv = await _until_ended(session, asyncio.wrap_future(prefill))
        if session.conv is None or ws.closed:
            if session.ended.done():
                reason, code = session.ended.result()
            return
        state.stats.prefill.observe(session.conv.prefill_seconds)
        await ws.send_bytes(protocol.HANDSHAKE)
        state.stats.opened.inc()
        log.info("session %d (%s): open, persona %s in %.2f s%s", session.id, peer,
                 params.persona.voice or "default",
                 session.conv.prefill_seconds, " (cached)" if session.conv.persona_cached else "")
        state.ticker.attach(session)
        tasks.append(asyncio.create_task(_write(ws, session)))
        if params.stats:
            tasks.append(asyncio.create_task(_report(session)))
        reason, code = await session.ended
    except PersonaPlexError as e:  # a persona this model cannot run (prompt too long, ...)
        reason, code = str(e), WSCloseCode.POLICY_VIOLATION
    except ConnectionResetError:  # the client left before the handshake
        reason = None
    except Exception as e:  # a fault of the server, not of the client: said, logged, contained
        log.exception("session %d (%s): internal error", session.id, peer)
        reason, code = f"internal error: {e}", WSCloseCode.INTERNAL_ERROR
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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
        log.info("session %d (%s): %s after %d frames, %d dropped, frame p99 %.1f ms",
                 session.id, peer, "ended: " + reason if reason else "client left",
                 session.frames_answered, session.backlog.dropped,
                 summary.get("frame_p99_ms", 0.0))
        await _close(ws, request, reason, code)


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


async def _until_ended(session: ChatSession, work: asyncio.Future):
    """`work`'s result, or None when the session ends first (the client left mid-prefill)."""
    done, _ = await asyncio.wait([work, session.ended], return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        return work.result()
    return None


async def _read(ws: web.WebSocketResponse, session: ChatSession, state: ServerState) -> None:
    """The client's messages, until it leaves or sends what ends its session."""
    try:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                kind, payload = protocol.parse(msg.data)
                if kind == protocol.Kind.AUDIO:
                    dropped = session.receive_audio(payload)
                    if dropped:
                        state.stats.dropped.inc(dropped)
            elif msg.type == WSMsgType.TEXT:
                raise protocol.ProtocolError("text WebSocket frames are not part of the "
                                             "protocol (every message is binary)")
            elif msg.type == WSMsgType.ERROR:
                raise protocol.ProtocolError(f"bad WebSocket message: {ws.exception()}")
    except (protocol.ProtocolError, OpusError) as e:
        session.end(str(e), WSCloseCode.POLICY_VIOLATION)
        return
    except asyncio.CancelledError:
        raise
    except Exception as e:  # the server's fault: this session ends with it, said and logged
        log.exception("session %d (%s): internal error reading", session.id, session.peer)
        session.end(f"internal error: {e}", WSCloseCode.INTERNAL_ERROR)
        return
    session.end(None)  # the client closed


async def _write(ws: web.WebSocketResponse, session: ChatSession) -> None:
    try:
        while True:
            await ws.send_bytes(await session.outbox.get())
    except (ConnectionResetError, RuntimeError):  # the connection is gone or closing
        session.end(None)


async def _report(session: ChatSession) -> None:
    while True:
        await asyncio.sleep(STATS_INTERVAL)
        session.send(protocol.metadata(session.stats()))


async def _close(ws: web.WebSocketResponse, request: web.Request, reason: str | None,
                 code: int = WSCloseCode.OK) -> None:
    """Sends the reason as ERROR (if any), then closes with `code`. Neither waits longer than
    CLOSE_TIMEOUT for a peer that does not read: its connection is then closed from this side
    (what is buffered still goes out if it reads again) and cut off after LINGER_SECONDS, so a
    client that stopped reading never holds a slot."""
    try:
        if reason is not None and not ws.closed:
            # the frame is in the transport's buffer once send_bytes starts waiting to drain
            await asyncio.wait_for(ws.send_bytes(protocol.error(reason)), CLOSE_TIMEOUT)
        # close() itself waits CLOSE_TIMEOUT for the client's close frame
        await asyncio.wait_for(ws.close(code=code), 2 * CLOSE_TIMEOUT)
    except (asyncio.TimeoutError, ConnectionError, RuntimeError):
        transport = request.transport
        if transport is not None and not transport.is_closing():
            transport.close()  # flushes what it can, then FIN
            asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.abort)
