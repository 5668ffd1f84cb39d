"""`POST /v1/realtime/calls` (OpenAI Realtime over WebRTC) on the demo model, driven by an aiortc
client (benchmarks/bench_webrtc.py): the events on the `oai-events` channel are what the openai
SDK's types accept, the transcript is `run --greedy`'s on the frames the model heard, the answer
audio is `run`'s through Opus; 5 % and 20 % of the client's packets lost and 40 ms of jitter
leave the call standing and the model's clock steady, the loss concealed and counted; 50 calls
leave no session and no UDP port behind. Refusals: 501 without aiortc, 400 for offers a call
cannot use, 429 when busy (no port opened), 401/403 as for the WebSocket, client keys spent
once; the jitter buffer alone against libopus. The page in a browser: test_serve_browser.py.

Every call stays on loopback: the server offers only 127.0.0.1 (it listens there) and the
client gathers only 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

pytest.importorskip("aiohttp")
aiortc = pytest.importorskip("aiortc", reason="the webrtc extra (scripts/install.sh installs it)")

import aiohttp  # noqa: E402
from bench_serve import FRAME_S, LoopLag, ServerThread, speech, wait_until  # noqa: E402
from bench_webrtc import call, udp_sockets  # noqa: E402
from call_tap import ModelInput, prefix_matches, run_pieces, waveform_match  # noqa: E402

from personaplex_edge.runtime.sampling import SamplingParams  # noqa: E402
from personaplex_edge.runtime.serve import ServeOptions, libopus  # noqa: E402
from personaplex_edge.runtime.serve.webrtc import routes as webrtc_route  # noqa: E402
from personaplex_edge.runtime.serve.webrtc.jitter import SNAP_MS, JitterBuffer  # noqa: E402
from personaplex_edge.runtime.serve.webrtc.media import (  # noqa: E402
    MAX_CLOCK_LAG_S, PACKET_S)

TOKEN = "s3cret"
APP = "http://app.example:3000"
FRAME = 1920


@pytest.fixture(scope="module")
def srv(demo_model, demo_model_dir):
    with ServerThread(ServeOptions(demo_model_dir, port=0, max_sessions=8, auth_token=TOKEN,
                                   allowed_origins=(APP,), sampling=SamplingParams(greedy=True),
                                   max_backlog=100_000), model=demo_model) as s:
        yield s


def metric(srv, name: str, **labels) -> float:
    """A counter's value from the server's registry (0 when never set)."""
    value = srv.state.stats.registry.get_sample_value(name, labels or None)
    return value or 0.0


def settle(srv, timeout: float = 60.0) -> None:
    assert wait_until(lambda: srv.state.slots_used == 0 and not srv.state.calls, timeout), \
        (srv.state.slots_used, list(srv.state.calls))


async def post(url: str, body: bytes | str, headers: dict, path: str = "/v1/realtime/calls",
               method: str = "POST"):
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url.rstrip("/") + path, data=body,
                                headers=headers) as r:
            return r.status, await r.text(), dict(r.headers)


def bearer(token: str = TOKEN, **more) -> dict:
    return {"Authorization": f"Bearer {token}", **more}


# -- a call, greedy --------------------------------------------------------------------------------
def test_a_call_is_answered_as_run_greedy_answers(srv, demo_model_dir, tmp_path):
    """A multipart offer with a session (instructions, voice): the events the SDK's types take,
    GA names, no audio deltas on the channel; the transcript is `run --greedy`'s with that
    persona on the frames the model heard; the answer's audio is run's (its envelope through
    Opus); the call's figures in its summary; nothing left open after the hang-up."""
    from openai.types.realtime import RealtimeServerEvent
    from pydantic import TypeAdapter

    prompt = "You enjoy having a good conversation."
    udp_before = udp_sockets()
    tap = ModelInput(srv)
    try:
        with LoopLag(srv.loop, MAX_CLOCK_LAG_S) as lag:
            res = asyncio.run(call(srv.url, speech(4.0), token=TOKEN, tail_s=1.0, session={
                "type": "realtime", "instructions": prompt,
                "audio": {"output": {"voice": "NATM1"}}}))
        settle(srv)
        heard = tap.only()
    finally:
        tap.close()
    assert res.status == 201, res.error
    assert res.location.startswith("/v1/realtime/calls/rtc_")
    assert "a=candidate" in res.answer_sdp and "127.0.0.1" in res.answer_sdp
    # the answer's audio is Opus alone: a peer cannot switch to a codec the server never hears
    from aiortc.sdp import SessionDescription
    [audio] = [m for m in SessionDescription.parse(res.answer_sdp).media if m.kind == "audio"]
    assert [(c.name, c.clockRate, c.channels) for c in audio.rtp.codecs] == [("opus", 48000, 2)]
    adapter = TypeAdapter(RealtimeServerEvent)
    for event in res.events:
        adapter.validate_python(event)
    kinds = [e["type"] for e in res.events]
    assert kinds[0] == "session.created"
    assert res.events[0]["session"]["instructions"] == prompt
    assert res.events[0]["session"]["audio"]["output"]["voice"] == "NATM1"
    assert "error" not in kinds
    assert not {k for k in kinds if "audio.delta" in k}  # the audio is on the track
    assert kinds.count("response.created") == 1

    pieces, answer = run_pieces(demo_model_dir, heard, tmp_path, "--greedy", "--text-prompt",
                                prompt, "--voice-prompt", "NATM1")
    heard_frames = res.audio.shape[0] // FRAME
    assert heard_frames >= 40  # 4 s of speech answered, less the persona's prefill
    transcript = res.transcript()
    assert len(transcript) > 5
    assert prefix_matches(transcript, pieces, min(heard_frames, len(pieces))) is not None, \
        (transcript, "".join(pieces))
    # the answer's audio: run's, through the 24 -> 48 kHz resampler and Opus (SILK with its
    # FEC copy: about 0.7 on the demo model's noise-like answers; unrelated audio scores ~0)
    assert waveform_match(res.audio, answer[:res.audio.shape[0]]) > 0.55

    summary = srv.history()[-1]
    assert summary["protocol"] == "webrtc"
    assert summary["lost"] == 0 and summary["late"] == 0 and summary["played"] > 200
    # a round trip measured during the call, in ms: more than nothing, less than the call
    assert summary["rtt_ms"] is not None and 0 < summary["rtt_ms"] < 1000 * 5.0
    # the model's clock: a frame per 80 ms, late by no more than its event loop was held
    # (bench_serve.LoopLag: its hold-ups, measured beside the call, are the machine's)
    assert 0 < summary["clock_gap_max_ms"] <= lag.bound_ms(FRAME_S, PACKET_S), \
        (summary, lag.max_ms)
    assert udp_sockets() == udp_before


