"""`--mic` on a real audio server: PulseAudio with a null sink, its monitor as the microphone
(the model hears itself). The server is started here, privately, and stopped after."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
from assistant_service import Collected
from interrupt import default_sigint
from pulse import start_pulse

pytestmark = pytest.mark.skipif(
    shutil.which("pulseaudio") is None or shutil.which("pactl") is None,
    reason="PulseAudio is not installed (apt-get install pulseaudio pulseaudio-utils; "
           "scripts/install.sh does, so CI runs these tests)")


@pytest.fixture(scope="module")
def pulse_env(tmp_path_factory):
    server, env = start_pulse(tmp_path_factory.mktemp("pulse"))
    yield env
    server.terminate()
    server.wait(timeout=10)


def _run(code: str, env: dict, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_mic_runs_on_the_audio_server(pulse_env, demo_model_dir):
    seconds = 6
    done = subprocess.run(
        [sys.executable, "-m", "personaplex_edge.cli", "--mic", "--model", str(demo_model_dir),
         "--duration", str(seconds), "--seed", "3"],
        env=pulse_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = next(line for line in done.stderr.splitlines() if line.startswith("done:"))
    frames = int(summary.split()[1])
    dropped = int(summary.split(",")[1].split()[0])
    # the monitor source starts delivering within ~1.5 s; then 12.5 frames per second
    assert frames >= 0.5 * 12.5 * seconds, summary
    assert dropped == 0, summary


def test_slow_steps_drop_frames_and_stay_bounded(pulse_env):
    """Every step takes 130 ms (> 80 ms): frames are dropped and counted, and the run ends
    cleanly."""
    code = """
import time
from personaplex_edge.runtime.audio_io.devices import run_on_devices
def slow(frame):
    time.sleep(0.13)
    return frame
