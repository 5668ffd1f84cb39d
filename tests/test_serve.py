"""`personaplex-edge serve` on the demo model, driven through its WebSocket like a client:
end-to-end greedy correctness, PersonaPlex's query parameters, bad input isolated to its
session, drops counted, the busy refusal, the token, TLS, health, voices and metrics."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import socket
import subprocess
import time

import numpy as np
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("sphn")
pytest.importorskip("prometheus_client")

import aiohttp  # noqa: E402
from bench_serve import (FRAME, ServerThread, opus_pages, opus_round_trip,  # noqa: E402
                         reference_text, speech, talk, wait_until)

from personaplex_edge.runtime.sampling import SamplingParams  # noqa: E402
from personaplex_edge.runtime.serve import ServeOptions  # noqa: E402

# as conftest's greedy_server: nothing dropped; audio pushed as fast as a test can is not cut
# off as running ahead
EXACT = dict(sampling=SamplingParams(greedy=True), max_backlog=100_000, max_ahead_s=None)
# the demo's voice bank: the names of the published one
DEMO_VOICES = ["NATF0", "NATF1", "NATF2", "NATF3", "NATM0", "NATM1", "NATM2", "NATM3",
               "VARF0", "VARF1", "VARF2", "VARF3", "VARF4", "VARM0", "VARM1", "VARM2", "VARM3",
               "VARM4"]


@pytest.fixture(scope="module")
def sampling_server(demo_model, demo_model_dir):
    """The reference's sampling defaults (not greedy), nothing dropped."""
    with ServerThread(ServeOptions(demo_model_dir, port=0, max_backlog=100_000),
                      model=demo_model) as srv:
        yield srv


@pytest.fixture(scope="module")
def pages():
    return opus_pages(speech(4.0))  # 50 frames of the bundled speech, Opus-encoded


@pytest.fixture(scope="module")
def reference(demo_model_dir, pages, tmp_path_factory):
    """The greedy default persona's text for `pages` after the Opus round trip."""
    pcm = opus_round_trip(pages)
    return reference_text(demo_model_dir, pcm, tmp_path_factory.mktemp("ref"), "--greedy")


def chat(srv, pages, **kw):
    return asyncio.run(talk(srv.url, pages, **kw))


