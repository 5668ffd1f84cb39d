"""The conversation end to end against the reference's own streaming pipeline (moshi's Mimi
encode -> LMGen step -> Mimi decode) on the same random weights and audio, several
conversations sharing one loaded model, and the offline `run` command as a user runs it."""

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
from interrupt import default_sigint
import soundfile as sf

from conftest_lm import lm_bundle
from moshi_pipeline import ReferencePipeline
from moshi_reference import save_published, tie_free
from personaplex_edge.cli import main
from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.export.hub import CONFIG_FILE, MIMI_FILE, TOKENIZER_FILE, resolve_checkpoint
from personaplex_edge.export.model_export import export_model
from personaplex_edge.export.synthetic import train_tokenizer
from personaplex_edge.manifest import load_model_dir
from personaplex_edge.runtime.api import Model
from personaplex_edge.runtime.persona import Persona
from personaplex_edge.runtime.sampling import SamplingParams

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
    model = Model.load(tiny_full_model, device="cpu")
    conv = model.open_conversation(SamplingParams(greedy=True), Persona(enabled=False))
    out = np.empty_like(pcm)
    for i in range(FRAMES):
        audio, text = conv.step(pcm[i * 1920:(i + 1) * 1920])
        out[i * 1920:(i + 1) * 1920] = audio
        if ref_tokens[i] is None:
            assert conv.last_frame is None and text is None, f"frame {i}"
        else:
            np.testing.assert_array_equal(conv.last_frame, ref_tokens[i], err_msg=f"frame {i}")
            assert text == ref_tokens[i][0]
    assert sum(t is not None for t in ref_tokens) == FRAMES - 1
    assert len({int(t[1]) for t in ref_tokens[1:]}) > 3  # the agent's cb0 actually varies
    np.testing.assert_allclose(out, ref_audio, atol=1e-4)


PROMPT = "You are a helpful robot."


