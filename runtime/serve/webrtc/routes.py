"""OpenAI Realtime over WebRTC, the browser's own transport, and the ephemeral keys a browser
app holds instead of the server's token.

    POST    /v1/realtime/calls                 an SDP offer in (application/sdp, or a multipart
                                               form with `sdp` and `session`): 201, the answer's
                                               SDP, `Location: /v1/realtime/calls/{call_id}`
    DELETE  /v1/realtime/calls/{call_id}       hang up (204); POST .../hangup, OpenAI's, too
    OPTIONS /v1/realtime/calls[/...]           the CORS preflight of a page on another origin:
                                               answered for the allowed origins only
    POST    /v1/realtime/client_secrets        an `ek_` key for one call (client_keys.py)

and OpenAI's first (beta) flow, which apps and evaluation tools still speak:

    POST    /v1/realtime/sessions              the beta's key: the session's flat fields in,
                                               the session and `client_secret: {value,
                                               expires_at}` out
    POST    /v1/realtime?model=M               the offer (application/sdp, the key as Bearer):
                                               201 and the answer, the call's events in the
                                               beta's names (the WebSocket's GET is app.py's)

A call is checked as a WebSocket is (the Host, the Origin, the token or a client key), and
refused as one is when every slot is taken (429, 503 while stopping: the same error, and no
UDP port opened). Its offer is read and checked (offer.py: 400 with the reason) before a
peer connection exists, its starting session as its key's was (starting.py: 400). Every
refusal - origin, token, key, offer, session, capacity - is OpenAI's JSON error, with the CORS
headers that let a page on an allowed origin read it (else a browser's fetch says only "Failed
to fetch", and the page cannot tell a spent key from a server that is down). A call refused
after its key was taken gives the key back. Without aiortc (the `webrtc` extra) the route
answers 501 with the line that installs it. The call itself: call.py.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from ..auth import origin_allowed, presented_tokens
from ..lifecycle import (Refusal, busy_reason, client_refusal, free_slot, origin_refusal,
                         take_slot)
from ..realtime_events import EventError, ServerEvents
from ..state import STATE
from .client_keys import KeyRequestError, is_client_key
from .offer import OfferError, check_offer, read_offer
from .starting import check_start, starting_view

log = logging.getLogger("personaplex_edge.serve")

INSTALL_LINE = "pip install 'personaplex-edge[webrtc]'"
PREFLIGHT_MAX_AGE_S = 600
BETA_KEY_SECONDS = 60  # the beta's keys lived a minute
KEY_REFUSED = ("this client key is spent, expired or unknown: ask your app's backend for a new "
               "one (POST /v1/realtime/client_secrets)")


def webrtc_missing() -> str | None:
    """Why calls cannot be served here (aiortc or PyAV missing), or None."""
    try:
        import aiortc  # noqa: F401
        import av  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


def _error(status: int, message: str, type_: str = "invalid_request_error",
           code: str | None = None, headers: dict | None = None) -> web.Response:
    """An error in the shape OpenAI's HTTP API answers with."""
    body = {"error": {"message": message, "type": type_, "code": code, "param": None}}
    return web.json_response(body, status=status, headers=headers)


def _cors(request: web.Request) -> dict:
    """What lets a page on an allowed origin read the answer (and its Location)."""
    origin = request.headers.get("Origin")
    if origin is None or not origin_allowed(request, request.app[STATE].allowed_origins):
        return {}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
            "Access-Control-Expose-Headers": "Location"}


def _refused(request: web.Request, refusal: Refusal) -> web.Response:
    """A refused token, key or origin as OpenAI's JSON error, readable by an allowed page (a
    page on another origin gets no CORS headers: it was not allowed)."""
    headers = _cors(request)
    if refusal.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return _error(refusal.status, refusal.message, code=refusal.code, headers=headers)


