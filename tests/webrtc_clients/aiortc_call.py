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

import aiohttp
from aiortc import RTCPeerConnection
from aiortc.contrib.media import MediaPlayer
from listening import converse, hear


async def main(url: str, wav: str, seconds: float) -> dict:
    pc = RTCPeerConnection()
    pc.addTrack(MediaPlayer(wav, loop=True).audio)
    events = []
    channel = pc.createDataChannel("oai-events")
    channel.on("message", lambda message: events.append(json.loads(message)))
    heard, answering, ended = hear(pc)

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
    out.update(await converse(pc, answer, answering, ended, seconds))
    return {**out, "answer": answer, "heard": heard, "events": events}


if __name__ == "__main__":
    result = asyncio.run(main(sys.argv[1].rstrip("/"), sys.argv[2], float(sys.argv[3])))
    with open(sys.argv[4], "w") as f:
        json.dump(result, f)
