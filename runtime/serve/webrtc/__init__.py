"""OpenAI Realtime over WebRTC: `serve`'s calls, a transport's room of its own beside the
WebSocket's, on the same session flow. aiortc and PyAV are imported only when a call comes
(call and media; offer and ice inside their functions), so a server without the `webrtc` extra
runs without them and its calls' route answers 501.

What this room may import: aiohttp, aiortc and PyAV (the `webrtc` extra), the system's libopus
(serve/libopus.py), the serve room's session flow (lifecycle, realtime, realtime_events, state)
and the runtime - never torch.

    routes       POST /v1/realtime/calls, hang-ups, client_secrets, the beta's /v1/realtime/
                 sessions and POST /v1/realtime: the checks, every refusal OpenAI's JSON error
    offer        a call's posted offer, read and checked before any port opens
    starting     a call's starting session, checked once for the key and the call alike
    client_keys  ephemeral `ek_` keys: what a browser app holds instead of the token
    call         one call: the Realtime session on its data channel and Opus track
    channel      the data channel's messages held to the size the answer advertises
    media        a call's audio both ways: RTP tap, playout clock, paced answer track
    jitter       the jitter buffer: packets in, samples out, loss concealed and counted
    ice          a call's candidates: the server's own addresses; STUN/TURN if configured
    call_stats   Prometheus metrics of calls: round trip, jitter, loss, concealment
"""
