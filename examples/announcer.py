"""An announcer: a running `personaplex-edge serve` says what this app decides, in the persona's
voice, while the conversation goes on - the user can keep talking, the model keeps listening.

    personaplex-edge serve --model demo                         # in another terminal
    python examples/announcer.py --after 300 "Your tea is ready."

streams the microphone to the server and plays its answers (pip install sounddevice), and five
minutes in has the model say the words. The pattern for a tool or an LLM - text in, spoken in
the persona's voice, the conversation going on around it - is the same call for each text:

    my_llm_tool | python examples/announcer.py --lines          # says each line of stdin

Without sound devices: --silence sends silence and --save writes what the model said to a wav.
It is an unmodified OpenAI Realtime client (pip install "openai[realtime]"): the words go in as
an assistant message item followed by response.create, and that response is done once they are
said (docs/say.md). Write numbers as words ("twenty past three"): the model reads text the way
its training did, and digits come out wrong more often.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys

import numpy as np

RATE, FRAME = 24000, 1920  # the model's rate, and one 80 ms frame


class Announcer:
    """One /v1/realtime connection: `say(text)` queues words for the model to say."""

    def __init__(self, conn):
        self.conn = conn

    async def say(self, text: str) -> None:
        await self.conn.conversation.item.create(item={
            "type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": text}]})
        await self.conn.response.create()


class Microphone:
    def __init__(self):
        import sounddevice as sd

        self.frames: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.stream = sd.InputStream(
            samplerate=RATE, channels=1, dtype="float32", blocksize=FRAME,
            callback=lambda data, *_: loop.call_soon_threadsafe(self.frames.put_nowait,
                                                               data[:, 0].copy()))
        self.stream.start()

    async def frame(self) -> np.ndarray:
        return await self.frames.get()


class Silence:
    """80 ms of silence every 80 ms, as a microphone in a quiet room would give."""

    def __init__(self):
        self.next = asyncio.get_running_loop().time()

    async def frame(self) -> np.ndarray:
        self.next += FRAME / RATE
        await asyncio.sleep(max(0.0, self.next - asyncio.get_running_loop().time()))
        return np.zeros(FRAME, np.float32)


class Speaker:
    def __init__(self):
        import sounddevice as sd

        self.stream = sd.OutputStream(samplerate=RATE, channels=1, dtype="int16")
        self.stream.start()

    def play(self, pcm16: bytes) -> None:
        self.stream.write(np.frombuffer(pcm16, "<i2"))

    def close(self) -> None:
        self.stream.stop()


class WavFile:
    def __init__(self, path: str):
        self.path, self.parts = path, []

    def play(self, pcm16: bytes) -> None:
        self.parts.append(pcm16)

    def close(self) -> None:
        import soundfile as sf

        sf.write(self.path, np.frombuffer(b"".join(self.parts), "<i2"), RATE)


def pcm16(frame: np.ndarray) -> bytes:
    """float32 samples -> PCM16 as a wav file holds them (x 32768, rounded down, clipped)."""
    return np.floor(frame * 32768.0).clip(-32768, 32767).astype("<i2").tobytes()


async def stream_audio(conn, source, seconds: float | None) -> int:
    """The user's side: one frame of PCM16 per 80 ms; returns the frames sent."""
    sent = 0
    while seconds is None or sent < round(seconds * RATE / FRAME):
        await conn.input_audio_buffer.append(audio=base64.b64encode(
            pcm16(await source.frame())).decode())
        sent += 1
    return sent


async def listen(conn, sink, answered: list[int], ready: asyncio.Event) -> None:
    """The model's side: its audio to `sink`, its words to stdout as they come."""
    async for event in conn:
        if event.type == "session.updated":  # the persona is ready: audio is heard from now
            ready.set()
        elif event.type == "response.output_audio.delta":
            pcm16 = base64.b64decode(event.delta)
            sink.play(pcm16)
            answered[0] += len(pcm16) // (2 * FRAME)
        elif event.type == "response.output_audio_transcript.delta":
            print(event.delta, end="", flush=True)
        elif event.type == "conversation.item.added" and event.item.content:
            print(f"\n[to say: {event.item.content[0].text}]", flush=True)  # our item back
        elif event.type == "response.done" and event.response.status != "completed":
            print(f"\n[{event.response.status}]", flush=True)
        elif event.type == "error":
            print(f"\n[error: {event.error.message}]", file=sys.stderr, flush=True)


async def say_lines(announcer: Announcer) -> None:
    """The tool / LLM pattern: each line of stdin is said as soon as it comes."""
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        if line.strip():
            await announcer.say(line.strip())


async def say_after(announcer: Announcer, seconds: float, text: str) -> None:
    await asyncio.sleep(seconds)
    await announcer.say(text)


async def main(args) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=args.token or "none", base_url=args.url.rstrip("/") + "/v1")
    sink = WavFile(args.save) if args.save else Speaker()
    async with client.realtime.connect(model="personaplex") as conn:
        session = {"type": "realtime"}
        if args.voice:
            session["audio"] = {"output": {"voice": args.voice}}
        await conn.session.update(session=session)
        announcer, answered, ready = Announcer(conn), [0], asyncio.Event()
        listening = asyncio.create_task(listen(conn, sink, answered, ready))
        await ready.wait()
        source = Silence() if args.silence else Microphone()
        tasks = [asyncio.create_task(say_lines(announcer) if args.lines
                                     else say_after(announcer, args.after, args.text))]
        try:
            sent = await stream_audio(conn, source, args.seconds)
            for _ in range(100):  # the answers to the last frames, at most 5 s more
                if answered[0] >= sent:
                    break
                await asyncio.sleep(0.05)
        finally:
            for task in (*tasks, listening):
                task.cancel()
            sink.close()
    print()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("text", nargs="?", default="Your tea is ready.", help="what the model says")
    p.add_argument("--after", type=float, default=5.0, help="seconds before it says it")
    p.add_argument("--lines", action="store_true", help="say each line of stdin instead")
    p.add_argument("--url", default="http://127.0.0.1:8998", help="the running serve")
    p.add_argument("--token", help="serve's --auth-token, if it has one")
    p.add_argument("--voice", help="a voice of the model's bank, e.g. NATM1")
    p.add_argument("--silence", action="store_true", help="send silence, not the microphone")
    p.add_argument("--save", metavar="WAV", help="write the answer here, not to the speaker")
    p.add_argument("--seconds", type=float, help="stop after this long (default: Ctrl-C)")
    try:
        asyncio.run(main(p.parse_args()))
    except KeyboardInterrupt:
        pass