@pytest.mark.parametrize("loss", [0.05, 0.20])
def test_a_lossy_jittery_network_is_concealed_and_counted(srv, loss):
    """The client drops `loss` of its RTP packets, delays the rest by 0-40 ms (reordering
    them), and its network stalls for half a second: the call holds, the model's frame clock
    never waits (no gap near the stall's length), the server's lost + late count is the
    client's drop count (give or take the reordered), each concealed, in /metrics too."""
    lost_before = metric(srv, "personaplex_webrtc_rtp_packets_total", outcome="lost")
    with LoopLag(srv.loop, MAX_CLOCK_LAG_S) as lag:
        res = asyncio.run(call(srv.url, speech(3.0), token=TOKEN, tail_s=0.5, loss=loss,
                               jitter_ms=40.0, seed=int(loss * 100), blackout=(1.5, 0.5)))
    settle(srv)
    assert res.status == 201, res.error
    summary = srv.history()[-1]
    assert res.packets_dropped > 0
    assert not [e for e in res.events if e["type"] == "error"]
    # the answer kept coming: 3.5 s of call, less the prefill
    assert res.audio.shape[0] >= 2.5 * 24000
    # the clock: a frame every 80 ms whatever the network did, late by no more than its event
    # loop was held meanwhile (measured beside it: a busy machine's hold-ups are not the
    # network's); a clock that waited for the network would have stopped for the 500 ms stall
    assert summary["clock_gap_max_ms"] <= lag.bound_ms(FRAME_S, PACKET_S), (summary, lag.max_ms)
    assert summary["clock_frames"] >= 3.0 / 0.08
    missing = summary["lost"] + summary["late"] + summary["discarded"]
    assert abs(missing - res.packets_dropped) <= 0.5 * res.packets_dropped + 3, summary
    assert summary["lost"] > 0 and summary["concealed"] > 0
    assert summary["concealed_ms"] >= 20 * summary["concealed"]
    # the stall's half second did not stay as latency: the buffer snapped back. Its depth in
    # its own units (audio held, not seconds of this machine's time), within what its snap
    # allows over its own target - a target that follows the jitter a busy machine adds; a
    # stall kept as latency holds 500 ms more
    assert summary["depth_mean_ms"] <= summary["target_ms"] + SNAP_MS, summary
    assert 20 <= summary["target_ms"] <= 200
    assert metric(srv, "personaplex_webrtc_rtp_packets_total", outcome="lost") - lost_before \
        == summary["lost"]
    assert metric(srv, "personaplex_webrtc_rtt_seconds_count") > 0


def test_fifty_calls_leave_nothing_behind(srv):
    """50 short calls, five at a time, clean and lossy, hung up by closing or by DELETE: every
    one answered, and afterwards no session, no call and no UDP port is left."""
    udp_before = udp_sockets()
    ended_before = srv.state.stats.registry.get_sample_value(
        "personaplex_sessions_ended_total", {"cause": "client"}) or 0.0
    pcm = speech(0.8)

    async def five(round_: int):
        return await asyncio.gather(*[
            call(srv.url, pcm, token=TOKEN, tail_s=0.2, loss=(0.0, 0.05, 0.2)[i % 3],
                 jitter_ms=40.0 if i % 3 else 0.0, seed=round_ * 5 + i,
                 hang_up="delete" if i % 2 else "close")
            for i in range(5)])

    statuses = []
    for round_ in range(10):
        statuses += [r.status for r in asyncio.run(five(round_))]
    settle(srv)
    assert statuses == [201] * 50
    assert srv.state.slots_used == 0 and not srv.state.sessions and not srv.state.calls
    assert udp_sockets() == udp_before
    ended = srv.state.stats.registry.get_sample_value(
        "personaplex_sessions_ended_total", {"cause": "client"})
    assert ended - ended_before == 50


