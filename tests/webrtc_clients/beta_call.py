"""An app of OpenAI's first (beta) Realtime WebRTC flow, written as its users wrote one: its
backend asks for a session with the openai SDK's beta client (`client.beta.realtime.sessions
.create`, POST /v1/realtime/sessions) and hands the page the `client_secret.value`; the page
(aiortc here, with its defaults) offers its microphone and the `oai-events` channel, POSTs the
SDP to /v1/realtime?model=... with that key as Bearer, sends a beta session.update as the
channel opens and reads the beta's events. It imports aiortc, aiohttp and openai only, nothing
of personaplex-edge.

    python beta_call.py URL WAV SECONDS OUT.json

Waits for the first answer audio, talks for SECONDS more, hangs up (closes the peer
connection) and writes what it saw to OUT.json. The backend's key: $OPENAI_API_KEY.
"""

import asyncio
import json
import os
import sys
import time

import aiohttp
import numpy as np
import openai
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer

MODEL = "gpt-4o-realtime-preview-2024-12-17"


def backend(url: str) -> dict:
    """The app's server: an ephemeral key for the page."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=os.environ["OPENAI_API_KEY"])
    session = client.beta.realtime.sessions.create(
        model=MODEL, voice="NATM1", modalities=["audio", "text"],
        instructions="You enjoy having a good conversation.")
    return session.model_dump()


async def page(url: str, key: str, wav: str, seconds: float) -> dict:
    pc = RTCPeerConnection()
    pc.addTrack(MediaPlayer(wav, loop=True).audio)
    events, heard = [], {"samples": 0, "energy": 0.0}
    dc = pc.createDataChannel("oai-events")
    dc.on("message", lambda message: events.append(json.loads(message)))

    @dc.on("open")
    def on_open() -> None:
        dc.send(json.dumps({"type": "session.update", "session": {
            "instructions": "Be brief.", "input_audio_format": "pcm16"}}))

    answering, ended = asyncio.Event(), asyncio.Event()

    @pc.on("connectionstatechange")
    def on_state() -> None:
        if pc.connectionState in ("failed", "closed"):
            ended.set()

    @pc.on("track")
    def on_track(track) -> None:
        async def listen() -> None:
            while True:
                try:
                    frame = await track.recv()
                except Exception:  # the call ended
                    return
                pcm = frame.to_ndarray().astype(np.float32) / 32768.0
                heard["samples"] += frame.samples
                heard["energy"] += float(np.square(pcm).sum())
                answering.set()
        asyncio.ensure_future(listen())

    await pc.setLocalDescription(await pc.createOffer())
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/realtime?model={MODEL}", data=pc.localDescription.sdp,
                             headers={"Authorization": f"Bearer {key}",
                                      "Content-Type": "application/sdp"}) as r:
            status, answer = r.status, await r.text()
    out = {"status": status}
    if status != 201:
        await pc.close()
        return {**out, "error": answer}
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    t0 = time.monotonic()
    waits = [asyncio.ensure_future(answering.wait()), asyncio.ensure_future(ended.wait())]
    await asyncio.wait(waits, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    out["connected_s"] = time.monotonic() - t0 if answering.is_set() else None
    out["state"] = pc.connectionState
    if answering.is_set():
        await asyncio.sleep(seconds)  # the conversation
    await pc.close()
    return {**out, "heard": heard, "events": events}


if __name__ == "__main__":
    url = sys.argv[1].rstrip("/")
    session = backend(url)
    result = asyncio.run(page(url, session["client_secret"]["value"], sys.argv[2],
                              float(sys.argv[3])))
    with open(sys.argv[4], "w") as f:
        json.dump({"session": session, **result}, f)
