"""A Python app's call to an OpenAI-Realtime WebRTC endpoint, written as aiortc's users write
one: RTCPeerConnection with aiortc's defaults (its ICE gathering, its STUN server), the
microphone a MediaPlayer on a wav, the `oai-events` channel, the offer POSTed as
application/sdp. It imports aiortc and aiohttp only, nothing of personaplex-edge.

    python aiortc_call.py URL WAV SECONDS OUT.json

Waits for the call to connect and the first answer audio, talks for SECONDS more, hangs up
(closes the peer connection) and writes what it saw to OUT.json. Its key: $OPENAI_API_KEY.
"""

import asyncio
import json
import os
import sys
import time

import aiohttp
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer


async def main(url: str, wav: str, seconds: float) -> dict:
    pc = RTCPeerConnection()
    pc.addTrack(MediaPlayer(wav, loop=True).audio)
    events, heard = [], {"samples": 0, "energy": 0.0}
    channel = pc.createDataChannel("oai-events")
    channel.on("message", lambda message: events.append(json.loads(message)))
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
        headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
                   "Content-Type": "application/sdp"}
        async with http.post(f"{url}/v1/realtime/calls?model=gpt-realtime",
                             data=pc.localDescription.sdp, headers=headers) as r:
            status, answer = r.status, await r.text()
    out = {"status": status, "offer": pc.localDescription.sdp}
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
    return {**out, "answer": answer, "heard": heard, "events": events}


if __name__ == "__main__":
    result = asyncio.run(main(sys.argv[1].rstrip("/"), sys.argv[2], float(sys.argv[3])))
    with open(sys.argv[4], "w") as f:
        json.dump(result, f)
