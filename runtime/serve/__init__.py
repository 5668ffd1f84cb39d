"""`personaplex-edge serve`: the moshi/PersonaPlex WebSocket protocol on `/api/chat`, many
conversations on one shared model, and a web page at `/`.

What this room may import: aiohttp (HTTP and WebSocket), sphn (Opus in Ogg), prometheus-client
(the `/metrics` text) and the runtime - never torch.

    protocol   the binary message kinds and their framing
    params     the query parameters of /api/chat -> a conversation's sampling and persona
    opus       Ogg/Opus bytes <-> 1920-sample frames (sphn)
    session    one WebSocket's side of a conversation: input backlog, send queue, counters
    ticker     the one thread that steps every conversation (lockstep, via step_many)
    stats      Prometheus metrics of the server
    auth       the --auth-token check
    chat       the /api/chat handler: one conversation per WebSocket
    app        the aiohttp application: routes, health, voices, the page
    server     load the model, serve until a signal, close every session
"""

from .server import ServeOptions, serve

__all__ = ["ServeOptions", "serve"]
