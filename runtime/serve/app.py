"""The aiohttp application: one handler per route.

    GET /             the web page (static/index.html; its scripts under /static/)
    GET /api/chat     the moshi/PersonaPlex WebSocket protocol (chat.py)
    GET /v1/realtime  the OpenAI Realtime protocol over WebSocket (realtime.py); /v1/duplex
                      is the same, by vllm-omni's name for it
    GET /api/voices   the voices a client may name, and the server's persona defaults
    GET /api/health   JSON: model, sessions open, capacity; 200 while a session can start,
                      503 when full or stopping (a load balancer's readiness probe)
    GET /metrics      Prometheus text
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from .chat import chat
from .realtime import realtime
from .state import STATE, ServerState
from .stats import CONTENT_TYPE_LATEST

STATIC = Path(__file__).parent / "static"


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
    app = web.Application()
    app[STATE] = state
    app.router.add_get("/", index)
    app.router.add_get("/api/chat", chat)
    app.router.add_get("/v1/realtime", realtime)
    app.router.add_get("/v1/duplex", realtime)
    app.router.add_get("/api/voices", voices)
    app.router.add_get("/api/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
    return app
