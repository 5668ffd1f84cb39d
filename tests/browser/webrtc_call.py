"""A browser's WebRTC call to `serve`, as OpenAI's browser quick-start makes it: headless
chromium with a fake microphone playing the bundled speech runs QUICKSTART (RTCPeerConnection,
addTrack of the microphone, createDataChannel('oai-events'), the offer's SDP POSTed with an
ephemeral key as Bearer, setRemoteDescription of the answer), then reads what it heard from the
peer connection's own stats and the events from the channel. The ephemeral key is made the way
an app's backend makes it (POST /v1/realtime/client_secrets with the server's token).

    python tests/browser/webrtc_call.py MODEL_DIR OUT_DIR [SECONDS] [quickstart|sdk|page]

`sdk`: OpenAI's Agents SDK for the browser (@openai/agents-realtime) instead, its WebRTC
transport; `page`: the server's own page (/), its transport set to WebRTC: the page's call.js.

Run by test_serve_browser.py, inside a network namespace of its own where it can (only a
loopback there: the call cannot leave this machine). Writes OUT_DIR/result.json and the frames
the model heard, OUT_DIR/heard.npy.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent / "benchmarks")]

import aiohttp  # noqa: E402
import numpy as np  # noqa: E402
from bench_serve import HELLO, ServerThread, wait_until  # noqa: E402
from browser.cdp import Chromium  # noqa: E402
from call_tap import ModelInput  # noqa: E402

from personaplex_edge.runtime.sampling import SamplingParams  # noqa: E402
from personaplex_edge.runtime.serve import ServeOptions  # noqa: E402

TOKEN = "the-servers-own-token"
# @openai/agents-realtime's browser bundle, where scripts/install.sh put it (npm)
AGENTS_BUNDLE = Path(os.environ.get("PERSONAPLEX_AGENTS_REALTIME", HERE.parent.parent / ".venv"
                                    / "npm" / "node_modules" / "@openai" / "agents-realtime"
                                    / "dist" / "bundle" / "openai-realtime-agents.umd.js"))
# chromium leaves loopback out of WebRTC's networks unless told; the call runs on loopback
FLAGS = ["--allow-loopback-in-peer-connection"]

# OpenAI's documented browser flow ("Connect with WebRTC", GA), as a page runs it
QUICKSTART = """
window.rtc = {events: [], status: null, location: null, streams: null, error: null};
(async () => {
  const EPHEMERAL_KEY = %(key)s;
  const pc = new RTCPeerConnection();
  const audioElement = document.createElement("audio");
  audioElement.autoplay = true;
  pc.ontrack = (e) => { audioElement.srcObject = e.streams[0]; rtc.streams = e.streams.length; };
  const ms = await navigator.mediaDevices.getUserMedia({ audio: true });
  pc.addTrack(ms.getTracks()[0]);
  const dc = pc.createDataChannel("oai-events");
  dc.addEventListener("message", (e) => rtc.events.push(JSON.parse(e.data)));
  const offer = await pc.createOffer();
  await pc.setLocalDescription(offer);
  const baseUrl = %(base)s;
  const model = "gpt-realtime";
  const sdpResponse = await fetch(`${baseUrl}?model=${model}`, {
    method: "POST",
    body: offer.sdp,
    headers: { Authorization: `Bearer ${EPHEMERAL_KEY}`, "Content-Type": "application/sdp" },
  });
  rtc.status = sdpResponse.status;
  rtc.location = sdpResponse.headers.get("Location");
  const answer = { type: "answer", sdp: await sdpResponse.text() };
  await pc.setRemoteDescription(answer);
  rtc.pc = pc;
})().catch((e) => { window.rtc.error = String(e); });
"""

# OpenAI's Agents SDK for the browser (@openai/agents-realtime, its UMD bundle loaded into the
# page), its WebRTC transport as its documentation sets it up
AGENTS_SDK = """
window.rtc = {events: [], status: null, error: null, errors: [], connected: false, callId: null};
(async () => {
  const { RealtimeAgent, RealtimeSession, OpenAIRealtimeWebRTC } = OpenAIAgentsRealtime;
  const agent = new RealtimeAgent({ name: "Assistant", instructions: "Be brief." });
  const transport = new OpenAIRealtimeWebRTC({ baseUrl: %(base)s });
  const session = new RealtimeSession(agent, {
    transport, model: "gpt-realtime",
    config: { audio: { output: { voice: "NATM1" } } },
  });
  session.on("transport_event", (e) => rtc.events.push(e));
  // what the SDK hands its app as errors, kept whole to be told apart
  session.on("error", (e) => rtc.errors.push(JSON.parse(JSON.stringify(e))));
  await session.connect({ apiKey: %(key)s });
  rtc.connected = true;
  rtc.callId = transport.callId;
  rtc.pc = transport.connectionState.peerConnection;
})().catch((e) => { window.rtc.error = String(e); });
"""

# what the peer connection itself says it received
HEARD = """
(async () => {
  const out = {};
  (await rtc.pc.getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") {
      Object.assign(out, {packets: s.packetsReceived, samples: s.totalSamplesReceived,
                          energy: s.totalAudioEnergy, concealed: s.concealedSamples,
                          lost: s.packetsLost});
    }
    if (s.type === "candidate-pair" && s.state === "succeeded") out.pair = true;
  });
  out.connection = rtc.pc.connectionState;
  return out;
})()
"""


async def scene(srv, seconds: float, code: str = QUICKSTART) -> dict:
    async with aiohttp.ClientSession() as http:  # the app's backend
        async with http.post(srv.url + "v1/realtime/client_secrets", headers={
                "Authorization": f"Bearer {TOKEN}"}, json={"session": {
                    "type": "realtime", "model": "gpt-realtime",
                    "audio": {"output": {"voice": "NATM1"}}}}) as r:
            key = (await r.json())["value"]
    async with Chromium(fake_audio=HELLO, flags=FLAGS) as browser:
        page = await browser.page()
        await page.goto(srv.url)
        if code is AGENTS_SDK:  # the SDK's bundle first, as a page's script tag loads it
            await page.evaluate(AGENTS_BUNDLE.read_text() + "\n;0")
        await page.evaluate(code % {"key": json.dumps(key),
                                    "base": json.dumps(srv.url + "v1/realtime/calls")})
        await page.wait_for("window.rtc.error || (window.rtc.pc && "
                            "window.rtc.pc.connectionState === 'connected')", timeout=20)
        # the call talks until the browser has heard `seconds` of the answer (its own stats,
        # 48 kHz), however long a busy machine takes to get there; the test judges what it heard
        try:
            await page.wait_for(f"window.rtc.error || ({HEARD}).then((h) => h.samples >= "
                                f"{seconds} * 48000)", timeout=seconds + 60)
        except TimeoutError:
            pass
        heard = await page.evaluate(HEARD)
        personas = [[s.params.persona.voice, s.params.persona.text_prompt]
                    for s in list(srv.state.sessions) if s.params]
        rtc = await page.evaluate("({events: rtc.events, status: rtc.status, location: "
                                  "rtc.location, streams: rtc.streams, error: rtc.error, "
                                  "errors: rtc.errors, connected: rtc.connected, "
                                  "callId: rtc.callId})")
        await page.evaluate("rtc.pc.close()")  # hang up, as a page does
        t0 = time.monotonic()
        wait_until(lambda: srv.state.slots_used == 0, 60)
        freed = time.monotonic() - t0
        return {"heard": heard, "personas": personas, "freed_s": freed,
                "console": page.console[-20:], **rtc}


async def page_scene(srv, seconds: float) -> dict:
    """The page's Talk over WebRTC, with a voice picked in its selector."""
    async with Chromium(fake_audio=HELLO, flags=FLAGS) as browser:
        page = await browser.page()
        await page.goto(srv.url + f"?token={TOKEN}")
        await page.wait_for("document.getElementById('voice').options.length > 0")
        await page.evaluate("document.getElementById('voice').value = 'NATM1';"
                            "document.getElementById('transport').value = 'webrtc';"
                            "document.getElementById('connect').click()")
        await page.wait_for("window.personaplex.error || window.personaplex.handshake",
                            timeout=20)
        await page.wait_for(f"window.personaplex.error || window.personaplex.samplesAnswered "
                            f">= {seconds} * 24000", timeout=seconds + 20)
        voices = [s.params.persona.voice for s in list(srv.state.sessions) if s.params]
        both = await page.evaluate("({state: window.personaplex, shown: "
                                   "document.getElementById('text').textContent})")
        await page.evaluate("document.getElementById('connect').click()")  # Stop
        t0 = time.monotonic()
        wait_until(lambda: srv.state.slots_used == 0, 60)
        return {"page": both["state"], "shown": both["shown"], "voices": voices,
                "freed_s": time.monotonic() - t0, "console": page.console[-20:]}


def main() -> int:
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 6.0
    mode = sys.argv[4] if len(sys.argv) > 4 else "quickstart"
    run = {"page": page_scene, "quickstart": scene,
           "sdk": lambda srv, seconds: scene(srv, seconds, AGENTS_SDK)}[mode]
    out.mkdir(parents=True, exist_ok=True)
    options = ServeOptions(model_dir, port=0, auth_token=TOKEN,
                           sampling=SamplingParams(greedy=True), max_backlog=100_000)
    with ServerThread(options) as srv:
        tap = ModelInput(srv)
        result = asyncio.run(run(srv, seconds))
        result["summary"] = srv.history()[-1] if srv.history() else None
        result["slots_used"] = srv.state.slots_used
        frames = next(iter(tap.frames.values()), [])
        np.save(out / "heard.npy", np.concatenate(frames) if frames else np.zeros(0, np.float32))
    (out / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