def _run(conv, pcm: np.ndarray) -> np.ndarray:
    return np.concatenate([conv.step(pcm[i * 1920:(i + 1) * 1920])[0].copy()
                           for i in range(pcm.shape[0] // 1920)])


def test_prefill_then_steps_are_deterministic_and_restart_repeats(demo_model_dir):
    pcm = _speech(20, seed=2)
    model = Model.load(demo_model_dir, device="cpu")
    conv = model.open_conversation(SamplingParams(seed=11), Persona(text_prompt=PROMPT))

    def conversation():
        frames = conv.prefill()
        tokens = model.text.encode(f"<system> {PROMPT} <system>")
        # NATF2: 8 stored embeddings and the column of its token cache; silences; the text
        assert frames == 8 + 1 + 6 + len(tokens) + 6
        out = _run(conv, pcm)
        assert conv.position == frames + len(pcm) // 1920  # one position per frame, from 0
        return out, conv.position

    first, pos = conversation()
    again, pos_again = conversation()
    np.testing.assert_array_equal(first, again)
    assert pos == pos_again
    conv.restart(SamplingParams(seed=12))
    other, _ = conversation()
    assert not np.array_equal(first, other)
    # a refused restart changes nothing: the same seed still gives the same conversation
    with pytest.raises(PersonaPlexError, match="--top-k 100000 is outside"):
        conv.restart(SamplingParams(seed=99, top_k=100_000))
    assert conv.sampling == SamplingParams(seed=12)
    conv.restart()
    np.testing.assert_array_equal(conversation()[0], other)


def test_conversations_sharing_a_model_interleaved_equal_each_alone(demo_model_dir):
    """Three conversations on one loaded model, stepped in turn: each gives exactly what it
    gives alone (greedy and sampled), and the model's sessions are not duplicated."""
    pcm = {k: _speech(24, seed=20 + k) for k in range(3)}
    settings = [(SamplingParams(greedy=True), Persona(text_prompt=PROMPT)),
                (SamplingParams(seed=3), Persona(text_prompt="Be brief.", voice="NATM1")),
                (SamplingParams(seed=4), Persona(enabled=False))]
    model = Model.load(demo_model_dir, device="cpu")
    alone = []
    for (sampling, persona), k in zip(settings, pcm):
        with model.open_conversation(sampling, persona) as conv:
            conv.prefill()
            alone.append(_run(conv, pcm[k]))
    sessions = {id(g.session) for g in model.loaded.graphs.values()}
    convs = [model.open_conversation(s, p) for s, p in settings]
    for conv in convs:
        conv.prefill()
    outs = [[] for _ in convs]
    for i in range(24):
        for k, conv in enumerate(convs):
            outs[k].append(conv.step(pcm[k][i * 1920:(i + 1) * 1920])[0].copy())
    for k in range(3):
        np.testing.assert_array_equal(np.concatenate(outs[k]), alone[k], err_msg=f"conv {k}")
    assert len({id(c.group) for c in convs}) == 3  # batch-1 model: a row each
    assert {id(g.session) for g in model.loaded.graphs.values()} == sessions  # loaded once
    assert not np.array_equal(alone[1], alone[2])


def test_two_threads_stepping_two_conversations_equal_each_alone(demo_model_dir):
    import threading

    pcm = [_speech(30, seed=40), _speech(30, seed=41)]
    model = Model.load(demo_model_dir, device="cpu")
    sampling = [SamplingParams(seed=8), SamplingParams(greedy=True)]
    alone = []
    for k in range(2):
        with model.open_conversation(sampling[k], Persona(text_prompt=PROMPT)) as conv:
            conv.prefill()
            alone.append(_run(conv, pcm[k]))
    convs = [model.open_conversation(sampling[k], Persona(text_prompt=PROMPT)) for k in range(2)]
    for conv in convs:
        conv.prefill()
    results: list = [None, None]
    start = threading.Barrier(2)

    def worker(k):
        start.wait()
        results[k] = _run(convs[k], pcm[k])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(2):
        np.testing.assert_array_equal(results[k], alone[k], err_msg=f"thread {k}")


def test_a_cached_persona_continues_exactly_as_a_fresh_prefill(demo_model_dir, tmp_path):
    """The second conversation with a persona restores it from the cache (no prefill) and then
    answers bit for bit as one that prefilled; on disk, a damaged file is ignored and rebuilt."""
    from personaplex_edge.runtime.persona_cache import PersonaCache

    pcm = _speech(20, seed=7)
    persona = Persona(text_prompt=PROMPT, voice="NATM1")
    notes = []
    cache = PersonaCache(directory=tmp_path / "cache", progress=notes.append)
    model = Model.load(demo_model_dir, "cpu", persona_cache=cache)
    outs = []
    for _ in range(2):
        with model.open_conversation(SamplingParams(seed=5), persona) as conv:
            frames = conv.prefill()
            outs.append((conv.persona_cached, _run(conv, pcm)))
    assert [cached for cached, _ in outs] == [False, True] and len(cache) == 1
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    # a new process: from disk
    again = Model.load(demo_model_dir, "cpu",
                       persona_cache=PersonaCache(directory=tmp_path / "cache"))
    with again.open_conversation(SamplingParams(seed=5), persona) as conv:
        assert conv.prefill() == frames and conv.persona_cached
        np.testing.assert_array_equal(_run(conv, pcm), outs[0][1])
    # damaged on disk: one line, then rebuilt by a fresh prefill
    (path,) = (tmp_path / "cache").glob("persona-*.npz")
    path.write_bytes(path.read_bytes()[:-100])
    third = Model.load(demo_model_dir, "cpu", persona_cache=PersonaCache(
        directory=tmp_path / "cache", progress=notes.append))
    with third.open_conversation(SamplingParams(seed=5), persona) as conv:
        conv.prefill()
        assert not conv.persona_cached
        np.testing.assert_array_equal(_run(conv, pcm), outs[0][1])
    assert len(notes) == 1 and "ignoring" in notes[0]


def test_a_closed_conversation_refuses_to_run(demo_model_dir):
    model = Model.load(demo_model_dir, device="cpu")
    with model.open_conversation(persona=Persona(enabled=False)) as conv:
        conv.step(np.zeros(1920, np.float32))
    with pytest.raises(Exception, match="conversation was closed"):
        conv.step(np.zeros(1920, np.float32))
    assert model.open_conversations == 0
    model.close()
    assert all(g.session is None for g in model.loaded.graphs.values())  # onnxruntime's sessions go


def test_prompt_longer_than_the_context_is_refused(tiny_full_model):
    model = Model.load(tiny_full_model, device="cpu")  # context 40 frames
    conv = model.open_conversation(persona=Persona(text_prompt="word " * 60))
    with pytest.raises(Exception, match="more than this model's context of 40 frames"):
        conv.prefill()


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
         "--no-persona", "--device", "cpu"], stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint)
    for line in proc.stderr:  # the live loop's first status line: the loop is running
        if line.startswith("frames "):
            break
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    assert proc.wait(timeout=30) == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not (tmp_path / "rt.wav").exists()


def _without_tokenizer(model_dir, dst):
    """A copy of a model directory whose manifest names no text tokenizer."""
    import dataclasses

    from personaplex_edge.manifest import write_manifest

    shutil.copytree(model_dir, dst)
    write_manifest(dst, dataclasses.replace(load_model_dir(dst), tokenizer=None))
    return dst


@pytest.mark.parametrize("case", ["long-prompt", "codec-only", "bad-input", "no-voice-bank",
                                  "unknown-voice", "no-tokenizer"])
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
    if case == "no-tokenizer":
        args[2] = str(_without_tokenizer(demo_model_dir, tmp_path / "no_tokenizer"))
        args += ["--no-persona"]  # no text prompt to encode: the transcript needs it alone
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("error:") == 1 and "Traceback" not in err
    assert {"long-prompt": "context", "codec-only": "holds only the codec",
            "bad-input": "cannot read", "no-voice-bank": "no voice bank",
            "unknown-voice": "available: NATF0, NATF1, NATF2, NATF3, NATM0, NATM1",
            "no-tokenizer": "has no text tokenizer"}[case] in err
    assert not (tmp_path / "out.wav").exists() and not (tmp_path / "out.json").exists()


def test_voice_from_the_bank_and_from_a_recording(demo_model_dir, tmp_path, monkeypatch):
    """A bank voice replays its stored embeddings; a recording is loudness-normalised and
    Mimi-encoded into forced agent frames. Each changes the conversation. A bank name stays
    the bank's even beside a file of that name in the working directory."""
    pcm = _speech(12, seed=4)
    src = tmp_path / "voice.wav"
    sf.write(src, 0.05 * _speech(30, seed=5), 24000)  # quiet: normalisation must lift it
    outputs = {}
    model = Model.load(demo_model_dir, device="cpu")
    for voice in ("NATF2", "NATM1", str(src)):
        conv = model.open_conversation(SamplingParams(greedy=True),
                                       Persona(text_prompt="hi", voice=voice))
        conv.prefill()
        outputs[voice] = (_run(conv, pcm), conv.position)
        # the stored embeddings feed the prompt frames only: live frames add nothing
        assert not np.any(conv.group.helium.inputs["extra_embedding"]), voice
        conv.close()
    assert outputs[str(src)][1] > outputs["NATF2"][1]  # 30 recorded frames vs 8 stored ones
    assert not np.array_equal(outputs["NATF2"][0], outputs["NATM1"][0])
    assert not np.array_equal(outputs["NATF2"][0], outputs[str(src)][0])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "NATM1").write_bytes(src.read_bytes())
    with model.open_conversation(SamplingParams(greedy=True),
                                 Persona(text_prompt="hi", voice="NATM1")) as conv:
        conv.prefill()
        np.testing.assert_array_equal(_run(conv, pcm), outputs["NATM1"][0])


