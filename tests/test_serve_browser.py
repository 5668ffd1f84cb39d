"""The web page in a real browser: Debian's chromium, headless, with a fake microphone playing
the bundled speech. The page fills its voice selector from /api/voices, asks for the microphone
(echo cancellation and noise suppression on), encodes Opus with WebCodecs into its own Ogg
pages, gets the handshake, streams, plays the answer, shows the text as it arrives, and shows
the session's latency and drops from the server's metadata. And OpenAI's browser quick-start
code calls the server over WebRTC (tests/browser/webrtc_call.py).

Without chromium the test is skipped (a failure in CI, which installs it: tests/ci_parts.py).
PERSONAPLEX_SCREENSHOT=PATH keeps a screenshot of the page mid-conversation there
(docs/serve.png, on the README and the serve page)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from bench_serve import HELLO, ServerThread, wait_until  # noqa: E402
from browser.cdp import Chromium, find_chromium  # noqa: E402
from own_network import in_own_network  # noqa: E402

from personaplex_edge.runtime.persona import DEFAULT_TEXT_PROMPT  # noqa: E402
from personaplex_edge.runtime.serve import ServeOptions  # noqa: E402

if find_chromium() is None:
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)


def test_the_page_talks_with_the_server(demo_model_dir, tmp_path, monkeypatch):
    from personaplex_edge.runtime.serve import lifecycle

    # the server's own timers for a peer that does not close (CLOSE_TIMEOUT, LINGER_SECONDS)
    # outlast the wait for the slot after Stop: freed within it, it was freed by the close
    monkeypatch.setattr(lifecycle, "CLOSE_TIMEOUT", 300.0)
    monkeypatch.setattr(lifecycle, "LINGER_SECONDS", 300.0)
    shot = Path(os.environ.get("PERSONAPLEX_SCREENSHOT") or tmp_path / "serve.png")
    with ServerThread(ServeOptions(demo_model_dir, model_name="demo", port=0)) as srv:
        async def scene():
            async with Chromium(fake_audio=HELLO) as browser:
                page = await browser.page()
                await page.goto(srv.url)
                await page.wait_for("document.getElementById('voice').options.length > 0")
                voices = await page.evaluate(
                    "[...document.getElementById('voice').options].map(o => o.value)")
                prompt = await page.evaluate("document.getElementById('prompt').value")
                await page.evaluate("document.getElementById('voice').value = 'NATM1'")
                await page.evaluate("document.getElementById('connect').click()")
                await page.wait_for("window.personaplex.handshake", timeout=60)
                # several seconds of conversation: 5 s of answers played
                await page.wait_for("window.personaplex.samplesAnswered >= 5 * 24000 && "
                                    "window.personaplex.dropped !== null && "
                                    "window.personaplex.latencyMs !== null", timeout=60)
                # the figures shown (the page refreshes them every 250 ms of its own)
                await page.wait_for("document.getElementById('latency').textContent"
                                    ".endsWith(' ms') && document.getElementById('dropped')"
                                    ".textContent !== '–'", timeout=60)
                await page.screenshot(shot)
                # the figures and what the page shows, read together: a text piece that
                # arrived between two reads would make them differ
                both = await page.evaluate(
                    "({state: window.personaplex, shown: {"
                    "text: document.getElementById('text').textContent, "
                    "dropped: document.getElementById('dropped').textContent, "
                    "latency: document.getElementById('latency').textContent}})")
                state, shown = both["state"], both["shown"]
                open_sessions = [(s.params.persona.voice, s.frames_answered)
                                 for s in list(srv.state.sessions)]
                await page.evaluate("document.getElementById('connect').click()")  # Stop
                freed = await asyncio.get_running_loop().run_in_executor(
                    None, wait_until, lambda: srv.state.slots_used == 0, 60)
                return voices, prompt, state, shown, open_sessions, freed, page.console

        voices, prompt, state, shown, open_sessions, freed, console = asyncio.run(scene())
        history = srv.history()

    # the demo bank has the published bank's names (PersonaPlex's client asks for NATF0.pt)
    assert len(voices) == 18 and {"NATF0", "NATF2", "NATM1", "VARM4"} <= set(voices)
    assert prompt == DEFAULT_TEXT_PROMPT
    assert state["error"] is None, (state, console)
    # the server decoded the page's Ogg/Opus into frames and answered each
    assert open_sessions and open_sessions[0][0] == "NATM1"  # the selector's voice
    assert open_sessions[0][1] >= 60
    assert state["pagesSent"] > 100 and state["samplesSent"] >= 5 * 24000
    assert state["captureEnergy"] > 0  # the fake microphone's speech, not silence
    # the answer was decoded and played, the text shown as it arrived
    assert state["samplesAnswered"] >= 5 * 24000 and state["answerEnergy"] > 0
    assert state["textPieces"] > 0 and shown["text"] == state["text"] != ""
    # latency and drops on the page, from the server's own count
    assert state["dropped"] == 0 and shown["dropped"] == "0"
    assert 0 < state["latencyMs"] < 1000 and shown["latency"].endswith(" ms")
    assert state["serverFrameP99"] is not None
    # Stop closes the session: its slot freed by the close itself (the timers above out of
    # reach), however long a busy machine takes to get there
    assert freed and history and history[-1]["frames"] >= 60
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# webrtc_call.py run with its server watched: the call's own timer for a peer gone quiet out of
# reach (a slot freed in the scene's wait was freed by the hang-up, not by PEER_GONE_S), and at
# the server's stop OUT/watched.json: how its sessions ended and its calls failed (its own
# counts), and the gap bound its playout clock's loop allows (bench_serve.LoopLag)
WATCHED = """
import json, runpy, sys
from pathlib import Path

