"""LiveKit Agents, a client nobody here wrote: its OpenAI realtime model with `base_url` at
`personaplex-edge serve`'s /v1/realtime, one session without a LiveKit server or room
(tests/livekit_client.py), fed 20 ms `rtc.AudioFrame`s. It converses: a generation opens, its
audio arrives as 24 kHz frames and its text as the transcript, the instructions it sets as an
AgentSession does (a second session.update) are the persona - with a bank voice, no turn
detection and no transcription asked (no error at all), and with LiveKit's defaults (OpenAI's
voice `marin`, server turn detection, the user's transcription), where the bank's default
voice speaks and session.updated names it, and the transcription this model cannot give is one
error naming the field. On a model with a transcriber, the user's words reach the session as
its input_audio_transcription_completed events.

livekit-agents and its dependencies do not belong in this project's environment: the test
builds a venv of its own once, under .venvs/livekit (tests/side_venv.py)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from bench_serve import FRAME, ServerThread, speech, wait_until  # noqa: E402
from side_venv import side_venv  # noqa: E402

from personaplex_edge.audio import pcm16_bytes as pcm16  # noqa: E402
from personaplex_edge.runtime.persona import DEFAULT_VOICE  # noqa: E402
from personaplex_edge.runtime.serve import ServeOptions  # noqa: E402

# the versions this test was written against
LIVEKIT = ("livekit-agents==1.8.9", "livekit-plugins-openai==1.8.9")
CLIENT = Path(__file__).resolve().parent / "livekit_client.py"
INSTRUCTIONS = "You enjoy having a good conversation."  # what the client sets


def converse(python: Path, url: str, audio: Path, seconds: float, voice: str,
             *flags: str, errors: tuple[str, ...] = ()) -> dict:
    """The client's run; `errors`: the params of the error events expected (and nothing
    else raised)."""
    run = subprocess.run([str(python), str(CLIENT), url + "v1", str(audio), str(seconds),
                          voice, *flags], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert [e["param"] for e in seen["server_errors"]] == list(errors), run.stderr[-3000:]
    assert len(seen["errors"]) == len(errors), run.stderr[-3000:]
    return seen


@pytest.fixture(scope="module")
def livekit(demo_model_dir):
    return side_venv("livekit", LIVEKIT)


@pytest.mark.parametrize("voice", ["NATM1", "-"], ids=["bank voice", "livekit defaults"])
def test_a_livekit_realtime_session_converses(livekit, demo_model, demo_model_dir, voice,
                                              tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="personaplex_edge.serve")
    audio = tmp_path / "speech.pcm"
    audio.write_bytes(pcm16(speech(3.0)))
    with ServerThread(ServeOptions(demo_model_dir, port=0), model=demo_model) as srv:
        if voice == "-":  # LiveKit asks for the user's transcription: this model has none
            seen = converse(livekit, srv.url, audio, 3.0, voice,
                            errors=("session.audio.input.transcription",))
        else:
            seen = converse(livekit, srv.url, audio, 3.0, voice, "deaf")
        history = srv.history()
    assert seen["generations"] == 1 and seen["rates"] == [24000]
    # every answer frame the server sent reached LiveKit's audio stream, whole
    assert len(history) == 1 and history[0]["frames"] >= 25
    assert seen["audio_samples"] == history[0]["frames"] * FRAME
    assert len(seen["text"]) > 0 and seen["server_events"][0] == "session.created"
    # both of the client's updates answered, the persona theirs merged: its voice (or the
    # bank's default instead of OpenAI's) and the instructions of the second
    updated = [s for s in seen["sessions"] if s["type"] == "session.updated"]
    expected_voice = DEFAULT_VOICE if voice == "-" else voice
    assert len(updated) == 2 and all(s["voice"] == expected_voice for s in updated)
    assert all(s["instructions"] == INSTRUCTIONS for s in updated)
    opened = [r.getMessage() for r in caplog.records if ": open, persona " in r.getMessage()]
    assert len(opened) == 1 and f"persona {voice if voice != '-' else 'default'} " in opened[0]
    warned = [r.getMessage() for r in caplog.records
              if "is OpenAI's, not in this model's bank" in r.getMessage()]
    assert len(warned) == (1 if voice == "-" else 0)


def test_livekit_hears_the_users_words(livekit, tmp_path):
    """On a model with a transcriber, LiveKit's default session asks for the user's words:
    its input_audio_transcription_completed events carry them - interim ones the deltas joined
    per item, the final one the turn's transcript, as the Python API hears the frames the
    model stepped (LiveKit streams in real time: under load some may come late, and the
    server's clock steps silence instead)."""
    from call_tap import ModelInput
    from conftest_stt import FRAMES, heard_of, serve_options, stt_bundle, stt_model_dir

    audio = tmp_path / "speech.pcm"
    audio.write_bytes(pcm16(stt_bundle().pcm))
    with ServerThread(serve_options(stt_model_dir())) as srv:
        tap = ModelInput(srv)
        try:
            seen = converse(livekit, srv.url, audio, FRAMES * 0.08, "-")
            assert wait_until(lambda: srv.state.slots_used == 0, 10)
            stepped = tap.only()
        finally:
            tap.close()
    events = heard_of(stepped)
    turn = next(e for e in events if e.kind == "turn")
    finals = [h for h in seen["heard"] if h["final"]]
    assert finals and finals[0]["transcript"] == turn.text
    interim = [h for h in seen["heard"] if not h["final"] and h["item"] == finals[0]["item"]]
    pieces = "".join(e.text for e in events if e.kind == "piece" and e.item == 1)
    assert interim and interim[-1]["transcript"] == pieces
