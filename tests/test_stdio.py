"""`personaplex-edge stdio` as another process sees it: framed PCM16 in, the handshake, audio
and text out, equal to `run`; a client in another language (Node); pings; the live backlog
rule; and a malformed stream or a missing model answered with ERROR and exit 2, no traceback."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from personaplex_edge.cli import main
from personaplex_edge.runtime.stdio import MAX_MESSAGE_BYTES

HANDSHAKE, AUDIO, TEXT, ERROR, PING = 0x00, 0x01, 0x02, 0x05, 0x06
PROMPT = "You enjoy having a good conversation."


def _message(kind: int, payload: bytes = b"") -> bytes:
    return struct.pack("<I", len(payload) + 1) + bytes([kind]) + payload


def _messages(data: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        assert pos + 4 + length <= len(data), "a message cut short on stdout"
        out.append((data[pos + 4], data[pos + 5:pos + 4 + length]))
        pos += 4 + length
    return out


def _stdio(model_dir, stdin: bytes, *flags: str, timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "personaplex_edge.cli", "stdio", "--model",
                           str(model_dir), "--device", "cpu", *flags],
                          input=stdin, capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def question(tmp_path_factory, demo_model_dir):
    """A 24 kHz PCM16 wav and what `run --greedy` answers to it."""
    from personaplex_edge.audio import read_audio, write_audio
    from personaplex_edge.runtime.bench import bundled_speech

    root = tmp_path_factory.mktemp("stdio")
    wav = root / "question.wav"
    write_audio(wav, read_audio(bundled_speech())[:5 * 24000 + 333])  # not whole frames
    assert main(["run", "--model", str(demo_model_dir), "--input", str(wav), "--output",
                 str(root / "run.wav"), "--text-out", str(root / "run.json"), "--greedy",
                 "--device", "cpu", "--text-prompt", PROMPT]) == 0
    samples, _ = sf.read(wav, dtype="int16")
    answer, _ = sf.read(root / "run.wav", dtype="int16")
    records = json.loads((root / "run.json").read_text())
    return wav, samples, answer, [r for r in records if r not in ("PAD", "EPAD", "")]


def test_the_answer_equals_run_on_the_same_audio(demo_model_dir, question):
    wav, samples, by_run, pieces = question
    data = samples.astype("<i2").tobytes()
    # pieces of any size: odd byte counts split samples across messages; one empty message
    cuts = [0, 1, 4001, 4002, 9000, 9000, 20001] + list(range(30000, len(data), 7777))
    stdin = b"".join(_message(AUDIO, data[a:b]) for a, b in zip(cuts, cuts[1:] + [len(data)]))
    done = _stdio(demo_model_dir, stdin + _message(PING, b"are you there"), "--greedy",
                  "--text-prompt", PROMPT)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    messages = _messages(done.stdout)
    kinds = [k for k, _ in messages]
    assert kinds[0] == HANDSHAKE and kinds.count(HANDSHAKE) == 1 and ERROR not in kinds
    assert (PING, b"are you there") in messages
    audio = [p for k, p in messages if k == AUDIO]
    assert len(audio) == -(-samples.shape[0] // 1920) and {len(p) for p in audio} == {3840}
    answer = np.frombuffer(b"".join(audio), "<i2")
    np.testing.assert_array_equal(answer[:samples.shape[0]], by_run)
    assert [p.decode() for k, p in messages if k == TEXT] == pieces and pieces
    assert b"Traceback" not in done.stderr


@pytest.mark.skipif(shutil.which("node") is None,
                    reason="node is not installed (apt-get install nodejs; scripts/install.sh "
                           "does)")
def test_a_node_client_streams_a_wav_and_gets_runs_answer(demo_model_dir, question, tmp_path):
    from pathlib import Path

    wav, samples, by_run, pieces = question
    client = Path(__file__).with_name("stdio_client.mjs")
    raw = tmp_path / "answer.raw"
    done = subprocess.run(
        ["node", str(client), str(wav), str(raw), "--", sys.executable, "-m",
         "personaplex_edge.cli", "stdio", "--model", str(demo_model_dir), "--device", "cpu",
         "--greedy", "--text-prompt", PROMPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["handshakeFirst"] and report["samples"] == samples.shape[0]
    assert report["pieces"] == pieces
    answer = np.frombuffer(raw.read_bytes(), "<i2")
    np.testing.assert_array_equal(answer[:samples.shape[0]], by_run)


def test_live_backlog_drops_the_oldest_and_says_so(demo_model_dir):
    """With --max-backlog-frames a burst far faster than real time is not answered frame for
    frame: what waits beyond the bound is dropped and counted; the rest is answered."""
    frames = 400
    burst = np.zeros(frames * 1920, "<i2").tobytes()
    done = _stdio(demo_model_dir, _message(AUDIO, burst[:MAX_MESSAGE_BYTES - 1])
                  + _message(AUDIO, burst[MAX_MESSAGE_BYTES - 1:]), "--no-persona",
                  "--max-backlog-frames", "2")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    answered = sum(k == AUDIO for k, _ in _messages(done.stdout))
    said = done.stderr.decode()
    dropped = int(said.split(" of 400 input frames dropped")[0].split()[-1])
    assert 0 < answered < frames and answered + dropped == frames, said[-500:]


@pytest.mark.parametrize("case", ["unknown kind", "too long", "cut short", "server kind"])
def test_a_malformed_stream_is_answered_with_error_and_exit_2(demo_model_dir, case):
    good = _message(AUDIO, np.zeros(1920 * 3, "<i2").tobytes())
    stdin = good + {
        "unknown kind": _message(0x42, b"x"),
        "too long": struct.pack("<I", MAX_MESSAGE_BYTES + 1) + b"\x01" + b"\0" * 100,
        "cut short": struct.pack("<I", 5000) + b"\x01" + b"\0" * 100,
        "server kind": _message(TEXT, b"hello"),
    }[case]
    done = _stdio(demo_model_dir, stdin, "--no-persona")
    assert done.returncode == 2, done.stderr.decode()[-2000:]
    messages = _messages(done.stdout)
    kinds = [k for k, _ in messages]
    assert kinds[0] == HANDSHAKE and kinds.count(AUDIO) == 3  # what came before was answered
    assert kinds[-1] == ERROR
    reason = messages[-1][1].decode()
    assert {"unknown kind": "0x42", "too long": "1 MiB", "cut short": "ended inside",
            "server kind": "AUDIO (0x01)"}[case] in reason
    assert b"Traceback" not in done.stderr


def test_a_missing_model_is_one_error_message_and_exit_2(tmp_path):
    done = _stdio(tmp_path / "nowhere", b"", "--no-persona", timeout=60)
    assert done.returncode == 2
    [(kind, payload)] = _messages(done.stdout)
    assert kind == ERROR and b"does not exist" in payload
    assert b"Traceback" not in done.stderr