scene, out = Path(sys.argv[1]), Path(sys.argv[3])
sys.path[:0] = [str(scene.parent.parent), str(scene.parent.parent.parent / "benchmarks")]
import bench_serve
from personaplex_edge.runtime.serve.webrtc import call, media

call.PEER_GONE_S = 300.0
enter, leave = bench_serve.ServerThread.__enter__, bench_serve.ServerThread.__exit__


def watched_enter(self):
    enter(self)
    self.lag = bench_serve.LoopLag(self.loop, media.MAX_CLOCK_LAG_S).__enter__()
    return self


def watched_exit(self, *exc):
    self.lag.__exit__()
    samples = [s for f in self.state.stats.registry.collect() for s in f.samples]

    def counts(name, label):
        return {s.labels[label]: s.value for s in samples if s.name == name and s.value}

    (out / "watched.json").write_text(json.dumps({
        "ended": counts("personaplex_sessions_ended_total", "cause"),
        "failed": counts("personaplex_webrtc_calls_failed_total", "reason"),
        "lag_ms": self.lag.max_ms,
        "clock_gap_bound_ms": self.lag.bound_ms(bench_serve.FRAME_S, media.PACKET_S)}))
    return leave(self, *exc)


bench_serve.ServerThread.__enter__, bench_serve.ServerThread.__exit__ = watched_enter, watched_exit
sys.argv = sys.argv[1:]
runpy.run_path(str(scene), run_name="__main__")
"""


def _webrtc_scene(model_dir, tmp_path, *args: str, watched: bool = False) -> dict:
    """tests/browser/webrtc_call.py (a server and Chromium) in a network of its own holding
    only a loopback (own_network.py): its result.json (`watched`: run as WATCHED says, its
    watched.json as "watched")."""
    scene = Path(__file__).parent / "browser" / "webrtc_call.py"
    out = tmp_path / "scene"
    python = [sys.executable, "-c", WATCHED] if watched else [sys.executable]
    done = subprocess.run(in_own_network([*python, str(scene), str(model_dir), str(out), *args]),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    if watched:
        result["watched"] = json.loads((out / "watched.json").read_text())
    return result


def _hung_up(r: dict) -> bool:
    """The call's slot was freed by its hang-up: free when the scene's wait ended, the session
    ended as a client's leaving does, and no call failed (the peer-gone timer out of reach, the
    connection's consent check not the cause)."""
    return r["slots_used"] == 0 and r["watched"]["ended"] == {"client": 1.0} and \
        not r["watched"]["failed"]


