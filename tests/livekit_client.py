"""LiveKit Agents' OpenAI realtime model against `personaplex-edge serve`, without a LiveKit
server or room: `openai.realtime.RealtimeModel(base_url=...)`, one `session()`, its
instructions set as an AgentSession sets them (`update_instructions`, a second session.update
right after the first), speech pushed as 20 ms `rtc.AudioFrame`s at real-time pace, and what
the session emits collected: each generation's audio frames and text, the errors, and the raw
server events it received. Run by tests/test_serve_livekit.py with the python of a venv that
holds livekit-agents (not this project's):

    python tests/livekit_client.py http://127.0.0.1:PORT/v1 speech.pcm SECONDS [VOICE|-] [deaf]

VOICE `-` leaves the model at LiveKit's defaults (its voice, its server turn detection, the
user's transcription asked for); a voice name sets it with turn_detection=None. `deaf` asks for
no transcription. It prints one JSON line, the user's transcripts the session emitted in it.
"""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
from client_wait import until_quiet
from livekit import rtc
from livekit.plugins import openai

RATE = 24000
FRAME_SAMPLES = RATE // 50  # 20 ms, as a LiveKit room track delivers them
INSTRUCTIONS = "You enjoy having a good conversation."


async def main(base_url: str, speech: bytes, seconds: float, voice: str,
               deaf: bool = False) -> dict:
    seen = {"generations": 0, "audio_frames": 0, "audio_samples": 0, "rates": [], "text": "",
            "errors": [], "server_events": [], "sessions": [], "server_errors": [],
            "heard": []}
    readers: list[asyncio.Task] = []

    async def read_message(message) -> None:
        async def audio() -> None:
            async for frame in message.audio_stream:
                seen["audio_frames"] += 1
                seen["audio_samples"] += frame.samples_per_channel
                seen["rates"] = sorted(set(seen["rates"]) | {frame.sample_rate})

        async def text() -> None:
            async for piece in message.text_stream:
                seen["text"] += piece
        await asyncio.gather(audio(), text())

    async def read_generation(generation) -> None:
        async for message in generation.message_stream:
            readers.append(asyncio.create_task(read_message(message)))

    def on_generation(generation) -> None:
        seen["generations"] += 1
        readers.append(asyncio.create_task(read_generation(generation)))

    def on_server_event(event: dict) -> None:
        seen["server_events"].append(event["type"])
        if event["type"] in ("session.created", "session.updated"):
            audio = event["session"]["audio"]
            seen["sessions"].append({"type": event["type"],
                                     "voice": audio["output"]["voice"],
                                     "instructions": event["session"]["instructions"]})
        elif event["type"] == "error":
            seen["server_errors"].append(event["error"])

    async with aiohttp.ClientSession() as http:
        options = {} if voice == "-" else {"voice": voice, "turn_detection": None}
        if deaf:
            options["input_audio_transcription"] = None
        model = openai.realtime.RealtimeModel(base_url=base_url, api_key="local",
                                              model="personaplex", http_session=http,
                                              **options)
        session = model.session()
        session.on("generation_created", on_generation)
        session.on("error", lambda e: seen["errors"].append(repr(e.error)))
        session.on("input_audio_transcription_completed", lambda e: seen["heard"].append(
            {"item": e.item_id, "transcript": e.transcript, "final": e.is_final}))
        session.on("openai_server_event_received", on_server_event)
        await session.update_instructions(INSTRUCTIONS)

        loop = asyncio.get_running_loop()
        t0, step = loop.time(), 2 * FRAME_SAMPLES
        for i in range(int(seconds * 50)):
            at = (i * step) % (len(speech) - step + 1)
            session.push_audio(rtc.AudioFrame(speech[at:at + step], RATE, 1, FRAME_SAMPLES))
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - loop.time()))
        await until_quiet(lambda: seen["audio_frames"])  # the last answers
        await session.aclose()
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return seen


if __name__ == "__main__":
    url, path, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    voice = sys.argv[4] if len(sys.argv) > 4 else "-"
    deaf = len(sys.argv) > 5 and sys.argv[5] == "deaf"
    with open(path, "rb") as f:
        print(json.dumps(asyncio.run(main(url, f.read(), seconds, voice, deaf))))
