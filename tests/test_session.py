"""The conversation end to end against the reference's own streaming pipeline (moshi's Mimi
encode -> LMGen step -> Mimi decode) on the same random weights and audio, and the offline
`run` command as a user runs it."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile as sf

from conftest_lm import lm_bundle
from moshi_pipeline import ReferencePipeline
from moshi_reference import save_published, tie_free
from personaplex_edge.cli import main
from personaplex_edge.export.hub import CONFIG_FILE, MIMI_FILE, TOKENIZER_FILE, resolve_checkpoint
from personaplex_edge.export.model_export import export_model
from personaplex_edge.export.synthetic import train_tokenizer
from personaplex_edge.runtime.session import SamplingParams, Session

FRAMES = 64  # > the tiny context (40): the KV ring wraps


@pytest.fixture(scope="module")
def tiny_full_model(tmp_path_factory, tiny_mimi_ref):
    """moshi's tiny Mimi and LM in one published checkpoint directory, exported."""
    b = lm_bundle()
    root = tmp_path_factory.mktemp("full_ckpt")
    save_published(tiny_mimi_ref, root / MIMI_FILE)
    shutil.copyfile(b.checkpoint, root / "model.safetensors")
    train_tokenizer(root / TOKENIZER_FILE)
    (root / CONFIG_FILE).write_text(json.dumps({"model_type": "personaplex", **b.cfg.to_dict()}))
    out = tmp_path_factory.mktemp("full_model") / "model"
    export_model(resolve_checkpoint(str(root)), out, progress=lambda s: None)
    return out