async def until(condition, timeout: float = 60.0) -> bool:
    """`wait_until` from inside a scene: the event loop (its clients) runs on meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(None, wait_until, condition,
                                                            timeout)


# -- correctness end to end ----------------------------------------------------------------------
def test_greedy_text_over_the_wire_equals_run_on_the_same_audio(greedy_server, pages, reference):
    n = len(opus_round_trip(pages)) // FRAME
    r = chat(greedy_server, pages, pace=None, until_frames=n, tail_s=10)
    assert r.kinds[0] == 0 and r.handshake_s is not None  # the handshake comes first
    assert not r.errors
    assert r.answer_samples == n * FRAME  # one answer frame per input frame
    assert r.pieces > 5 and r.text == reference
    assert wait_until(lambda: not greedy_server.state.sessions)
    assert greedy_server.history()[-1]["dropped"] == 0


def test_personaplex_query_parameters_are_honoured(sampling_server, demo_model_dir, pages,
                                                   tmp_path):
    """PersonaPlex's web client's parameters (plus moshi's, which are ignored): the answer
    equals `run` with the same persona and sampling, and differs from the server's defaults'
    answer with the same seeds."""
    prompt = "You enjoy having a good conversation."
    query = ("?text_prompt=" + prompt.replace(" ", "%20") + "&voice_prompt=NATM1.pt"
             "&text_temperature=0.6&text_topk=20&audio_temperature=0.7&audio_topk=100"
             "&text_seed=7&audio_seed=9&pad_mult=0&repetition_penalty=1.0"
             "&repetition_penalty_context=64&worker_auth_id=x&email=a%40b.c")
    n = len(opus_round_trip(pages)) // FRAME
    r = chat(sampling_server, pages, query=query, pace=None, until_frames=n, tail_s=10)
    plain = chat(sampling_server, pages, query="?text_seed=7&audio_seed=9", pace=None,
                 until_frames=n, tail_s=10)
    assert not r.errors and r.answer_samples == n * FRAME
    expected = reference_text(demo_model_dir, opus_round_trip(pages), tmp_path,
                             "--text-prompt", prompt, "--voice-prompt", "NATM1",
                             "--temp-text", "0.6", "--top-k-text", "20", "--temp", "0.7",
                             "--top-k", "100", "--seed", str(7 * 2**32 + 9))
    assert r.pieces > 5 and r.text == expected
    assert plain.text != r.text


def test_a_voice_from_the_voice_dir(demo_model, demo_model_dir, pages, tmp_path, reference):
    """A client names a recording of --voice-dir (by file name or stem): its conversation is
    `run --voice-prompt` on that file; /api/voices lists it beside the bank."""
    import soundfile as sf

    voices = tmp_path / "voices"
    voices.mkdir()
    sf.write(voices / "mine.wav", speech(3.0), 24000)
    n = len(opus_round_trip(pages)) // FRAME
    with ServerThread(ServeOptions(demo_model_dir, port=0, voice_dir=voices, **EXACT),
                      model=demo_model) as srv:
        r = chat(srv, pages, query="?voice_prompt=mine", pace=None, until_frames=n, tail_s=10)

        async def listed():
            async with aiohttp.ClientSession() as http:
                return await (await http.get(srv.url + "api/voices")).json()
        names = asyncio.run(listed())
    assert "mine.wav" in str(names) and "NATF2" in str(names)
    assert not r.errors and r.answer_samples == n * FRAME
    expected = reference_text(demo_model_dir, opus_round_trip(pages), tmp_path / "ref",
                              "--greedy", "--voice-prompt", str(voices / "mine.wav"))
    assert r.text == expected and r.text != reference  # not the default voice's answer


# -- bad input stays in its session -------------------------------------------------------------
BAD = [
    (b"\x01" + b"garbage!" * 20, "not an Ogg/Opus stream"),
    (b"\x0ahello", "unknown message kind 10"),
    ("hello", "text WebSocket frames are not part of the protocol"),
    (b"\x01" + bytes(1 << 20) + b"!", "over the limit of 1048576"),
    (b"", "empty message"),
]


async def bad_client(url: str, payload) -> tuple[list[bytes], int | None]:
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url.replace("http", "ws") + "api/chat") as ws:
            first = await ws.receive(timeout=10)
            assert first.data == b"\x00"
            if isinstance(payload, str):
                await ws.send_str(payload)
            else:
                await ws.send_bytes(payload)
            got = [m.data async for m in ws if m.type == aiohttp.WSMsgType.BINARY]
            return got, ws.close_code


def test_bad_input_ends_only_its_own_session(greedy_server, pages, reference, caplog):
    caplog.set_level(logging.INFO, logger="personaplex_edge.serve")
    n = len(opus_round_trip(pages)) // FRAME

    async def scene():
        good = asyncio.create_task(talk(greedy_server.url, pages, pace=0.02, until_frames=n,
                                        tail_s=10))
        # the good session is streaming (its first frame answered) when the bad ones come
        assert await until(lambda: any(s.frames_answered for s in list(
            greedy_server.state.sessions))), "the good session never got going"
        bad = await asyncio.gather(*(bad_client(greedy_server.url, p) for p, _ in BAD))
        return await good, bad

    good, bad = asyncio.run(scene())
    for (payload, reason), (got, code) in zip(BAD, bad):
        errors = [m for m in got if m[:1] == b"\x05"]
        assert len(errors) == 1 and reason in errors[0].decode(), (reason, got[-3:])
        assert got[-1][:1] == b"\x05"  # the reason is the last word before the close
        assert code == 1008
        lines = [r.getMessage() for r in caplog.records if reason in r.getMessage()]
        assert len(lines) == 1 and "ended: " in lines[0]  # one log line each
    # the session streaming meanwhile heard exactly what it hears alone
    assert not good.errors and good.text == reference
    # and the server still serves
    again = chat(greedy_server, pages[:5], pace=None, tail_s=0.5)
    assert again.kinds[:1] == [0] and not again.errors
    assert wait_until(lambda: not greedy_server.state.sessions)


def ws_frame(payload: bytes) -> bytes:
    """One masked binary WebSocket frame, as a client sends it."""
    n = len(payload)
    head = bytes([0x82]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) +
                            n.to_bytes(2, "big") if n < 65536 else bytes([0x80 | 127]) +
                            n.to_bytes(8, "big"))
    mask = np.frombuffer(os.urandom(4), np.uint8)
    data = np.frombuffer(payload, np.uint8) ^ np.resize(mask, n)
    return head + mask.tobytes() + data.tobytes()


def test_a_client_that_stops_reading_is_cut_off(greedy_server, caplog):
    """A raw client keeps sending but never reads (a tiny receive buffer, nothing taken from
    it): the kernel's and aiohttp's buffers fill, then the session's bounded send queue, and
    the session ends with one log line, its slot free; the reason is the last thing queued."""
    caplog.set_level(logging.INFO, logger="personaplex_edge.serve")
    host, port = greedy_server.url.split("//")[1].rstrip("/").split(":")
    pages = [p for p in opus_pages(speech(60.0)) if p]

    def cut() -> bool:
        return any("not reading" in r.getMessage() for r in caplog.records)

    async def scene():
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(f"GET /api/chat HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                     f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                     "Sec-WebSocket-Version: 13\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101")
        assert await reader.readexactly(3) == b"\x82\x01\x00"  # the handshake message
        t0 = time.monotonic()
        for p in pages:  # as fast as the server takes them; nothing is read from here on
            writer.write(ws_frame(b"\x01" + p))
            await writer.drain()
            if cut():
                break
            await asyncio.sleep(0.001)
        while not cut() and time.monotonic() - t0 < 30:  # answers pile up, unread
            await asyncio.sleep(0.05)
        seconds = time.monotonic() - t0
        # reading again now drains what the server had buffered, its last word included
        rest = b""
        try:
            while True:
                chunk = await asyncio.wait_for(reader.read(1 << 16), 2)
                if not chunk:
                    break
                rest += chunk
        except (asyncio.TimeoutError, ConnectionError):
            pass
        writer.close()
        return seconds, rest

    seconds, rest = asyncio.run(scene())
    assert cut(), "the session was not ended"
    lines = [r.getMessage() for r in caplog.records if "not reading" in r.getMessage()]
    assert len(lines) == 1 and "messages wait to be sent" in lines[0]
    assert seconds < 30
    assert b"\x05the client is not reading" in rest
    assert wait_until(lambda: greedy_server.state.slots_used == 0, timeout=5)


# -- latency: drop the oldest, count it -----------------------------------------------------------
def test_a_session_that_falls_behind_drops_its_oldest_frames(demo_model, demo_model_dir, pages,
                                                             monkeypatch):
    # a server too slow for its clients, played by one client sending far ahead of the clock
    from personaplex_edge.runtime.frame_backlog import FrameBacklog

    waiting = []  # after each push: the frames in the backlog, the newest last
    push = FrameBacklog.push

    def counted(self, frame):
        dropped = push(self, frame)
        waiting.append(len(self))
        return dropped

    monkeypatch.setattr(FrameBacklog, "push", counted)
    with ServerThread(ServeOptions(demo_model_dir, port=0, max_backlog=2, max_ahead_s=None),
                      model=demo_model) as srv:
        burst = opus_pages(speech(16.0))  # 200 frames sent at once: far faster than real time
        r = chat(srv, burst, pace=None, tail_s=3)
        assert not r.errors
        assert wait_until(lambda: len(srv.history()) == 1)
        s = srv.history()[0]
        assert s["dropped"] > 0
        assert s["frames"] + s["dropped"] == s["received"] == len(opus_round_trip(burst)) // FRAME
        assert r.answer_samples == s["frames"] * FRAME
        # a frame never waits behind more than the bound (2, beside the one the next tick
        # takes): its wait stays a few ticks, counted in frames, not in a busy machine's ms
        assert len(waiting) == s["received"] and max(waiting) <= 2 + 1
        assert 0 <= s["wait_p99_ms"] <= s["frame_max_ms"]  # a wait is part of its frame's time
        async def metrics():
            async with aiohttp.ClientSession() as http:
                return await (await http.get(srv.url + "metrics")).text()
        text = asyncio.run(metrics())
        assert f"personaplex_dropped_frames_total {float(s['dropped'])}" in text


def test_a_client_streaming_far_ahead_of_the_clock_is_ended(demo_model, demo_model_dir, pages):
    """Audio pushed far faster than real time (30 s of it at once) would take the other
    sessions' CPU in Opus decoding: past 10 s ahead of the clock the session ends with ERROR
    and 1008; a burst within the allowance (4 s at once) is served."""
    with ServerThread(ServeOptions(demo_model_dir, port=0,
                                   sampling=SamplingParams(greedy=True)), model=demo_model) as srv:
        flood = chat(srv, opus_pages(speech(30.0)), pace=None, tail_s=5)
        burst = chat(srv, pages, pace=None, until_frames=10, tail_s=10)
    assert len(flood.errors) == 1 and "faster than real time" in flood.errors[0]
    assert flood.close_code == 1008
    assert flood.answer_samples < 20 * 12.5 * FRAME  # cut well before its 30 s
    assert not burst.errors and burst.kinds[0] == 0 and burst.answer_samples > 0


def test_one_message_of_many_seconds_is_decoded_whole(greedy_server):
    """A valid Ogg/Opus message holding 12 s (under the 1 MiB bound) is decoded whole, every
    page of it, never refused as 'not Ogg/Opus'."""
    blob = b"".join(opus_pages(speech(12.0)))
    n = len(opus_round_trip([blob])) // FRAME
    r = chat(greedy_server, [blob], pace=None, until_frames=n, tail_s=15)
    assert not r.errors and r.answer_samples == n * FRAME and n >= 140


def test_a_client_that_leaves_during_its_prefill_frees_its_slot_at_once(
        demo_model, demo_model_dir, monkeypatch):
    """The slot of a client gone mid-prefill is free while that prefill still runs (held here
    until the test lets it end), not when it ends; the conversation it would have had is closed
    when that prefill ends."""
    import threading

    from personaplex_edge.runtime.serve import lifecycle

    opened = lifecycle._open_conversation
    prefilling, release = threading.Event(), threading.Event()

    def held_open(state, params):
        prefilling.set()
        release.wait(120)
        return opened(state, params)

    monkeypatch.setattr(lifecycle, "_open_conversation", held_open)
    with ServerThread(ServeOptions(demo_model_dir, port=0, max_sessions=1),
                      model=demo_model) as srv:
        async def scene():
            async with aiohttp.ClientSession() as http:
                ws = await http.ws_connect(srv.url.replace("http", "ws") + "api/chat")
                assert await until(prefilling.is_set), "the prefill never started"
                assert srv.state.slots_used == 1
                await ws.close()
                return await until(lambda: srv.state.slots_used == 0)

        try:
            freed = asyncio.run(scene())
        finally:
            release.set()  # the prefill ends only now
        assert freed, "the slot waited for the prefill"
        assert wait_until(lambda: demo_model.open_conversations == 0, timeout=60)


def test_a_long_text_prompt_reaches_the_server(greedy_server):
    """A text_prompt of 3000 characters, percent-encoded past aiohttp's default 8 KiB request
    line: the upgrade happens and the prompt is judged (a handshake, or too long for the context
    or said in ERROR), not answered with a bare HTTP 400."""
    from urllib.parse import quote

    query = "?text_prompt=" + quote("é" * 3000)
    assert len(query) > 8192
    r = chat(greedy_server, [], query=query, wait_handshake=False, tail_s=10)
    assert r.status is None
    assert r.kinds[:1] == [0] or (len(r.errors) == 1 and "context" in r.errors[0])


# -- capacity ----------------------------------------------------------------------------------------
async def health(url):
    async with aiohttp.ClientSession() as http:
        r = await http.get(url + "api/health")
        return r.status, await r.json()


def held(pages: list[bytes], release: asyncio.Event):
    """`pages` for `talk`, after empty chunks (nothing sent, one per frame's time) until
    `release` is set: a client that holds its session for as long as the test needs."""
    while not release.is_set():
        yield b""
    yield from pages


def test_one_session_more_than_max_sessions_is_refused_busy(demo_model, demo_model_dir, pages,
                                                           monkeypatch):
    from personaplex_edge.runtime.serve import lifecycle

    # the server's own timers for a peer that does not close (CLOSE_TIMEOUT, LINGER_SECONDS)
    # outlast the waits below: a slot freed within them was freed by the close itself
    monkeypatch.setattr(lifecycle, "CLOSE_TIMEOUT", 300.0)
    monkeypatch.setattr(lifecycle, "LINGER_SECONDS", 300.0)
    with ServerThread(ServeOptions(demo_model_dir, port=0, max_sessions=1),
                      model=demo_model) as srv:
        async def scene():
            release = asyncio.Event()
            holder = asyncio.create_task(talk(srv.url, held(opus_pages(speech(3.0)), release),
                                              tail_s=0.2))
            assert await until(lambda: srv.state.sessions and srv.state.ticker.sessions)
            refused = await talk(srv.url, pages, wait_handshake=False, tail_s=2)
            # refused at once: the one slot still held, not waited for
            holding = not holder.done() and srv.state.slots_used == 1
            full = await health(srv.url)
            release.set()  # the holder says its speech and leaves
            kept = await holder
            freed = await until(lambda: srv.state.slots_used == 0)
            after = await talk(srv.url, pages[:3], pace=None, tail_s=0.3)
            return refused, holding, full, kept, freed, after

        refused, holding, full, kept, freed, after = asyncio.run(scene())
        assert refused.errors == ["busy: 1 of 1 sessions"] and 0 not in refused.kinds
        assert refused.close_code == 1013 and holding
        assert full == (503, {"status": "full", "model": srv.state.model_name, "batch": 1,
                              "sessions": 1, "capacity": 1, "available": 0})
        assert not kept.errors and kept.pieces > 0
        assert freed  # the client that left freed its slot at once, by its close
        assert after.kinds[:1] == [0] and not after.errors
        assert wait_until(lambda: asyncio.run(health(srv.url))[0] == 200)
        text = srv.state.stats.text().decode()
        assert 'personaplex_sessions_refused_total{reason="busy"} 1.0' in text


# -- token, TLS ----------------------------------------------------------------------------------
def test_auth_token(demo_model, demo_model_dir, pages):
    with ServerThread(ServeOptions(demo_model_dir, port=0, auth_token="s3cret"),
                      model=demo_model) as srv:
        async def scene():
            return [await talk(srv.url, pages[:2], **kw, pace=None, tail_s=0.2) for kw in (
                {}, {"query": "?token=guess"}, {"headers": {"Authorization": "Bearer guess"}},
                {"query": "?token=s3cret"}, {"headers": {"Authorization": "Bearer s3cret"}})]

        none, wrong_q, wrong_h, right_q, right_h = asyncio.run(scene())
        assert none.status == wrong_q.status == wrong_h.status == 401
        assert right_q.kinds[:1] == [0] and right_h.kinds[:1] == [0]
        assert asyncio.run(health(srv.url))[0] == 200  # probes need no token

        async def page_and_metrics():
            async with aiohttp.ClientSession() as http:
                index = await http.get(srv.url)
                return index.status, await (await http.get(srv.url + "metrics")).text()
        status, text = asyncio.run(page_and_metrics())
        assert status == 200
        assert 'personaplex_sessions_refused_total{reason="unauthorized"} 3.0' in text
        assert "personaplex_sessions_opened_total 2.0" in text


def test_ssl_serves_wss(demo_model, demo_model_dir, pages, tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(tmp_path / "cert.pem")], check=True, capture_output=True)
    with ServerThread(ServeOptions(demo_model_dir, port=0, ssl_dir=tmp_path),
                      model=demo_model) as srv:
        assert srv.url.startswith("https://")
        r = chat(srv, pages[:3], pace=None, tail_s=0.5)
        assert r.kinds[:1] == [0] and not r.errors


def test_ssl_dir_without_its_files_is_a_clear_error(demo_model, demo_model_dir, tmp_path):
    from personaplex_edge.errors import PersonaPlexError

    with pytest.raises(PersonaPlexError, match="cert.pem and key.pem missing.*openssl req"):
        with ServerThread(ServeOptions(demo_model_dir, port=0, ssl_dir=tmp_path), model=demo_model):
            pass


# -- persona errors and the plain routes -----------------------------------------------------------
def test_a_bad_persona_ends_its_session_with_the_reason(greedy_server, pages):
    async def scene():
        return [await talk(greedy_server.url, pages[:2], query=q, wait_handshake=False,
                           pace=None, tail_s=3) for q in (
            "?voice_prompt=../../etc/passwd", "?voice_prompt=NATF9", "?text_topk=many",
            "?text_prompt=" + "hello%20there%20" * 100)]

    path, unknown, topk, long_prompt = asyncio.run(scene())
    assert path.errors == ["query parameter voice_prompt: '../../etc/passwd' is not a voice "
                           "name (a name from /api/voices, not a path)"]
    assert unknown.errors == ["query parameter voice_prompt: no voice 'NATF9'; available: "
                              + ", ".join(DEMO_VOICES)]
    assert topk.errors == ["query parameter text_topk: 'many' is not a whole number"]
    assert len(long_prompt.errors) == 1 and "more than this model's context" in \
        long_prompt.errors[0]
    for r in (path, unknown, topk, long_prompt):
        assert 0 not in r.kinds and r.close_code == 1008


def test_voices_health_and_metrics(greedy_server):
    async def scene():
        async with aiohttp.ClientSession() as http:
            voices = await (await http.get(greedy_server.url + "api/voices")).json()
            status, h = await health(greedy_server.url)
            m = await http.get(greedy_server.url + "metrics")
            index = await http.get(greedy_server.url)
            js = await http.get(greedy_server.url + "static/app.js")
            return voices, status, h, m.headers["Content-Type"], await m.text(), \
                await index.text(), js.status
    voices, status, h, ctype, text, index, js = asyncio.run(scene())
    from personaplex_edge.runtime.persona import DEFAULT_TEXT_PROMPT

    assert voices == {"voices": DEMO_VOICES, "default_voice": "NATF2",
                      "default_text_prompt": DEFAULT_TEXT_PROMPT, "persona": True}
    assert status == 200 and h["status"] == "ok" and h["capacity"] == 8
    assert ctype.startswith("text/plain")
    for name in ("personaplex_sessions_opened_total", "personaplex_sessions_open",
                 "personaplex_frames_total", "personaplex_dropped_frames_total",
                 'personaplex_frame_stage_seconds_bucket{le="0.08",stage="temporal"}',
                 'personaplex_sessions_refused_total', "personaplex_prefill_seconds_count"):
        assert name in text, name
    assert re.search(r"personaplex_frames_total (\d+)", text).group(1) != "0"
    assert "<title>personaplex-edge</title>" in index and js == 200


# -- a batch-B model: sessions share lockstep ticks ---------------------------------------------
def test_a_batch_model_steps_its_sessions_in_lockstep(tmp_path_factory, pages):
    """On a model exported with --batch 2, three sessions at once (two share one lockstep
    group, the third opens a second): ticks step several sessions in one call, and each
    session's greedy text is still exactly that of `run` on the same model."""
    from personaplex_edge.config import preset
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    ckpt = write_synthetic_checkpoint(preset("demo"), tmp_path_factory.mktemp("ckpt_b2"))
    model_dir = tmp_path_factory.mktemp("demo_b2") / "model"
    export_model(resolve_checkpoint(str(ckpt)), model_dir, batch=2, progress=lambda s: None)
    expected = reference_text(model_dir, opus_round_trip(pages), tmp_path_factory.mktemp("r"),
                              "--greedy")
    n = len(opus_round_trip(pages)) // FRAME
    with ServerThread(ServeOptions(model_dir, port=0, **EXACT)) as srv:
        assert srv.server.model.batch == 2

        async def scene():
            # all three stream at once, as fast as they can, once all are ready: frames wait in
            # every backlog together, so a tick finds both rows of the first group ready
            # whatever this machine's speed (nothing is dropped: EXACT's backlog is unbounded)
            start = asyncio.Barrier(3)
            return await asyncio.gather(*(talk(srv.url, pages, pace=None, until_frames=n,
                                               tail_s=20, start=start) for _ in range(3)))

        results = asyncio.run(scene())
        assert wait_until(lambda: len(srv.history()) == 3)
        text = srv.state.stats.text().decode()
    for r in results:
        assert not r.errors and r.answer_samples == n * FRAME
        assert r.text == expected and r.text != reference  # not the default voice's answer
    ticks = float(re.search(r"personaplex_tick_sessions_count (\S+)", text).group(1))
    single = float(re.search(r'personaplex_tick_sessions_bucket\{le="1.0"\} (\S+)',
                             text).group(1))
    # with every backlog full, ticks step the sessions together (here 51 ticks for 150 frames,
    # one of them a single session's); a server that stepped each session alone fails this
    assert single <= ticks / 2
