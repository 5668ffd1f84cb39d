"""pipecat, a client nobody here wrote: its OpenAIRealtimeLLMService with `base_url` at
`personaplex-edge serve`'s /v1/realtime, in a pipeline without a transport
(tests/pipecat_client.py). pipecat waits for session.created, answers it with its
session.update, validates every event it knows with its own models and treats any error event
as fatal: the answer's audio reaches the pipeline as 24 kHz frames, no ErrorFrame.

pipecat and its dependencies (~500 MB) do not belong in this project's environment: the test
builds a venv of its own once, under .venvs/pipecat (tests/side_venv.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from bench_serve import FRAME, ServerThread, speech  # noqa: E402
from side_venv import side_venv  # noqa: E402

from personaplex_edge.runtime.serve import ServeOptions  # noqa: E402
from personaplex_edge.audio import pcm16_bytes as pcm16  # noqa: E402

PIPECAT = ("pipecat-ai[openai]==1.14.0",)  # the version this test was written against
CLIENT = Path(__file__).resolve().parent / "pipecat_client.py"


def test_pipecat_realtime_service_hears_the_model(demo_model_dir, tmp_path):
    python = side_venv("pipecat", PIPECAT)
    audio = tmp_path / "speech.pcm"
    audio.write_bytes(pcm16(speech(3.0)))
    with ServerThread(ServeOptions(demo_model_dir, port=0)) as srv:
        run = subprocess.run([str(python), str(CLIENT), srv.url.replace("http", "ws", 1)
                              + "v1/realtime", str(audio), "3"], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
        history = srv.history()
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["errors"] == [], run.stderr[-3000:]
    assert seen["rates"] == [24000]
    # every answer frame the server sent reached pipecat's pipeline, as whole 80 ms frames
    assert len(history) == 1 and seen["audio_frames"] == history[0]["frames"] >= 25
    assert seen["audio_bytes"] == seen["audio_frames"] * 2 * FRAME
    pcm = np.frombuffer(audio.read_bytes(), "<i2")
    assert history[0]["received"] == pcm.shape[0] // FRAME  # all it was given, it streamed


def test_pipecat_hears_the_users_words(tmp_path):
    """With transcription on in its session properties, pipecat pushes the user's words as
    InterimTranscriptionFrames (the deltas) and a TranscriptionFrame (the turn's transcript):
    what the Python API hears of the same audio, no ErrorFrame."""
    from conftest_stt import FRAMES, serve_options, stt_model_dir
    from test_heard_surfaces import api_heard

    python = side_venv("pipecat", PIPECAT)
    events, pcm16 = api_heard()
    audio = tmp_path / "speech.pcm"
    audio.write_bytes(pcm16)
    with ServerThread(serve_options(stt_model_dir())) as srv:
        run = subprocess.run([str(python), str(CLIENT), srv.url.replace("http", "ws", 1)
                              + "v1/realtime", str(audio), str(FRAMES * 0.08), "hear"],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["errors"] == [], run.stderr[-3000:]
    first = [e for e in events if e.item == 1]
    assert seen["interim"][:len([e for e in first if e.kind == "piece"])] == [
        e.text for e in first if e.kind == "piece"]
    assert seen["transcripts"][0] == next(e.text for e in first if e.kind == "turn")