def reference_pipeline(mimi, lm, pcm: np.ndarray, frame: int):
    """Greedy: per frame, the emitted agent frame [9] (or None) and its decoded pcm."""
    tokens, audio = [], []
    with ReferencePipeline(mimi, lm) as ref:
        for i in range(pcm.shape[0] // frame):
            t, a = ref.step(pcm[i * frame:(i + 1) * frame])
            tokens.append(t)
            audio.append(a)
    return tokens, np.concatenate(audio)


def _speech(frames: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(frames * 1920) / 24000
    return (rng.standard_normal(t.shape) * (0.05 + 0.25 * np.abs(np.sin(2.1 * t)))).astype(
        np.float32)


def test_greedy_conversation_matches_the_reference_pipeline(tiny_full_model, tiny_mimi_ref):
    pcm, (ref_tokens, ref_audio) = tie_free(
        lambda x: reference_pipeline(tiny_mimi_ref, lm_bundle().ref, x, 1920),
        lambda seed: _speech(FRAMES, seed))
    session = Session.load(tiny_full_model, SamplingParams(greedy=True), device="cpu")
    out = np.empty_like(pcm)
    for i in range(FRAMES):
        audio, text = session.step(pcm[i * 1920:(i + 1) * 1920])
        out[i * 1920:(i + 1) * 1920] = audio
        if ref_tokens[i] is None:
            assert session.last_frame is None and text is None, f"frame {i}"
        else:
            np.testing.assert_array_equal(session.last_frame, ref_tokens[i], err_msg=f"frame {i}")
            assert text == ref_tokens[i][0]
    assert sum(t is not None for t in ref_tokens) == FRAMES - 1
    assert len({int(t[1]) for t in ref_tokens[1:]}) > 3  # the agent's cb0 actually varies
    np.testing.assert_allclose(out, ref_audio, atol=1e-4)


def test_prefill_then_steps_are_deterministic_and_reset_repeats(demo_model_dir):
    pcm = _speech(20, seed=2)
    session = Session.load(demo_model_dir, SamplingParams(seed=11), device="cpu")

    def conversation():
        frames = session.prefill("You are a helpful robot.")
        assert frames == 12 + len(session.prompt_frames("You are a helpful robot.")) - 12
        out = [session.step(pcm[i * 1920:(i + 1) * 1920])[0].copy() for i in range(20)]
        return np.concatenate(out), session.position

    first, pos = conversation()
    again, pos_again = conversation()
    np.testing.assert_array_equal(first, again)
    assert pos == pos_again == frames_of(session) + 20
    session.set_sampling(SamplingParams(seed=12))
    other, _ = conversation()
    assert not np.array_equal(first, other)


def test_a_closed_session_refuses_to_run(demo_model_dir):
    with Session.load(demo_model_dir, device="cpu") as session:
        session.step(np.zeros(1920, np.float32))
    with pytest.raises(Exception, match="session was closed"):
        session.step(np.zeros(1920, np.float32))
    assert session.helium.session is None  # onnxruntime's session let go


def frames_of(session) -> int:
    return len(session.prompt_frames("You are a helpful robot."))


def test_prompt_longer_than_the_context_is_refused(tiny_full_model):
    session = Session.load(tiny_full_model, device="cpu")  # context 40 frames
    with pytest.raises(Exception, match="more than this model's context of 40 frames"):
        session.prefill("word " * 60)


def _write_input(tmp_path, seconds=2.0, rate=16000):
    t = np.arange(int(seconds * rate)) / rate
    sf.write(tmp_path / "in.wav", 0.3 * np.sin(2 * np.pi * 200 * t) * np.sin(3 * t), rate)
    return tmp_path / "in.wav", int(round(seconds * 24000))


def test_run_offline_same_seed_same_output(demo_model_dir, tmp_path):
    src, n = _write_input(tmp_path)
    outs = []
    for tag, seed in (("a", 5), ("b", 5), ("c", 6)):
        rc = main(["run", "--model", str(demo_model_dir), "--input", str(src), "--output",
                   str(tmp_path / f"{tag}.wav"), "--text-out", str(tmp_path / f"{tag}.json"),
                   "--seed", str(seed), "--device", "cpu"])
        assert rc == 0
        audio, rate = sf.read(tmp_path / f"{tag}.wav")
        assert rate == 24000 and audio.shape == (n,)
        text = json.loads((tmp_path / f"{tag}.json").read_text())
        assert len(text) == -(-n // 1920) and all(isinstance(t, str) for t in text)
        outs.append((audio, text))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    assert outs[0][1] == outs[1][1]
    assert not np.array_equal(outs[0][0], outs[2][0])


def test_run_realtime_goes_through_the_live_loop(demo_model_dir, tmp_path, capsys):
    """--realtime plays the file at a microphone's pace: it takes the recording's duration,
    the answer keeps the input's length and the summary reports the live loop's counters."""
    src, n = _write_input(tmp_path, seconds=1.5)
    t0 = time.monotonic()
    rc = main(["run", "--model", str(demo_model_dir), "--input", str(src), "--output",
               str(tmp_path / "rt.wav"), "--text-out", str(tmp_path / "rt.json"), "--realtime",
               "--no-persona", "--device", "cpu"])
    assert rc == 0 and time.monotonic() - t0 >= 1.5
    audio, rate = sf.read(tmp_path / "rt.wav")
    assert rate == 24000 and audio.shape == (n,)
    err = capsys.readouterr().err
    done = re.search(r"done: (\d+) frames, (\d+) dropped, (\d+) underruns", err)
    assert done, err
    processed, dropped = int(done[1]), int(done[2])
    text = json.loads((tmp_path / "rt.json").read_text())
    assert len(text) == processed  # one record per frame the model ran
    # every whole frame of the recording was processed or dropped (a drop of part of a frame
    # counts as one, so the sum may reach one or two more)
    assert n // 1920 <= processed + dropped <= n // 1920 + 2


def test_run_realtime_ctrl_c_aborts_without_output(demo_model_dir, tmp_path):
    """A recording has its own end, so Ctrl-C during --realtime is an abort: the live loop is
    stopped, exit status 130, and no answer file is left."""
    src, _ = _write_input(tmp_path, seconds=8.0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "personaplex_edge.cli", "run", "--model", str(demo_model_dir),
         "--input", str(src), "--output", str(tmp_path / "rt.wav"), "--realtime",
         "--no-persona", "--device", "cpu"], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # the live loop's first status line: the loop is running
        if line.startswith("frames "):
            break
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    assert proc.wait(timeout=30) == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not (tmp_path / "rt.wav").exists()


@pytest.mark.parametrize("case", ["long-prompt", "codec-only", "bad-input", "no-voice-bank",
                                  "unknown-voice"])
def test_run_errors_are_one_message_and_leave_no_output(case, tiny_full_model, tiny_codec_dir,
                                                         demo_model_dir, tmp_path, capsys):
    src, _ = _write_input(tmp_path)
    model = {"long-prompt": tiny_full_model, "codec-only": tiny_codec_dir,
             "no-voice-bank": tiny_full_model}.get(case, demo_model_dir)
    args = ["run", "--model", str(model), "--input", str(src), "--output",
            str(tmp_path / "out.wav"), "--text-out", str(tmp_path / "out.json"), "--device", "cpu"]
    if case == "bad-input":
        (tmp_path / "in.wav").write_bytes(b"not audio at all")
    if case == "no-voice-bank":
        args += ["--voice-prompt", "NATF2", "--text-prompt", "hi"]
    if case == "unknown-voice":
        args += ["--voice-prompt", "VARF9"]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("error:") == 1 and "Traceback" not in err
    assert {"long-prompt": "context", "codec-only": "holds only the codec",
            "bad-input": "cannot read", "no-voice-bank": "no voice bank",
            "unknown-voice": "available: NATF2, NATM1"}[case] in err
    assert not (tmp_path / "out.wav").exists() and not (tmp_path / "out.json").exists()


def test_voice_from_the_bank_and_from_a_recording(demo_model_dir, tmp_path):
    """A bank voice replays its stored embeddings; a recording is loudness-normalised and
    Mimi-encoded into forced agent frames. Each changes the conversation."""
    from personaplex_edge.runtime.persona import Persona, start_session

    pcm = _speech(12, seed=4)
    src = tmp_path / "voice.wav"
    sf.write(src, 0.05 * _speech(30, seed=5), 24000)  # quiet: normalisation must lift it
    outputs = {}
    for voice in ("NATF2", "NATM1", str(src)):
        session = start_session(demo_model_dir, Persona(text_prompt="hi", voice=voice),
                                SamplingParams(greedy=True), device="cpu", progress=lambda s: None)
        outputs[voice] = (np.concatenate([session.step(pcm[i * 1920:(i + 1) * 1920])[0].copy()
                                          for i in range(12)]), session.position)
        # the stored embeddings feed the prompt frames only: live frames add nothing
        assert not np.any(session.helium.inputs["extra_embedding"]), voice
    assert outputs[str(src)][1] > outputs["NATF2"][1]  # 30 recorded frames vs 8 stored ones
    assert not np.array_equal(outputs["NATF2"][0], outputs["NATM1"][0])
    assert not np.array_equal(outputs["NATF2"][0], outputs[str(src)][0])