def test_openai_browser_quickstart_calls_the_server(demo_model_dir, tmp_path):
    """OpenAI's documented browser flow (tests/browser/webrtc_call.py) against `serve`: an
    ephemeral key from client_secrets, the microphone's track and the `oai-events` channel
    offered, the SDP posted with the key as Bearer: the browser's own stats say it heard the
    answer; the channel's events are what the openai SDK's types accept; the transcript is
    `run --greedy`'s (with the key's voice) on the frames the model heard; closing the peer
    connection frees the slot (the hang-up itself, not a timer)."""
    pytest.importorskip("aiortc", reason="the webrtc extra (scripts/install.sh installs it)")
    from call_tap import prefix_matches, run_pieces
    from openai.types.realtime import RealtimeServerEvent
    from pydantic import TypeAdapter

    r = _webrtc_scene(demo_model_dir, tmp_path, "6", watched=True)
    assert r["error"] is None and r["status"] == 201, r
    assert r["location"].startswith("/v1/realtime/calls/rtc_") and r["streams"] == 1
    heard = r["heard"]
    assert heard["pair"] and heard["packets"] > 150  # 20 ms packets: over 3 s of answer
    assert heard["samples"] >= 3 * 48000 and heard["energy"] > 0
    adapter = TypeAdapter(RealtimeServerEvent)
    for event in r["events"]:
        adapter.validate_python(event)
    kinds = [e["type"] for e in r["events"]]
    assert kinds[0] == "session.created" and "response.created" in kinds
    assert "error" not in kinds and not [k for k in kinds if "audio.delta" in k]
    assert r["events"][0]["session"]["audio"]["output"]["voice"] == "NATM1"  # the key's
    transcript = "".join(e["delta"] for e in r["events"]
                         if e["type"] == "response.output_audio_transcript.delta")
    pieces, _ = run_pieces(demo_model_dir, np.load(tmp_path / "scene" / "heard.npy"),
                           tmp_path / "run", "--greedy", "--voice-prompt", "NATM1")
    assert len(transcript) > 5
    # the browser's stats were read a moment before the hang-up: the transcript runs at least
    # that far (less the server's packets still in flight)
    at_least = min(len(pieces), heard["samples"] // 2 // 1920 - 5)
    assert prefix_matches(transcript, pieces, at_least) is not None, (transcript, "".join(pieces))
    summary = r["summary"]
    assert summary["protocol"] == "webrtc" and summary["lost"] == 0
    # the model's clock: a frame per 80 ms, late by no more than its event loop was held (a
    # busy machine's hold-ups, measured beside the call: bench_serve.LoopLag)
    assert 0 < summary["clock_gap_max_ms"] <= r["watched"]["clock_gap_bound_ms"], r["watched"]
    assert _hung_up(r), (r["slots_used"], r["watched"], r["freed_s"])


def test_openai_agents_sdk_calls_the_server_over_webrtc(tmp_path):
    """OpenAI's Agents SDK for the browser (@openai/agents-realtime's WebRTC transport) as its
    documentation sets it up, with an ek_ key, against the built-in demo: it connects (it
    waits for session.updated after its own session.update), takes the call's id from
    Location, its agent's instructions and voice are the call's persona, the user's
    transcription its default session asks for is given (the demo has a transcriber): no
    error event reaches the app, and the browser hears the answer."""
    pytest.importorskip("aiortc", reason="the webrtc extra (scripts/install.sh installs it)")
    sys.path.insert(0, str(Path(__file__).parent / "browser"))
    from conftest_stt import builtin_demo_dir
    from webrtc_call import AGENTS_BUNDLE

    if not AGENTS_BUNDLE.is_file():
        pytest.skip(f"@openai/agents-realtime is not installed ({AGENTS_BUNDLE}): "
                    "scripts/install.sh installs it where npm is")
    r = _webrtc_scene(builtin_demo_dir(), tmp_path, "4", "sdk")
    assert r["error"] is None and r["connected"], r
    assert r["callId"].startswith("rtc_")
    kinds = [e.get("type") for e in r["events"]]
    assert "error" not in kinds and r["errors"] == [], r["errors"]
    assert "session.updated" in kinds and "response.created" in kinds
    updated = [e for e in r["events"] if e.get("type") == "session.updated"][-1]["session"]
    assert updated["audio"]["input"]["transcription"]["model"]  # the SDK's default, given
    assert "conversation.item.input_audio_transcription.delta" in kinds
    assert updated["instructions"] == "Be brief."
    assert updated["audio"]["output"]["voice"] == "NATM1"
    assert r["personas"] == [["NATM1", "Be brief."]]
    assert r["heard"]["packets"] > 100 and r["heard"]["energy"] > 0
    assert r["freed_s"] < 2.0 and r["slots_used"] == 0


def test_the_page_talks_over_webrtc(demo_model_dir, tmp_path):
    """The page's transport set to WebRTC (call.js): the persona chosen on the page is the
    call's, the answer is heard and its transcript shown, Stop frees the slot."""
    pytest.importorskip("aiortc", reason="the webrtc extra (scripts/install.sh installs it)")
    r = _webrtc_scene(demo_model_dir, tmp_path, "3", "page", watched=True)
    page = r["page"]
    assert page["error"] is None and page["transport"] == "webrtc", r
    assert r["voices"] == ["NATM1"]  # the selector's voice, in the call's session
    assert page["samplesAnswered"] >= 3 * 24000 and page["answerEnergy"] > 0
    assert page["textPieces"] > 0 and r["shown"] == page["text"] != ""
    # the round trip of the call's ICE pair as the browser measured it, in ms: on loopback,
    # under 100 ms and whatever the server's event loop (which answers the checks) was held
    # meanwhile - a busy machine's hold-ups, measured beside the call (bench_serve.LoopLag)
    assert page["latencyMs"] is not None and \
        0 <= page["latencyMs"] < 100 + r["watched"]["lag_ms"], (page, r["watched"])
    assert r["summary"]["protocol"] == "webrtc"
    assert _hung_up(r), (r["slots_used"], r["watched"], r["freed_s"])  # Stop hung up


# OpenAI's browser quick-start up to its POST: what the page reads of the answer to its offer
REFUSED_CALL = """
(async () => {
  const pc = new RTCPeerConnection();
  const ms = await navigator.mediaDevices.getUserMedia({ audio: true });
  pc.addTrack(ms.getTracks()[0]);
  pc.createDataChannel("oai-events");
  const offer = await pc.createOffer();
  await pc.setLocalDescription(offer);
  pc.close();
  try {
    const sdpResponse = await fetch(%(url)s, {
      method: "POST", body: offer.sdp,
      headers: { Authorization: `Bearer ${%(key)s}`, "Content-Type": "application/sdp" },
    });
    return { status: sdpResponse.status, body: await sdpResponse.json() };
  } catch (e) {
    return { failed: String(e) };
  }
})()
"""


def test_a_page_reads_why_its_call_was_refused(demo_model, demo_model_dir):
    """OpenAI's browser quick-start on an app's own origin (allowed by --allowed-origins)
    posting its offer with a key the server refuses - unknown, expired, not the token - or
    while every slot is taken: the page reads the status and OpenAI's JSON error (so it can
    ask its backend for a new key), not just "Failed to fetch". From an origin that is not
    allowed it reads nothing, as the browser means it to."""
    pytest.importorskip("aiortc", reason="the webrtc extra (scripts/install.sh installs it)")
    import aiohttp
    from aiohttp import web

    async def scene():
        async def app_page(request):
            return web.Response(text="<title>app</title>", content_type="text/html")

        app = web.Application()  # the app's own origin, where its page comes from
        app.router.add_get("/", app_page)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        page_origin = f"http://127.0.0.1:{port}"
        loop = asyncio.get_running_loop()
        srv = await loop.run_in_executor(None, ServerThread(ServeOptions(
            demo_model_dir, port=0, max_sessions=1, auth_token="tok",
            allowed_origins=(page_origin,)), model=demo_model).__enter__)
        try:
            async with aiohttp.ClientSession() as http:  # the app's backend
                async with http.post(srv.url + "v1/realtime/client_secrets", json={
                        "expires_after": {"anchor": "created_at", "seconds": 10}},
                        headers={"Authorization": "Bearer tok"}) as r:
                    late = (await r.json())["value"]
            srv.state.client_keys._clock = lambda: time.time() + 11  # ten seconds on
            url = json.dumps(srv.url + "v1/realtime/calls?model=gpt-realtime")
            out = {}
            async with Chromium(fake_audio=HELLO) as browser:
                page = await browser.page()
                await page.goto(page_origin + "/")
                for name, key in (("unknown", "ek_never_issued"), ("expired", late),
                                  ("token", "not-the-token")):
                    out[name] = await page.evaluate(REFUSED_CALL % {"url": url,
                                                                    "key": json.dumps(key)})
                # every slot taken (a WebSocket session holds the one)
                async with aiohttp.ClientSession() as http:
                    async with http.ws_connect(srv.url + "v1/realtime?token=tok") as ws:
                        await ws.receive()  # session.created: the slot is held
                        out["busy"] = await page.evaluate(REFUSED_CALL % {
                            "url": url, "key": json.dumps("tok")})
                await page.goto(f"http://localhost:{port}/")  # an origin not allowed
                out["elsewhere"] = await page.evaluate(REFUSED_CALL % {
                    "url": url, "key": json.dumps("tok")})
            return out
        finally:
            await loop.run_in_executor(None, srv.__exit__, None, None, None)
            await runner.cleanup()

    out = asyncio.run(scene())
    for name in ("unknown", "expired", "token"):
        assert out[name].get("status") == 401, (name, out[name])
        assert out[name]["body"]["error"]["code"] == "invalid_api_key"
    assert "client_secrets" in out["expired"]["body"]["error"]["message"]
    assert out["busy"]["status"] == 429
    assert out["busy"]["body"]["error"]["message"] == "busy: 1 of 1 sessions"
    assert "Failed to fetch" in out["elsewhere"]["failed"]