def test_a_call_without_the_events_channel_still_converses(srv):
    res = asyncio.run(call(srv.url, speech(2.0), token=TOKEN, channel=False, tail_s=0.5))
    settle(srv)
    assert res.status == 201 and res.events == []
    assert res.audio.shape[0] >= 1.5 * 24000 and np.abs(res.audio).max() > 0
    assert srv.history()[-1]["frames"] >= 20


def test_the_session_update_sent_as_the_channel_opens_sets_the_persona(srv):
    """What the Agents SDK does: session.update on the channel's open, then waits for
    session.updated, which echoes it. OpenAI's WebRTC events on the audio: output_audio_buffer
    started with the response's first audio, stopped after its response.done (a cancel),
    cleared after an output_audio_buffer.clear."""
    from openai.types.realtime import RealtimeServerEvent
    from pydantic import TypeAdapter

    res = asyncio.run(call(srv.url, speech(2.5), token=TOKEN, tail_s=0.3, send_update={
        "type": "realtime", "instructions": "Be brief.", "audio": {"output": {"voice": "NATF1"}}},
        send_at=((1.8, {"type": "response.cancel"}),
                 (1.9, {"type": "output_audio_buffer.clear"}))))
    settle(srv)
    adapter = TypeAdapter(RealtimeServerEvent)
    for event in res.events:
        adapter.validate_python(event)
    updated = [e for e in res.events if e["type"] == "session.updated"]
    assert len(updated) == 1
    assert updated[0]["session"]["instructions"] == "Be brief."
    assert updated[0]["session"]["audio"]["output"]["voice"] == "NATF1"
    kinds = [e["type"] for e in res.events]
    assert "error" not in kinds
    first = res.events[kinds.index("response.created")]["response"]["id"]
    started = kinds.index("output_audio_buffer.started")
    assert res.events[started]["response_id"] == first
    assert kinds.index("response.content_part.added") < started
    done = kinds.index("response.done")
    assert res.events[done]["response"]["status"] == "cancelled"
    assert kinds[done + 1] == "output_audio_buffer.stopped"
    assert res.events[done + 1]["response_id"] == first
    cleared = kinds.index("output_audio_buffer.cleared")
    last = [e["response"]["id"] for e in res.events[:cleared] if e["type"] == "response.created"]
    assert res.events[cleared]["response_id"] == last[-1]  # the audio it cut off


def test_transcription_in_the_calls_session_without_a_transcriber_is_an_error(srv):
    """The offer's session asks for the user's transcription of a model without a transcriber:
    session.created, then the protocol's error naming the field; the call converses on, its
    session's other fields applied."""
    res = asyncio.run(call(srv.url, speech(1.5), token=TOKEN, tail_s=0.3, session={
        "type": "realtime", "instructions": "Be brief.",
        "audio": {"input": {"transcription": {"model": "any"}}}}))
    settle(srv)
    assert res.status == 201, res.error
    kinds = [e["type"] for e in res.events]
    assert kinds[:2] == ["session.created", "error"], kinds
    assert res.events[0]["session"]["instructions"] == "Be brief."
    assert res.events[0]["session"]["audio"]["input"]["transcription"] is None
    error = res.events[1]["error"]
    assert (error["code"], error["param"]) == ("transcription_unavailable",
                                               "session.audio.input.transcription")
    assert kinds.count("error") == 1 and "response.created" in kinds


def test_a_call_hung_up_by_delete_ends_and_is_gone(srv):
    res = asyncio.run(call(srv.url, speech(1.0), token=TOKEN, tail_s=0.2, hang_up="delete"))
    settle(srv)
    assert res.status == 201
    status, body, _ = asyncio.run(post(srv.url, b"", bearer(), res.location, "DELETE"))
    assert status == 404 and "no call" in body


