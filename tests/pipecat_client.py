"""pipecat's OpenAIRealtimeLLMService against `personaplex-edge serve`, in a pipeline without a
transport: speech goes in as InputAudioRawFrames at real-time pace, what the service pushes
is counted on both sides of it (audio downstream, errors upstream). Run by
tests/test_serve_pipecat.py with the python of a venv that holds pipecat (not this project's):

    python tests/pipecat_client.py ws://127.0.0.1:PORT/v1/realtime speech.pcm SECONDS [hear]

It prints one JSON line: the audio frames and bytes pipecat pushed, their sample rates, the
text it pushed, the errors it raised; with `hear` the session turns the user's transcription on
and the line holds the transcription frames pipecat pushed (interim and final).
"""

from __future__ import annotations

import asyncio
import json
import sys

from client_wait import until_quiet
from pipecat.frames.frames import (EndFrame, ErrorFrame, InputAudioRawFrame,
                                   InterimTranscriptionFrame, StartFrame, TextFrame,
                                   TranscriptionFrame, TTSAudioRawFrame)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.workers.runner import WorkerRunner
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

FRAME_BYTES = 3840  # 80 ms of PCM16 at 24 kHz


class Tap(FrameProcessor):
    """Counts what passes, in both directions, and lets everything through; `started` is set
    when the pipeline's StartFrame has come this far."""

    def __init__(self, seen: dict, started: asyncio.Event | None = None):
        super().__init__()
        self.seen = seen
        self.started = started

    async def process_frame(self, frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame) and self.started is not None:
            self.started.set()
        elif isinstance(frame, ErrorFrame):
            self.seen["errors"].append(str(frame.error))
        elif isinstance(frame, InterimTranscriptionFrame):
            self.seen["interim"].append(frame.text)
        elif isinstance(frame, TranscriptionFrame):
            self.seen["transcripts"].append(frame.text)
        elif isinstance(frame, TTSAudioRawFrame):
            self.seen["audio_frames"] += 1
            self.seen["audio_bytes"] += len(frame.audio)
            self.seen["rates"] = sorted(set(self.seen["rates"]) | {frame.sample_rate})
        elif isinstance(frame, TextFrame):
            self.seen["text"] += frame.text
        await self.push_frame(frame, direction)


async def main(url: str, speech: bytes, seconds: float, hear: bool = False) -> dict:
    seen = {"audio_frames": 0, "audio_bytes": 0, "rates": [], "text": "", "errors": [],
            "interim": [], "transcripts": []}
    properties = None
    if hear:  # the user's words: transcription on, as an app that wants them sets it
        properties = events.SessionProperties(audio=events.AudioConfiguration(
            input=events.AudioInput(transcription=events.InputAudioTranscription())))
    llm = OpenAIRealtimeLLMService(api_key="not-needed", base_url=url,
                                   session_properties=properties)
    # the service passes the StartFrame on once it has connected (its start() opens the
    # WebSocket): audio queued before that would not reach the server
    connected = asyncio.Event()
    worker = PipelineWorker(Pipeline([Tap(seen), llm, Tap(seen, connected)]),
                            idle_timeout_secs=None)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)

    async def microphone():
        await asyncio.wait_for(connected.wait(), 60)  # the service connected
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i in range(int(seconds * 12.5)):
            chunk = speech[(i * FRAME_BYTES) % len(speech):][:FRAME_BYTES]
            await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=24000,
                                                        num_channels=1))
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.08 - loop.time()))
        await until_quiet(lambda: seen["audio_frames"])  # the last answers
        await worker.queue_frame(EndFrame())

    await asyncio.gather(runner.run(), microphone())
    return seen


if __name__ == "__main__":
    url, path, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    hear = len(sys.argv) > 4 and sys.argv[4] == "hear"
    with open(path, "rb") as f:
        print(json.dumps(asyncio.run(main(url, f.read(), seconds, hear))))