async def preflight(request: web.Request) -> web.Response:
    refusal = origin_refusal(request, request.app[STATE], required=True)
    if refusal is not None:
        return _refused(request, refusal)
    headers = _cors(request)
    headers.update({
        "Access-Control-Allow-Methods": "POST, DELETE, OPTIONS",
        # the SDKs' own (Authorization, Content-Type, X-OpenAI-Agents-SDK, OpenAI-Beta, ...):
        # whatever an allowed page asks for
        "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers",
                                                            "authorization, content-type"),
        "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S)})
    return web.Response(status=204, headers=headers)


def _client_key(request: web.Request) -> str | None:
    return next((t for t in presented_tokens(request) if is_client_key(t)), None)


def _caller_refusal(request: web.Request, key: str | None) -> Refusal | None:
    """The origin and token checks of a call; an `ek_` key stands for the token, whatever the
    token is."""
    state = request.app[STATE]
    if key is None:
        return client_refusal(request, state)
    return client_refusal(request, state, lambda r, t: state.client_keys.valid(key),
                          unauthorized=KEY_REFUSED)


async def create_call(request: web.Request) -> web.StreamResponse:
    """POST /v1/realtime/calls: the GA flow's call, its events in GA names."""
    return await _call(request, beta=False)


async def beta_call(request: web.Request) -> web.StreamResponse:
    """POST /v1/realtime: the beta flow's call (the offer posted where the WebSocket is), its
    events in the beta's names."""
    return await _call(request, beta=True)


async def _call(request: web.Request, beta: bool) -> web.StreamResponse:
    state = request.app[STATE]
    peer = request.remote or "?"
    key = _client_key(request)
    refusal = _caller_refusal(request, key)
    if refusal is not None:
        return _refused(request, refusal)
    cors = _cors(request)
    missing = webrtc_missing()
    if missing is not None:
        return _error(501, f"this server has no WebRTC ({missing}): {INSTALL_LINE}",
                      "server_error", "webrtc_unavailable", cors)
    try:
        sdp, form_session = await read_offer(request)
        offer = check_offer(sdp, form_session)
    except OfferError as e:
        log.info("%s: refused %s: %s", peer, request.path, e)
        return _error(400, str(e), code="invalid_offer", headers=cors)
    reason = busy_reason(state, peer, request.path)
    if reason is not None:
        if state.stopping:
            return _error(503, reason, "server_error", "server_shutting_down", cors)
        return _error(429, reason, "rate_limit_error", "resource_exhausted", cors)
    grant = None
    if key is not None:
        grant = state.client_keys.redeem(key)
        if grant is None:  # spent by another request meanwhile
            state.stats.refused.labels(reason="unauthorized").inc()
            return _refused(request, Refusal(401, KEY_REFUSED, "invalid_api_key"))
    start = {**(grant.session if grant is not None else {}), **offer.session}

    from .call import Call

    take_slot(state)
    call = None
    kept = False  # else the call is closed, its slot freed and its key given back
    try:
        check_start(state, start)
        call = Call(state, request, offer, start, beta)
        answer = await call.answer()
        if state.stopping:  # it stopped while the answer was made: this call is not taken on
            return _error(503, "the server is shutting down", "server_error",
                          "server_shutting_down", cors)
        state.calls[call.id] = call
        call.task = asyncio.create_task(call.run())
        kept = True
    except (OfferError, EventError) as e:
        log.info("%s: refused %s: %s", peer, request.path, e)
        return _error(400, str(e), code="invalid_offer" if isinstance(e, OfferError)
                      else "invalid_session", headers=cors)
    finally:
        if not kept:
            if call is not None:
                await call.close()
            free_slot(state)
            if grant is not None:
                state.client_keys.restore(grant)
    log.info("call %s (%s): answered", call.id, peer)
    return web.Response(status=201, text=answer, content_type="application/sdp",
                        headers={"Location": f"/v1/realtime/calls/{call.id}", **cors})


async def hang_up(request: web.Request) -> web.Response:
    state = request.app[STATE]
    refusal = client_refusal(request, state)
    if refusal is not None:
        return _refused(request, refusal)
    call = state.calls.get(request.match_info["call_id"])
    if call is None:
        return _error(404, f"no call {request.match_info['call_id']} (ended, or never here)",
                      code="call_not_found", headers=_cors(request))
    call.hang_up()
    return web.Response(status=204 if request.method == "DELETE" else 200,
                        headers=_cors(request))


async def _json_body(request: web.Request) -> dict:
    """The request's JSON object ({} for none); KeyRequestError for anything else."""
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError) as e:
        raise KeyRequestError(f"the body is not JSON ({e})") from None
    if not isinstance(body, dict):
        raise KeyRequestError("the body must be a JSON object: {\"session\": {...}}")
    return body