def test_stopping_the_server_ends_a_call_with_its_last_events(demo_model, demo_model_dir):
    """Ctrl-C (the server's stop) while a call talks: its response ends `incomplete` on the
    channel, then the peer connection closes; the server waits for it. The stop comes once the
    call is answering (its first audio back), and the speech outlasts any wait for that, so the
    call is mid-conversation however slow the machine."""
    srv = ServerThread(ServeOptions(demo_model_dir, port=0), model=demo_model).__enter__()

    async def scene():
        answering = asyncio.Event()
        talking = asyncio.create_task(call(srv.url, speech(120.0), tail_s=0.5,
                                           first_audio=answering))
        waiting = asyncio.create_task(answering.wait())
        await asyncio.wait({talking, waiting}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        assert answering.is_set(), "the call never answered" if not talking.done() \
            else talking.result()
        await asyncio.get_running_loop().run_in_executor(None, srv.__exit__, None, None, None)
        return await talking

    res = asyncio.run(scene())
    assert res.status == 201
    done = [e for e in res.events if e["type"] == "response.done"]
    assert done and done[-1]["response"]["status"] == "incomplete"
    assert srv.server.state is None  # stopped, every call closed first
    # the call ended with the server, long before its 120 s of speech
    assert len(res.sent_at) < 120 * 50


# -- the network going away ------------------------------------------------------------------------
def test_a_vanished_peer_frees_its_slot_by_its_own_timer(srv):
    """The call's own PEER_GONE_S timer ends it (its reason counted), not the connection's
    much later consent check."""
    before = metric(srv, "personaplex_webrtc_calls_failed_total", reason="peer_gone")
    res = asyncio.run(call(srv.url, speech(1.0), token=TOKEN, tail_s=0.0, hang_up="vanish"))
    assert res.status == 201
    settle(srv, 60)
    assert metric(srv, "personaplex_webrtc_calls_failed_total", reason="peer_gone") == before + 1


def test_ice_that_never_connects_frees_its_slot(srv):
    """An offer whose client never takes the answer: no check ever comes."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    from personaplex_edge.runtime.serve.webrtc.ice import gathering_on

    async def offer_only():
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("audio", direction="sendrecv")
        with gathering_on(("127.0.0.1",)):
            await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()  # its ports close: the server's checks reach nobody
        return await post(srv.url, sdp, bearer(**{"Content-Type": "application/sdp"}))

    before = metric(srv, "personaplex_webrtc_calls_failed_total", reason="ice")
    status, _, _ = asyncio.run(offer_only())
    assert status == 201
    settle(srv, 60)
    # ended by the call's own CONNECT_TIMEOUT_S (the only place that counts "ice")
    assert metric(srv, "personaplex_webrtc_calls_failed_total", reason="ice") == before + 1


# -- refusals --------------------------------------------------------------------------------------
def _offer(kind: str = "audio") -> str:
    from aiortc import RTCConfiguration, RTCPeerConnection

    from personaplex_edge.runtime.serve.webrtc.ice import gathering_on

    async def make():
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        if kind == "audio":
            pc.addTransceiver("audio", direction="sendrecv")
        elif kind == "recvonly":
            pc.addTransceiver("audio", direction="recvonly")
        else:
            pc.createDataChannel("oai-events")
        with gathering_on(("127.0.0.1",)):
            await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return sdp
    return asyncio.run(make())


@pytest.mark.parametrize("body, reason", [
    ("", "the offer is empty"),
    ("hello", "not an SDP offer"),
    ("v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF x\r\n", "does not parse"),
    ("DATA", "no audio section"),
    ("RECVONLY", "recvonly"),
])
def test_an_offer_a_call_cannot_use_is_400_with_the_reason(srv, body, reason):
    if body == "DATA":
        body = _offer("data")
    elif body == "RECVONLY":
        body = _offer("recvonly")
    udp_before = udp_sockets()
    status, text, _ = asyncio.run(post(srv.url, body, bearer(
        **{"Content-Type": "application/sdp"})))
    assert status == 400 and reason in json.loads(text)["error"]["message"], text
    assert srv.state.slots_used == 0 and udp_sockets() == udp_before


def test_the_checks_of_the_websocket_guard_calls(srv):
    sdp = _offer()
    sdp_type = {"Content-Type": "application/sdp"}
    assert asyncio.run(post(srv.url, sdp, sdp_type))[0] == 401
    assert asyncio.run(post(srv.url, sdp, bearer("wrong", **sdp_type)))[0] == 401
    assert asyncio.run(post(srv.url, sdp, bearer(**sdp_type, Origin="http://evil.example")))[0] \
        == 403
    assert asyncio.run(post(srv.url, sdp, bearer(**sdp_type, Host="evil.example:8998")))[0] \
        == 403
    assert srv.state.slots_used == 0


def _mint(srv, session: dict | None = None, seconds: int | None = None) -> tuple[int, dict]:
    """POST /v1/realtime/client_secrets as an app's backend does: (status, its JSON)."""
    body: dict = {} if session is None else {"session": session}
    if seconds is not None:
        body["expires_after"] = {"anchor": "created_at", "seconds": seconds}
    status, text, _ = asyncio.run(post(srv.url, json.dumps(body), bearer(
        **{"Content-Type": "application/json"}), "/v1/realtime/client_secrets"))
    return status, json.loads(text)


def _refused(status: int, text: str, headers: dict, code: str, cors: bool = True) -> dict:
    """OpenAI's JSON error with `code`, readable by the allowed page (APP) when `cors`."""
    error = json.loads(text)["error"]
    assert error["code"] == code and error["message"], (status, text)
    assert error["type"] in ("invalid_request_error", "rate_limit_error", "server_error")
    if cors:
        assert headers.get("Access-Control-Allow-Origin") == APP, headers
    else:
        assert "Access-Control-Allow-Origin" not in headers, headers
    return error


def test_every_refusal_is_openais_json_error_the_allowed_page_can_read(srv, monkeypatch):
    """A page on an allowed origin (APP) learns why its call or hang-up was refused: the token,
    a spent, expired or unknown ek_ key - OpenAI's JSON error, with the CORS headers that let
    it read the answer. A page on any other origin gets the error without them (the browser
    keeps it from the page, as it should)."""
    sdp = _offer()
    page = {"Content-Type": "application/sdp", "Origin": APP}
    for headers, code in (({}, "invalid_api_key"), (bearer("wrong"), "invalid_api_key"),
                          (bearer("ek_never_issued"), "invalid_api_key")):
        status, text, got = asyncio.run(post(srv.url, sdp, {**page, **headers}))
        assert status == 401, (status, text)
        _refused(status, text, got, code)
        assert got.get("WWW-Authenticate") == "Bearer"
    # a spent key: its one call made
    key = _mint(srv)[1]["value"]
    res = asyncio.run(call(srv.url, speech(0.3), token=key, tail_s=0.0, headers={"Origin": APP}))
    settle(srv)
    assert res.status == 201, res.error
    status, text, got = asyncio.run(post(srv.url, sdp, {**page, **bearer(key)}))
    assert status == 401 and "ask your app's backend for a new one" in \
        _refused(status, text, got, "invalid_api_key")["message"]
    # an expired key
    late = _mint(srv, seconds=10)[1]["value"]
    keys = srv.state.client_keys
    monkeypatch.setattr(keys, "_clock", lambda: time.time() + 11)
    status, text, got = asyncio.run(post(srv.url, sdp, {**page, **bearer(late)}))
    assert status == 401
    _refused(status, text, got, "invalid_api_key")
    monkeypatch.undo()
    # hanging up: the token's check, and a call that is gone
    for method, path in (("DELETE", "/v1/realtime/calls/rtc_x"),
                         ("POST", "/v1/realtime/calls/rtc_x/hangup")):
        status, text, got = asyncio.run(post(srv.url, b"", {"Origin": APP, **bearer("wrong")},
                                             path, method))
        assert status == 401
        _refused(status, text, got, "invalid_api_key")
        status, text, got = asyncio.run(post(srv.url, b"", {"Origin": APP, **bearer()}, path,
                                             method))
        assert status == 404
        _refused(status, text, got, "call_not_found")
    # another origin: the same JSON, and no CORS headers for it
    for path, method in (("/v1/realtime/calls", "POST"), ("/v1/realtime/calls", "OPTIONS")):
        status, text, got = asyncio.run(post(srv.url, sdp, {
            **page, **bearer(), "Origin": "http://evil.example",
            "Access-Control-Request-Method": "POST"}, path, method))
        assert status == 403
        _refused(status, text, got, "origin_not_allowed", cors=False)
    # minting keys: the backend's token
    status, text, got = asyncio.run(post(srv.url, "{}", {"Origin": APP, **bearer("wrong")},
                                         "/v1/realtime/client_secrets"))
    assert status == 401
    _refused(status, text, got, "invalid_api_key")
    assert srv.state.slots_used == 0


def test_cors_preflight_is_answered_for_allowed_origins_only(srv):
    ask = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type, x-openai-agents-sdk"}
    status, _, headers = asyncio.run(post(srv.url, b"", {"Origin": APP, **ask},
                                          method="OPTIONS"))
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == APP
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert "x-openai-agents-sdk" in headers["Access-Control-Allow-Headers"]
    assert "Location" in headers["Access-Control-Expose-Headers"]
    status, _, headers = asyncio.run(post(srv.url, b"", {"Origin": "http://evil.example", **ask},
                                          method="OPTIONS"))
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    # the keys' routes and the beta's call, where the WebSocket is (its GET unchanged)
    for path in ("/v1/realtime/client_secrets", "/v1/realtime/sessions", "/v1/realtime"):
        status, _, headers = asyncio.run(post(srv.url, b"", {"Origin": APP, **ask}, path,
                                              "OPTIONS"))
        assert status == 204 and headers["Access-Control-Allow-Origin"] == APP, path
    # the answer itself lets the allowed page read its Location
    res = asyncio.run(call(srv.url, speech(0.5), token=TOKEN, tail_s=0.0,
                           headers={"Origin": APP}))
    settle(srv)
    assert res.status == 201 and res.location


def test_client_keys_are_one_call_each_and_expire(srv, monkeypatch):
    async def issue(body: dict, token: str = TOKEN):
        return await post(srv.url, json.dumps(body), bearer(token, **{
            "Content-Type": "application/json"}), "/v1/realtime/client_secrets")

    status, text, _ = asyncio.run(issue({"session": {"type": "realtime",
                                                     "instructions": "Be kind."}}))
    assert status == 200
    secret = json.loads(text)
    key = secret["value"]
    assert key.startswith("ek_") and secret["expires_at"] > time.time() + 500
    assert secret["session"]["instructions"] == "Be kind."
    # a key makes no keys, and the token is needed to make one
    assert asyncio.run(issue({}, key))[0] == 401
    assert asyncio.run(issue({}, "wrong"))[0] == 401
    assert asyncio.run(issue({"expires_after": {"seconds": 5}}))[0] == 400
    # the key stands for the token, once; its session is the call's
    res = asyncio.run(call(srv.url, speech(1.0), token=key, tail_s=0.2))
    settle(srv)
    assert res.status == 201, res.error
    assert res.events[0]["session"]["instructions"] == "Be kind."
    again = asyncio.run(call(srv.url, speech(0.2), token=key))
    assert again.status == 401
    # an expired one
    status, text, _ = asyncio.run(issue({"expires_after": {"anchor": "created_at",
                                                           "seconds": 10}}))
    late = json.loads(text)["value"]
    keys = srv.state.client_keys
    monkeypatch.setattr(keys, "_clock", lambda: time.time() + 11)
    assert asyncio.run(call(srv.url, speech(0.2), token=late)).status == 401
    assert srv.state.slots_used == 0


def test_a_call_refused_for_its_offer_keeps_its_key(srv, monkeypatch):
    """An offer whose Opus is not WebRTC's (opus/24000), a session the call cannot take, or any
    error of aiortc's answering: 400 (not the server's 500), no port left open, and the ek_ key
    is not spent - the client's next, good offer makes the call with it."""
    import aiortc as aiortc_module

    key = _mint(srv)[1]["value"]
    sdp_type = {"Content-Type": "application/sdp"}
    udp_before = udp_sockets()
    status, text, _ = asyncio.run(post(srv.url, _offer().replace("opus/48000/2", "opus/24000/2"),
                                       bearer(key, **sdp_type)))
    assert status == 400, text
    error = json.loads(text)["error"]
    assert error["code"] == "invalid_offer" and "opus/48000/2" in error["message"]
    # aiortc itself failing to answer
    def broken(self):
        raise RuntimeError("no answer today")
    with monkeypatch.context() as m:
        m.setattr(aiortc_module.RTCPeerConnection, "createAnswer", broken)
        status, text, _ = asyncio.run(post(srv.url, _offer(), bearer(key, **sdp_type)))
    assert status == 400 and "no answer today" in json.loads(text)["error"]["message"], text
    # the form's session: a voice the server has not
    res = asyncio.run(call(srv.url, speech(0.2), token=key, session={
        "type": "realtime", "audio": {"output": {"voice": "NOPE"}}}))
    assert res.status == 400 and json.loads(res.error)["error"]["code"] == "invalid_session"
    assert srv.state.slots_used == 0 and udp_sockets() == udp_before
    res = asyncio.run(call(srv.url, speech(0.5), token=key, tail_s=0.0))
    settle(srv)
    assert res.status == 201, res.error


SESSIONS_A_CALL_REFUSES = [
    ({"audio": {"output": {"voice": "NOPE"}}}, "session.audio.output.voice"),
    ({"voice": "../NATF2"}, "session.voice"),
    ({"instructions": "x" * 20_000}, "session.instructions"),
    ({"instructions": 7}, "session.instructions"),
    ({"audio": {"output": {"format": {"type": "audio/pcmu"}}}}, "session.audio.output.format"),
    ({"input_audio_format": "g711_ulaw"}, "session.input_audio_format"),
    ({"audio": {"input": {"transcription": "yes"}}}, "session.audio.input.transcription"),
]


@pytest.mark.parametrize("session, param", SESSIONS_A_CALL_REFUSES)
def test_no_key_is_minted_for_a_session_its_call_would_refuse(srv, session, param):
    """What a call refuses of its starting session, client_secrets refuses when the key is
    asked for (one check serves both): 400 naming the field, and no key; the same session in
    a call's form is a 400 too."""
    before = len(srv.state.client_keys)
    status, body = _mint(srv, {"type": "realtime", **session})
    assert status == 400 and param in body["error"]["message"], body
    # the beta's /v1/realtime/sessions, its body the session itself
    status, text, _ = asyncio.run(post(srv.url, json.dumps(session), bearer(
        **{"Content-Type": "application/json"}), "/v1/realtime/sessions"))
    assert status == 400 and param in json.loads(text)["error"]["message"], text
    assert len(srv.state.client_keys) == before
    res = asyncio.run(call(srv.url, speech(0.2), token=TOKEN,
                           session={"type": "realtime", **session}))
    assert res.status == 400 and param in json.loads(res.error)["error"]["message"], res.error


def test_a_key_minted_is_a_call_taken(srv):
    """The sessions a key is minted for - an OpenAI voice (the bank's default speaks), a
    transcription this model cannot give (an error event, no refusal), a bank voice by its
    file's name - make their call."""
    for session in ({"audio": {"output": {"voice": "alloy"}}},
                    {"audio": {"input": {"transcription": {"model": "whisper-1"}}}},
                    {"voice": "NATF1.pt", "instructions": "Be brief."}):
        status, body = _mint(srv, {"type": "realtime", **session})
        assert status == 200, body
        res = asyncio.run(call(srv.url, speech(0.3), token=body["value"], tail_s=0.0))
        settle(srv)
        assert res.status == 201, (session, res.error)


def test_over_max_sessions_is_refused_as_busy_without_a_port(demo_model, demo_model_dir):
    with ServerThread(ServeOptions(demo_model_dir, port=0, max_sessions=1),
                      model=demo_model) as one:
        async def two():
            answering, done = asyncio.Event(), asyncio.Event()
            first = asyncio.create_task(call(one.url, speech(120.0), tail_s=0.0,
                                             first_audio=answering, stop=done))
            await asyncio.wait_for(answering.wait(), 120)  # the first holds the one slot
            udp = udp_sockets()
            second = await call(one.url, speech(0.5), headers={"Origin": one.url.rstrip("/")})
            udp_after = udp_sockets()
            done.set()
            return await first, second, udp, udp_after

        first, second, udp_then, udp_after_refusal = asyncio.run(two())
        settle(one)
    assert first.status == 201
    assert second.status == 429
    error = json.loads(second.error)["error"]
    assert error["message"] == "busy: 1 of 1 sessions" and error["type"] == "rate_limit_error"
    # the page of the server's own origin reads the refusal
    assert second.headers.get("Access-Control-Allow-Origin") == one.url.rstrip("/")
    # the refused call's own client opened ports of its own; the server none for it
    assert udp_after_refusal <= udp_then + 1


def test_without_aiortc_the_route_says_what_to_install(srv, monkeypatch):
    monkeypatch.setattr(webrtc_route, "webrtc_missing", lambda: "No module named 'aiortc'")
    status, text, _ = asyncio.run(post(srv.url, _offer(), bearer(
        **{"Content-Type": "application/sdp"})))
    assert status == 501
    assert "pip install 'personaplex-edge[webrtc]'" in json.loads(text)["error"]["message"]


# -- the jitter buffer alone -----------------------------------------------------------------------
def _packets(seconds: float = 2.0):
    """A tone with speech-like loudness changes as 20 ms Opus packets at 48 kHz (FEC on)."""
    enc = libopus.Encoder(48000)
    enc.set(libopus.SET_INBAND_FEC, 1)
    enc.set(libopus.SET_PACKET_LOSS_PERC, 20)
    t = np.arange(int(seconds * 48000)) / 48000
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
           ).astype(np.float32)
    return pcm, [enc.encode(pcm[i:i + 960].copy()) for i in range(0, pcm.shape[0], 960)]


