"""`personaplex-edge serve`: two wire protocols on one session core - moshi/PersonaPlex's on
`/api/chat` and OpenAI Realtime's on `/v1/realtime` - many conversations on one shared model,
and a web page at `/`.

What this room may import: aiohttp (HTTP and WebSocket), the system's libopus through
ctypes, prometheus-client (the `/metrics` text) and the runtime - never torch. WebRTC calls,
with aiortc and PyAV, have a room of their own: webrtc/ (its __init__ lists it).

    protocol         moshi's binary message kinds and their framing
    params           the query parameters of /api/chat -> a conversation's sampling and persona
    libopus          the system's libopus through ctypes: packets <-> samples
    ogg              Ogg pages of one Opus stream (RFC 3533, RFC 7845), both ways
    opus             Ogg/Opus bytes <-> 1920-sample frames (libopus in ogg)
    realtime_events  OpenAI Realtime's JSON events (GA and beta names), PCM <-> frames
    session          one WebSocket's side of a conversation: input backlog, send queue, counters
    lifecycle        one WebSocket's life, either protocol: checks, slot, prefill, ticks, close
    chat             the /api/chat protocol on that life
    realtime         the /v1/realtime protocol on that life
    webrtc/          the same protocol over WebRTC (/v1/realtime/calls, the beta's POST
                     /v1/realtime) and the client keys: aiortc, the `webrtc` extra
    ticker           the one thread that steps every conversation (lockstep, via step_many)
    stats            Prometheus metrics of the server
    hosts            the names the server answers to: the Host allow list (DNS rebinding)
    auth             who may open a WebSocket: the browser origin and the --auth-token
    app              the aiohttp application: routes, health, voices, the page
    server           load the model, serve until a signal, close every session
"""

from .server import ServeOptions, serve

__all__ = ["ServeOptions", "serve"]