async def client_secret(request: web.Request) -> web.Response:
    """POST /v1/realtime/client_secrets: needs the server's token (a client key makes none)."""
    state = request.app[STATE]
    refusal = client_refusal(request, state)  # the token itself: an ek_ key makes no keys
    if refusal is not None:
        return _refused(request, refusal)
    try:
        body = await _json_body(request)
        session = body.get("session", {})
        if not isinstance(session, dict):
            raise KeyRequestError("session must be an object (the call's session)")
        update = check_start(state, session)  # what the call would refuse, refused now
        key = state.client_keys.issue(session, body.get("expires_after"))
    except (KeyRequestError, EventError) as e:
        return _error(400, str(e), headers=_cors(request))
    log.info("%s: issued a client key, %d unspent", request.remote or "?",
             len(state.client_keys))
    return web.json_response({"value": key.value, "expires_at": int(key.expires_at),
                              "session": ServerEvents().session_object(
                                  starting_view(state, update))}, headers=_cors(request))


async def beta_session(request: web.Request) -> web.Response:
    """POST /v1/realtime/sessions, the beta's key: the body is the session itself (flat
    fields), with `client_secret.expires_after`; the answer the session as the beta shows it,
    with `client_secret: {value, expires_at}`."""
    state = request.app[STATE]
    refusal = client_refusal(request, state)
    if refusal is not None:
        return _refused(request, refusal)
    try:
        body = await _json_body(request)
        secret = body.pop("client_secret", None) or {}
        if not isinstance(secret, dict):
            raise KeyRequestError("client_secret must be an object: {\"expires_after\": "
                                  "{\"anchor\": \"created_at\", \"seconds\": 60}}")
        update = check_start(state, body)
        key = state.client_keys.issue(body, secret.get("expires_after"), BETA_KEY_SECONDS)
    except (KeyRequestError, EventError) as e:
        return _error(400, str(e), headers=_cors(request))
    log.info("%s: issued a client key (beta), %d unspent", request.remote or "?",
             len(state.client_keys))
    shown = ServerEvents(beta=True).session_object(starting_view(state, update))
    return web.json_response({**shown, "client_secret": {
        "value": key.value, "expires_at": int(key.expires_at)}}, headers=_cors(request))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/realtime/calls", create_call)
    app.router.add_route("OPTIONS", "/v1/realtime/calls", preflight)
    app.router.add_delete("/v1/realtime/calls/{call_id}", hang_up)
    app.router.add_route("OPTIONS", "/v1/realtime/calls/{call_id}", preflight)
    app.router.add_post("/v1/realtime/calls/{call_id}/hangup", hang_up)
    app.router.add_route("OPTIONS", "/v1/realtime/calls/{call_id}/hangup", preflight)
    app.router.add_post("/v1/realtime/client_secrets", client_secret)
    app.router.add_route("OPTIONS", "/v1/realtime/client_secrets", preflight)
    # the beta flow: its key, and its call posted where the WebSocket is (GET, app.py)
    app.router.add_post("/v1/realtime/sessions", beta_session)
    app.router.add_route("OPTIONS", "/v1/realtime/sessions", preflight)
    app.router.add_post("/v1/realtime", beta_call)
    app.router.add_route("OPTIONS", "/v1/realtime", preflight)