def _decoded(packets, lost: set, fec: bool) -> np.ndarray:
    """The packets through one libopus decoder, the lost ones concealed (from the next
    packet's FEC copy, or by PLC)."""
    dec = libopus.Decoder(48000)
    buf = np.zeros(dec.max_samples, np.float32)
    out = []
    for seq, payload in enumerate(packets):
        if seq in lost:
            n = dec.conceal(960, buf, packets[seq + 1] if fec else None)
        else:
            n = dec.decode(payload, buf)
        out.append(buf[:n].copy())
    return np.concatenate(out)


def test_the_jitter_buffer_conceals_loss_with_fec_and_keeps_time():
    """Every 7th packet lost: the buffer plays the clock's samples all the same, each lost
    packet rebuilt from the next one's FEC copy - what one decoder fed the same packets makes
    of them - which is nearer the clean decode than the codec's loss concealment alone."""
    _, packets = _packets()
    lost = set(range(10, len(packets) - 1, 7))
    jb = JitterBuffer(libopus.Decoder(48000))
    out = []
    for seq, payload in enumerate(packets):
        if seq not in lost:
            jb.push(seq, seq * 960, payload, seq * 0.02)
        if seq >= 1:  # the clock starts once 40 ms wait; the next packet is always there
            out.append(jb.pull(960))
    assert all(o is not None and o.shape == (960,) for o in out)
    played = np.concatenate(out)
    s = jb.stats
    assert s.lost == len([q for q in lost if q < len(out)]) and s.fec == s.lost
    assert s.underruns == 0 and s.late == 0 and s.played + s.concealed == len(out)
    assert s.concealed == s.lost
    with_fec = _decoded(packets, lost, fec=True)[:played.shape[0]]
    np.testing.assert_array_equal(played, with_fec)
    clean = _decoded(packets, set(), fec=False)[:played.shape[0]]
    plc = _decoded(packets, lost, fec=False)[:played.shape[0]]
    at = np.concatenate([np.arange(q * 960, (q + 1) * 960) for q in lost
                         if (q + 1) * 960 <= played.shape[0]])
    fec_err = np.abs(with_fec[at] - clean[at]).mean()
    plc_err = np.abs(plc[at] - clean[at]).mean()
    assert fec_err < 0.5 * plc_err, (fec_err, plc_err)


