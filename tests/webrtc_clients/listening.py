"""What both Python clients do once their offer is made, as an aiortc app does it (aiortc and
numpy only, nothing of personaplex-edge): count the answer's audio as it arrives, take the SDP
answer, wait for the first answer audio (or the call's end), talk for a while, hang up."""

import asyncio
import time

import numpy as np
from aiortc import RTCSessionDescription


def hear(pc) -> tuple[dict, asyncio.Event, asyncio.Event]:
    """Listens on `pc`'s incoming track: ({samples, energy} heard so far, set at the first
    answer audio, set when the connection fails or closes)."""
    heard = {"samples": 0, "energy": 0.0}
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

    return heard, answering, ended


async def converse(pc, answer: str, answering: asyncio.Event, ended: asyncio.Event,
                   seconds: float) -> dict:
    """Takes the SDP `answer`, waits (up to 60 s) for the first answer audio or the end, talks
    for `seconds` more and hangs up: {connected_s (None: no audio came), state}."""
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    t0 = time.monotonic()
    waits = [asyncio.ensure_future(answering.wait()), asyncio.ensure_future(ended.wait())]
    await asyncio.wait(waits, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    out = {"connected_s": time.monotonic() - t0 if answering.is_set() else None,
           "state": pc.connectionState}
    if answering.is_set():
        await asyncio.sleep(seconds)  # the conversation
    await pc.close()
    return out
