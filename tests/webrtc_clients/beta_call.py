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

import aiohttp
import openai
from aiortc import RTCPeerConnection
from aiortc.contrib.media import MediaPlayer
from listening import converse, hear

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
    events = []
    dc = pc.createDataChannel("oai-events")
    dc.on("message", lambda message: events.append(json.loads(message)))

    @dc.on("open")
    def on_open() -> None:
        dc.send(json.dumps({"type": "session.update", "session": {
            "instructions": "Be brief.", "input_audio_format": "pcm16"}}))

    heard, answering, ended = hear(pc)

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
    out.update(await converse(pc, answer, answering, ended, seconds))
    return {**out, "heard": heard, "events": events}


if __name__ == "__main__":
    url = sys.argv[1].rstrip("/")
    session = backend(url)
    result = asyncio.run(page(url, session["client_secret"]["value"], sys.argv[2],
                              float(sys.argv[3])))
    with open(sys.argv[4], "w") as f:
        json.dump({"session": session, **result}, f)