def test_the_jitter_buffer_reorders_drops_late_and_grows_with_jitter():
    _, packets = _packets(4.0)
    jb = JitterBuffer(libopus.Decoder(48000))
    rng = np.random.default_rng(0)
    arrival = np.arange(len(packets)) * 0.02 + rng.uniform(0, 0.06, len(packets))
    order = np.argsort(arrival)
    pulls, now, i = 0, 0.0, 0
    while i < len(order) or pulls < len(packets) - 2:
        now += 0.02
        while i < len(order) and arrival[order[i]] <= now:
            seq = int(order[i])
            jb.push(seq, seq * 960, packets[seq], float(arrival[seq]))
            i += 1
        if jb.pull(960) is not None:
            pulls += 1
        if now > 6:
            break
    s = jb.stats
    assert s.played + s.concealed == pulls  # a turn per pull
    assert s.played > 0.8 * len(packets)
    assert s.jitter_ms > 5 and s.target_ms > 20  # it measured the jitter and aimed above it
    # duplicates and packets after their turn are dropped and counted
    jb.push(3, 3 * 960, packets[3], now)
    assert s.late >= 1


def test_the_jitter_buffer_holds_a_bounded_stream_whatever_the_caller_sends():
    """A caller jumping 999 sequence numbers a packet, ten packets to each 20 ms pull (a new
    stream each time is 1000: this stays under it): every packet is ahead of the playout point
    by far more than the buffer keeps, so it holds next to nothing and its memory stays flat
    (it kept every one of them); a caller of 2.5 ms packets in a steady run is held to
    MAX_PACKETS; the buffer plays all along."""
    import tracemalloc

    from personaplex_edge.runtime.serve.webrtc.jitter import MAX_PACKETS

    _, packets = _packets(1.0)
    jb = JitterBuffer(libopus.Decoder(48000))
    for seq in range(3):  # a call under way
        jb.push(seq, seq * 960, packets[seq], seq * 0.02)
    assert jb.pull(960) is not None
    held, sizes, pulled = 0, [], 0
    tracemalloc.start()
    try:
        for i in range(1, 20_001):
            jb.push((2 + i * 999) % 65536, i * 960, packets[i % len(packets)], i * 0.002)
            held = max(held, jb.held)
            if i % 10 == 0:
                pulled += jb.pull(960) is not None
            if i in (2_000, 20_000):
                sizes.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert held <= 2, held
    assert sizes[1] - sizes[0] < 64 << 10, sizes  # 18,000 more packets: no more memory
    assert pulled == 2000  # never waiting: each pull has its turn
    # 2.5 ms packets (120 samples at 48 kHz), 400 of them in a row and nothing pulled
    short = libopus.Encoder(48000).encode(np.zeros(120, np.float32))
    jb = JitterBuffer(libopus.Decoder(48000))
    for i in range(400):
        jb.push(i, i * 120, short, i * 0.0025)
        assert jb.held <= MAX_PACKETS