def test_batched_prefill_continues_like_the_frame_by_frame_one(demo_model_dir):
    """The persona's forced frames in one Helium call (one read of the weights) against one
    step per frame as the reference runs them: the conversation after is the same, greedy
    tokens identical over 100 frames."""
    from personaplex_edge.runtime.persona import build_persona

    model = Model.load(demo_model_dir, device="cpu")
    pcm = _speech(101, seed=9)
    frames = []
    for frame_by_frame in (False, True):
        with model.open_conversation(SamplingParams(greedy=True),
                                     Persona(text_prompt=PROMPT, voice="NATM1")) as conv:
            assert conv.group.framed  # this export's Helium takes several frames per call
            plan = build_persona(model.loaded, conv.persona)
            conv.group.prefill_forced(conv.row, plan, frame_by_frame=frame_by_frame)
            conv.group.prefill_last(conv.row, plan)
            got = []
            for i in range(101):
                conv.step(pcm[i * 1920:(i + 1) * 1920])
                got.append(conv.last_frame.copy())
            frames.append(np.array(got[1:]))  # [100, 9]
    np.testing.assert_array_equal(frames[0], frames[1])
    assert len(np.unique(frames[0][:, 1])) > 3  # the agent's cb0 varies: not a trivial run


def test_a_model_directory_of_the_earlier_format_still_loads(demo_model_dir, tmp_path):
    """Format 1 (the config in the layout before the seed's: helium/depformer/mimi,
    sampling_rate, codebook_size) loads and converses as before."""
    legacy = tmp_path / "legacy"
    shutil.copytree(demo_model_dir, legacy)
    manifest = json.loads((legacy / "manifest.json").read_text())
    cfg = manifest["config"]
    mimi = {k: v for k, v in cfg.pop("mimi_config").items() if k != "model_type"}
    mimi["sampling_rate"], mimi["codebook_size"] = mimi.pop("sample_rate"), mimi.pop("card")
    old = {"helium": {k: v for k, v in cfg.pop("temporal_config").items() if k != "model_type"},
           "depformer": {k: v for k, v in cfg.pop("depformer_config").items()
                         if k != "model_type"}, "mimi": mimi}
    old.update({k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    manifest.update(config=old, format_version=1)
    (legacy / "manifest.json").write_text(json.dumps(manifest))
    pcm = _speech(10, seed=3)
    outs = []
    for directory in (demo_model_dir, legacy):
        model = Model.load(directory, device="cpu")
        with model.open_conversation(SamplingParams(seed=2), Persona(text_prompt=PROMPT)) as c:
            c.prefill()
            outs.append(_run(c, pcm))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_a_text_vocabulary_smaller_than_the_samplers_top_k_exports_and_runs(tmp_path):
    """The sampler's largest top-k (250) is clamped to a vocabulary of 120 pieces: the export
    no longer fails, the graph's text noise holds 120, and a sampled conversation runs with a
    top-k up to it (above it: one message naming the limit)."""
    from personaplex_edge.config import PersonaPlexConfig, PRESETS
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    cfg = PersonaPlexConfig.from_dict({**PRESETS["tiny"], "text_vocab_size": 120,
                                       "text_embedding_rows": 121})
    ckpt = write_synthetic_checkpoint(cfg, tmp_path / "ckpt")
    export_model(resolve_checkpoint(str(ckpt)), tmp_path / "model", progress=lambda s: None)
    model = Model.load(tmp_path / "model", device="cpu")
    assert model.manifest.graphs["helium_step"].inputs[3].shape == (1, 120)  # text_noise
    with model.open_conversation(SamplingParams(seed=1, top_k_text=120),
                                 Persona(text_prompt="Hello there.")) as conv:
        conv.prefill()
        tokens = [conv.step(np.zeros(1920, np.float32))[1] for _ in range(5)]
    assert all(t is None or 0 <= t < 120 for t in tokens)
    with pytest.raises(Exception, match="outside 1..120"):
        model.open_conversation(SamplingParams(top_k_text=121))
    assert model.open_conversations == 0  # the refused one took no row
