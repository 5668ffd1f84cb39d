"""The web page in a real browser: Debian's chromium, headless, with a fake microphone playing
the bundled speech. The page fills its voice selector from /api/voices, asks for the microphone
(echo cancellation and noise suppression on), encodes Opus with WebCodecs into its own Ogg
pages, gets the handshake, streams, plays the answer, shows the text as it arrives, and shows
the session's latency and drops from the server's metadata.

Without chromium the test is skipped (a failure in CI, which installs it: tests/ci_parts.py).
PERSONAPLEX_SCREENSHOT=PATH keeps a screenshot of the page mid-conversation there
(docs/serve.png, on the README and the serve page)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from bench_serve import HELLO, ServerThread  # noqa: E402
from browser.cdp import Chromium, find_chromium  # noqa: E402

from personaplex_edge.runtime.persona import DEFAULT_TEXT_PROMPT  # noqa: E402
from personaplex_edge.runtime.serve import ServeOptions  # noqa: E402

if find_chromium() is None:
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)


def test_the_page_talks_with_the_server(demo_model_dir, tmp_path):
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
                await page.wait_for("window.personaplex.handshake", timeout=20)
                # several seconds of conversation: 5 s of answers played
                await page.wait_for("window.personaplex.samplesAnswered >= 5 * 24000 && "
                                    "window.personaplex.dropped !== null && "
                                    "window.personaplex.latencyMs !== null", timeout=30)
                await asyncio.sleep(0.6)  # a figure refresh
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
                t0 = time.monotonic()
                while srv.state.slots_used and time.monotonic() - t0 < 3:
                    await asyncio.sleep(0.02)
                freed = time.monotonic() - t0
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
    # Stop closes the session at once
    assert freed < 2.0 and history and history[-1]["frames"] >= 60
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