def test_the_jitter_buffer_after_a_long_stall_plays_what_comes():
    """Two seconds with no packet (more than the buffer ever holds ahead), then the stream
    goes on from where its sender is now: it is played at once, not concealed turn by turn
    for the two seconds missed."""
    _, packets = _packets(4.0)
    jb = JitterBuffer(libopus.Decoder(48000))
    for seq in range(50):
        jb.push(seq, seq * 960, packets[seq], seq * 0.02)
        if seq >= 1:
            jb.pull(960)
    for _ in range(100):  # the stall: the clock goes on, concealing
        jb.pull(960)
    assert jb.stats.underruns >= 98
    played = jb.stats.played
    for seq in range(150, 160):
        jb.push(seq, seq * 960, packets[seq], seq * 0.02)
        jb.pull(960)
    assert jb.stats.played >= played + 8  # the new packets, each in its turn
    assert jb.held <= 2


# -- the data channel's limits ---------------------------------------------------------------------
def test_a_message_over_the_advertised_size_ends_the_call_unread(srv, monkeypatch):
    """The answer allows messages of 262144 bytes (a=max-message-size); a client that sends
    3 MB anyway (aiortc's own check lifted): no message over the limit ever reaches the
    protocol's parser (it would block the event loop every call shares), the server holds no
    more than the limit of it, and the call ends with an error event that says why. A message
    just inside the limit, sent first, is read."""
    from personaplex_edge.runtime.serve.webrtc import call as webrtc_call

    read = []
    receive = webrtc_call.CallWire.receive

    def reading(self, session, data):
        read.append(len(data))
        return receive(self, session, data)

    monkeypatch.setattr(webrtc_call.CallWire, "receive", reading)
    fits = {"type": "conversation.item.retrieve", "item_id": "x" * (262144 - 100)}
    too_big = {"type": "conversation.item.retrieve", "item_id": "x" * 3_000_000}
    res = asyncio.run(call(srv.url, speech(20.0), token=TOKEN, tail_s=0.0,
                           ignore_message_limit=True, send_at=((0.0, fits), (0.2, too_big))))
    settle(srv)
    assert res.status == 201 and "a=max-message-size:262144" in res.answer_sdp
    assert read and 262144 - 100 < max(read) <= 262144, read
    errors = [e["error"] for e in res.events if e["type"] == "error"]
    assert errors and "a=max-message-size" in errors[-1]["message"], res.events[-3:]
    assert srv.history()[-1]["protocol"] == "webrtc"
    assert len(res.sent_at) < 20 * 50  # the server ended it, long before its speech did