loop = run_on_devices(slow, duration=6, tick_seconds=0.05)
s = loop.stats
print("RESULT", s.frames, s.dropped_frames)
"""
    done = _run(code, pulse_env)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    frames, dropped = map(int, line.split()[1:])
    assert frames >= 15
    assert dropped >= 10  # about 40% of the frames cannot be processed in time
    # (the backlog's bound is the input ring's size, a few frames; how recent each processed
    # frame is - the drop-oldest rule - is checked where the clock is the test's own:
    # tests/test_duplex.py)
    # (how recent each processed frame is, the drop-oldest rule, is checked where the clock
    # is the test's own: tests/test_duplex.py)


def test_unknown_device_is_one_clear_error(pulse_env, demo_model_dir):
    done = subprocess.run(
        [sys.executable, "-m", "personaplex_edge.cli", "--mic", "--model", str(demo_model_dir),
         "--input-device", "97", "--duration", "1", "--no-persona"],
        env=pulse_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "there is no sound device 97" in done.stderr and "Traceback" not in done.stderr


def _stderr_lines(proc: subprocess.Popen) -> tuple[Collected, threading.Thread]:
    """`proc`'s stderr lines as they come, read by a thread of their own."""
    lines = Collected()

    def read() -> None:
        for line in proc.stderr:
            lines.add(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def _answering(line: str) -> bool:
    """A status line of the live loop (one each 0.5 s) with a frame answered."""
    return line.startswith("frames ") and int(line.split()[1]) > 0


def _rest(proc: subprocess.Popen, lines: Collected, reader: threading.Thread,
          timeout: float) -> str:
    """Its stderr, whole, once it has exited."""
    proc.wait(timeout=timeout)
    reader.join(timeout=10)
    return "\n".join(line for _, line in lines.items)


def test_vanishing_device_ends_with_a_message(tmp_path, demo_model_dir):
    """The sound server dies mid-conversation: one clear message, exit status 2, no hang."""
    server, env = start_pulse(tmp_path)
    try:
        mic = subprocess.Popen(
            [sys.executable, "-m", "personaplex_edge.cli", "--mic", "--model",
             str(demo_model_dir), "--duration", "60", "--no-persona"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines, reader = _stderr_lines(mic)
        lines.wait(_answering, timeout=120)  # in conversation: the device then goes
        server.kill()
        server.wait(timeout=10)
        err = _rest(mic, lines, reader, timeout=45)
    finally:
        if server.poll() is None:
            server.kill()
        if mic.poll() is None:
            mic.kill()
    assert mic.returncode == 2, err[-1500:]
    assert "stopped delivering samples" in err or "sound device failed" in err, err[-1500:]
    assert "Traceback" not in err


def test_ctrl_c_stops_cleanly_with_a_summary(pulse_env, demo_model_dir):
    import signal

    mic = subprocess.Popen(
        [sys.executable, "-m", "personaplex_edge.cli", "--mic", "--model", str(demo_model_dir),
         "--no-persona"], env=pulse_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, preexec_fn=default_sigint)
    try:
        lines, reader = _stderr_lines(mic)
        lines.wait(_answering, timeout=120)  # in conversation: then Ctrl-C
        mic.send_signal(signal.SIGINT)
        err = _rest(mic, lines, reader, timeout=30)
    finally:
        if mic.poll() is None:
            mic.kill()
    assert mic.returncode == 0, err[-1500:]
    summary = next(line for line in err.splitlines() if line.startswith("stopped:"))
    assert int(summary.split()[1]) > 0
    assert "frame " in err and "Traceback" not in err


@pytest.fixture(scope="module")
def echo_env(tmp_path_factory):
    server, env = start_pulse(tmp_path_factory.mktemp("pulse_echo"), echo_ms=60)
    yield env
    server.terminate()
    server.wait(timeout=10)


def _echo_line(env, model_dir, aec: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "personaplex_edge.cli", "--mic", "--model", str(model_dir),
         "--duration", "9", "--seed", "3", "--no-persona", "--aec", aec],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return next(line for line in done.stderr.splitlines() if line.startswith("aec"))


def _heard_db(line: str) -> float:
    return float(line.split(" at ")[1].split(" dB")[0])


def test_open_speaker_echo_is_cancelled_against_aec_off(echo_env, demo_model_dir):
    """The speaker is heard back by the microphone 60 ms later (a PulseAudio loopback): with
    --aec on the summary reports the echo it removed and the model hears itself far more
    quietly than with --aec off on the same setup."""
    on = _echo_line(echo_env, demo_model_dir, "on")
    off = _echo_line(echo_env, demo_model_dir, "off")
    assert on.startswith("aec: removed ") and off.startswith("aec off:"), (on, off)
    removed = float(on.split("removed ")[1].split(" dB")[0])
    assert removed >= 10.0, on
    assert _heard_db(off) > -6.0, off  # without cancelling it hears itself at full level
    assert _heard_db(on) <= _heard_db(off) - 10.0, (on, off)


def _api_page_python() -> str:
    """The Python blocks of the manual's API page (the README's is one of them:
    tests/test_docs.py), in order."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "python-api.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    assert len(blocks) >= 3, "the API page lost its examples"
    return "\n".join(blocks)


def test_the_api_page_python_runs_as_written(pulse_env, demo_model_dir, tmp_path):
    """Every Python block of docs/python-api.md, in order, in one process: on the built-in
    demo model (found where `pe.load("demo")` looks), a question.wav beside it, and the sound
    devices of the test's PulseAudio for the live block."""
    import soundfile as sf

    from personaplex_edge.audio import read_audio, write_audio
    from personaplex_edge.runtime.bench import bundled_speech

    from personaplex_edge.model_ref import BUILTIN_RECIPE, RECIPE_FILE

    cache = tmp_path / "cache"
    demo = cache / "models" / "demo"  # the built-in as its first use leaves it, by links
    demo.mkdir(parents=True)
    for f in demo_model_dir.iterdir():
        (demo / f.name).symlink_to(f)
    (demo / RECIPE_FILE).write_text(BUILTIN_RECIPE)
    write_audio(tmp_path / "question.wav", read_audio(bundled_speech()))
    done = subprocess.run([sys.executable, "-c", _api_page_python()], cwd=tmp_path,
                          env={**pulse_env, "PERSONAPLEX_CACHE": str(cache)},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    question, _ = sf.read(tmp_path / "question.wav")
    answer, rate = sf.read(tmp_path / "answer.wav")
    assert rate == 24000 and answer.shape == question.shape and np.abs(answer).max() > 0
    frames = int(done.stdout.strip().splitlines()[-1].split()[0])
    assert frames > 0, done.stdout[-500:]  # the live block ran on the devices


def test_the_api_live_loop_calls_back_with_what_it_heard_and_said(pulse_env, demo_model_dir):
    code = f"""
import json, numpy as np
import personaplex_edge as pe
heard, said, pieces = [], [], []
model = pe.load({str(demo_model_dir)!r}, device="cpu")
with model.conversation(seed=3) as conv:
    loop = conv.live(on_text=pieces.append, aec=False, duration=4,
                     on_audio=lambda h, s: (heard.append(h.copy()), said.append(s.copy())))
    print(json.dumps({{"frames": loop.stats.frames, "heard": len(heard), "said": len(said),
                      "shapes": sorted({{a.shape for a in heard + said}}),
                      "loud": float(np.abs(np.concatenate(said)).max()),
                      "text_ok": "".join(pieces).strip() == conv.text,
                      "position": conv.position}}))
"""
    done = _run(code, pulse_env)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["frames"] >= 0.5 * 12.5 * 4 and seen["heard"] == seen["said"] == seen["frames"]
    assert seen["shapes"] == [[1920]] and seen["loud"] > 0 and seen["text_ok"]
    assert seen["position"] >= seen["frames"]  # each callback was a step of the conversation
