"""The aiohttp application: one handler per route.

    GET /             the web page (static/index.html; its scripts under /static/)
    GET /api/chat     the moshi/PersonaPlex WebSocket protocol (chat.py)
    GET /v1/realtime  the OpenAI Realtime protocol over WebSocket (realtime.py); /v1/duplex
                      is the same, by vllm-omni's name for it
    /v1/realtime/calls, /v1/realtime/client_secrets
                      the same protocol over WebRTC, and the client keys (webrtc/routes.py)
    GET /api/voices   the voices a client may name, and the server's persona defaults
    GET /api/health   JSON: model, sessions open, capacity; 200 while a session can start,
                      503 when full or stopping (a load balancer's readiness probe)
    GET /metrics      Prometheus text

Every route but the two probes (health, metrics: machines that poll by whatever name or
address) answers only to the server's host names (hosts.py): another Host gets 403, one log
line, and a count in /metrics.
"""

from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import web

from .chat import chat
from .hosts import host_name
from .realtime import realtime
from .state import STATE, ServerState
from .stats import CONTENT_TYPE_LATEST
from .webrtc.routes import add_routes as add_webrtc_routes

log = logging.getLogger("personaplex_edge.serve")

STATIC = Path(__file__).parent / "static"
# what load balancers, orchestrators and scrapers poll, by whatever name or address they use;
# neither carries a conversation or the persona
PROBES = frozenset({"/api/health", "/metrics"})


@web.middleware
async def host_check(request: web.Request, handler) -> web.StreamResponse:
    state = request.app[STATE]
    host = request.headers.get("Host")
    if request.path not in PROBES and not state.hosts.admits(host):
        state.stats.refused.labels(reason="host").inc()
        name = host_name(host)
        log.info("%s: refused %s: host %s is not allowed (--allowed-hosts)",
                 request.remote or "?", request.path, name)
        raise web.HTTPForbidden(text=f"this server does not answer to the name {name}; serve "
                                f"with --allowed-hosts {name} to admit it\n")
    return await handler(request)


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


async def voices(request: web.Request) -> web.Response:
    state = request.app[STATE]
    persona = state.persona
    return web.json_response({
        "voices": state.voices.names(),
        "default_voice": state.default_voice,
        "default_text_prompt": persona.text_prompt or "",
        "persona": persona.enabled,
    })


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = {
        "status": "stopping" if state.stopping else ("ok" if state.accepting else "full"),
        "model": state.model_name,
        "batch": state.model.batch,
        "sessions": state.slots_used,
        "capacity": state.max_sessions,
        "available": max(0, state.max_sessions - state.slots_used) if not state.stopping else 0,
    }
    return web.json_response(body, status=200 if state.accepting else 503)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.Response(body=state.stats.text(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(state: ServerState) -> web.Application:
    app = web.Application(middlewares=[host_check])
    app[STATE] = state
    app.router.add_get("/", index)
    app.router.add_get("/api/chat", chat)
    app.router.add_get("/v1/realtime", realtime)
    app.router.add_get("/v1/duplex", realtime)
    add_webrtc_routes(app)
    app.router.add_get("/api/voices", voices)
    app.router.add_get("/api/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
    return app