def test_the_events_waiting_to_be_read_are_counted_in_bytes():
    """A burst of a thousand small events waits to be read (a count of 256 cut such a client
    off); five of the largest a channel carries end the session."""
    from personaplex_edge.runtime.serve.webrtc.call import MAX_INBOX_BYTES, CallTransport
    from personaplex_edge.runtime.serve.webrtc.channel import MAX_MESSAGE_BYTES

    class Channel:
        readyState = "open"

        def __init__(self):
            self.handlers = {}

        def on(self, name, handler=None):
            if handler is None:
                return lambda h: self.handlers.setdefault(name, h)
            self.handlers[name] = handler

    class Ends:
        ended = None

        def end(self, reason, code):
            self.ended = reason

    class Owner:
        session, wire, closing = Ends(), type("W", (), {"audio_came": lambda self: None})(), False

    async def burst(messages):
        owner = Owner()
        transport = CallTransport(owner, expect_channel=True)
        channel = Channel()
        transport.attach(channel)
        for message in messages:
            channel.handlers["message"](message)
        return owner.session.ended, transport

    ended, transport = asyncio.run(burst(['{"type":"response.create"}'] * 1000))
    assert ended is None and transport._inbox.qsize() == 1000
    ended, _ = asyncio.run(burst(["x" * MAX_MESSAGE_BYTES] * 5))
    assert ended is not None and str(MAX_INBOX_BYTES) in ended


def test_serve_says_the_token_guards_the_calls_too():
    """The line `serve` prints once it listens names what needs the token: the WebSockets and
    the WebRTC calls (or the client keys made with it)."""
    from pathlib import Path

    from personaplex_edge.runtime.serve.server import serving_line

    line = serving_line("demo", "http://127.0.0.1:8998/", False,
                        ServeOptions(Path("demo"), auth_token=TOKEN))
    assert "WebSockets and WebRTC calls need the --auth-token" in line
    assert "client key" in line
    assert "auth-token" not in serving_line("demo", "http://127.0.0.1:8998/", False,
                                            ServeOptions(Path("demo")))
