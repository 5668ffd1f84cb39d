"""The transcriber (Kyutai's STT beside PersonaPlex) against moshi's own STT inference, on a
checkpoint with random weights in stt-1b-en_fr's layout (tests/moshi_stt_reference.py):

    run --user-text-out    the greedy text token of every frame equals moshi's run_inference
                           (first frame fed twice) on the same audio, past the transcriber's
                           context (24 frames here) and Mimi's ring: the input's frames, then
                           the 1.5 s of silence moshi pads after them (its whole output), also
                           where the speech runs to the end and the last frame is partial
    the encode             the 32-code encoder's codes equal moshi's 32-code encode, and its
                           first 8 the 8-code encoder's of the same checkpoint exported without
                           a transcriber
    VAD heads              their softmax equals moshi's step_with_extra_heads within float32
    PersonaPlex            its answer and text are those of the export without a transcriber
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest_stt import FRAMES, SPOKEN, plain_model_dir, stt_bundle, stt_model_dir
from personaplex_edge.audio import read_audio, write_audio
from personaplex_edge.cli import main

# the silent frames moshi's run_inference steps after a whole-frame input of the 1B's layout:
# audio_delay_seconds + 1 s = 36000 samples, in whole frames of 1920
FLUSH = 18
# speech to the end: the bundle's first frames (all speech), the last one cut short
SHORT = 30 * 1920 - 700
assert SHORT // 1920 < SPOKEN


def _records(tokens, tokenizer_path) -> list[str]:
    """moshi's tokens as the offline tool records them, with sentencepiece itself."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    return ["PAD" if t == 3 else "EPAD" if t == 0 else
            sp.id_to_piece(int(t)).replace("\u2581", " ") for t in tokens]


@pytest.fixture(scope="module")
def run_outputs(tmp_path_factory):
    """`run` on both exports of the same checkpoint, greedy, on the bundle's input."""
    b = stt_bundle()
    work = tmp_path_factory.mktemp("stt_run")
    write_audio(work / "in.wav", b.pcm)
    out = {}
    for name, model in (("stt", stt_model_dir()), ("plain", plain_model_dir())):
        args = ["run", "--model", str(model), "--input", str(work / "in.wav"),
                "--output", str(work / f"{name}.wav"), "--text-out",
                str(work / f"{name}.json"), "--greedy", "--no-persona"]
        if name == "stt":
            args += ["--user-text-out", str(work / "user.json")]
        assert main(args) == 0
        out[name] = (read_audio(work / f"{name}.wav"),
                     json.loads((work / f"{name}.json").read_text()))
    out["user"] = json.loads((work / "user.json").read_text())
    out["work"] = work
    return out


@pytest.fixture(scope="module")
def short_reference():
    """moshi's whole output on speech that runs to the end of a recording of SHORT samples."""
    from moshi_stt_reference import reference_transcribe

    b = stt_bundle()
    pcm = b.pcm[:SHORT]
    return pcm, _records(reference_transcribe(b.stt_checkpoint, pcm, with_vad=False)["text"],
                         b.stt_checkpoint / b.stt_config["tokenizer_name"])


def test_user_text_out_equals_moshi_stt_inference(run_outputs):
    b = stt_bundle()
    want = _records(b.reference["text"], b.stt_checkpoint / b.stt_config["tokenizer_name"])
    got = run_outputs["user"]
    assert len(want) == FRAMES + FLUSH  # moshi's whole output, the silence after the input's
    assert got == want
    # not a vacuous run: the random model writes many different pieces, and padding
    assert len(set(got)) > 10


def test_the_last_words_of_speech_to_the_end_are_heard(short_reference, tmp_path):
    """Speech to the recording's very end (its last frame partial): `run --user-text-out`
    writes moshi's whole output, the words its delay held back at the input's end included,
    and the heard text and Response.heard_words end with them."""
    import personaplex_edge as pe

    pcm, want = short_reference
    write_audio(tmp_path / "in.wav", pcm)
    assert main(["run", "--model", str(stt_model_dir()), "--input", str(tmp_path / "in.wav"),
                 "--output", str(tmp_path / "o.wav"), "--user-text-out",
                 str(tmp_path / "u.json"), "--greedy", "--no-persona"]) == 0
    got = json.loads((tmp_path / "u.json").read_text())
    frames = -(-SHORT // 1920)
    assert len(got) == (SHORT + 36000) // 1920 == len(want)  # moshi keeps whole frames only
    assert got == want
    tail = [r for r in got[frames:] if r not in ("PAD", "EPAD")]
    assert tail, "moshi writes pieces after the input's end: the test would not tell"
    # the same through the live loop at a microphone's pace (a backlog as long as the input:
    # a busy machine drops nothing)
    assert main(["run", "--model", str(stt_model_dir()), "--input", str(tmp_path / "in.wav"),
                 "--output", str(tmp_path / "r.wav"), "--user-text-out",
                 str(tmp_path / "r.json"), "--greedy", "--no-persona", "--realtime",
                 "--max-backlog-frames", str(frames)]) == 0
    assert json.loads((tmp_path / "r.json").read_text()) == want
    model = pe.load(stt_model_dir(), device="cpu")
    try:
        with model.conversation(persona=False, greedy=True) as conv:
            response = conv.respond(pcm)
    finally:
        model.close()
    assert response.heard_records == want and response.pcm.shape == pcm.shape
    assert response.heard == "".join(r for r in want if r not in ("PAD", "EPAD")).strip()
    words = " ".join(w.text for w in response.heard_words)
    assert words.replace(" ", "").endswith("".join(tail).replace(" ", ""))


def test_the_32_code_encoder_keeps_the_8_codes_and_equals_moshi(tmp_path):
    from personaplex_edge.contract import CODES
    from personaplex_edge.runtime.codec import Codec

    b = stt_bundle()
    wide = Codec.load(stt_model_dir(), device="cpu")
    narrow = Codec.load(plain_model_dir(), device="cpu")
    codes32, codes8 = [], []
    for i in range(FRAMES):
        frame = b.pcm[i * 1920:(i + 1) * 1920]
        wide._pcm_in[0, 0] = frame
        codes32.append(wide.encoder.run()[CODES][0].copy())
        codes8.append(narrow.encode_frame(frame).copy())
    codes32, codes8 = np.array(codes32), np.array(codes8)
    assert codes32.shape == (FRAMES, 32) and codes8.shape == (FRAMES, 8)
    np.testing.assert_array_equal(codes32[:, :8], codes8)
    np.testing.assert_array_equal(codes32, b.reference["codes"])
    assert all(len(set(codes32[:, k])) > 2 for k in range(32))  # every codebook in use


def test_vad_heads_match_moshi():
    import personaplex_edge as pe

    b = stt_bundle()
    model = pe.load(stt_model_dir(), device="cpu")
    try:
        with model.conversation(persona=False, greedy=True) as conv:
            got = []
            for i in range(FRAMES):
                conv.step(b.pcm[i * 1920:(i + 1) * 1920])
                got.append(conv.core.heard_vad.copy())
    finally:
        model.close()
    got, want = np.array(got), b.reference["vad"]
    assert got.shape == want.shape == (FRAMES, 4, 6)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
    assert np.ptp(want[:, 2, 0]) > 0.05  # the heads move with the audio


def test_personaplex_answers_unchanged_by_the_transcriber(run_outputs):
    (pcm_stt, text_stt), (pcm_plain, text_plain) = run_outputs["stt"], run_outputs["plain"]
    assert text_stt == text_plain
    np.testing.assert_allclose(pcm_stt, pcm_plain, atol=1e-6)
    assert np.abs(pcm_plain).max() > 1e-3


def test_user_text_out_without_a_transcriber_is_refused(run_outputs, capsys):
    work = run_outputs["work"]
    assert main(["run", "--model", str(plain_model_dir()), "--input", str(work / "in.wav"),
                 "--output", str(work / "x.wav"), "--user-text-out", str(work / "x.json"),
                 "--no-persona"]) == 2
    err = capsys.readouterr().err
    assert "--user-text-out" in err and "transcriber" in err
    assert not (work / "x.json").exists() and not (work / "x.wav").exists()


# ---- bad transcriber input ------------------------------------------------------------------

def _bad_copy(tmp_path, change):
    b = stt_bundle()
    root = tmp_path / "stt_bad"
    shutil.copytree(b.stt_checkpoint, root)
    change(root)
    return root


def _edit_config(**fields):
    def change(root):
        cfg = json.loads((root / "config.json").read_text())
        cfg.update(fields)
        (root / "config.json").write_text(json.dumps(cfg))
    return change


def _other_mimi(root):
    """Another codec under the transcriber's Mimi name: the same sizes, other weights."""
    from moshi_reference import reference_mimi, save_published

    name = json.loads((root / "config.json").read_text())["mimi_name"]
    save_published(reference_mimi(stt_bundle().cfg.mimi_config, seed=7), root / name)


def _resaved_mimi(root):
    """The same codec in other bytes: its tensors saved again, as another tool would write
    them (another header, another sha256)."""
    from safetensors.numpy import load_file, save_file

    name = json.loads((root / "config.json").read_text())["mimi_name"]
    tensors = load_file(str(root / name))
    save_file(dict(reversed(list(tensors.items()))), str(root / name),
              metadata={"format": "np", "written_by": "another tool"})


@pytest.mark.parametrize("change, names", [
    (_edit_config(model_type="moshi"), ["config.json", "model_type"]),
    (_edit_config(dep_q=8), ["config.json", "dep_q"]),
    (_edit_config(n_q=4, delays=[0] * 5), ["config.json", "n_q"]),
    (_other_mimi, ["mimi-pytorch-e351c8d8@125.safetensors", "mimi_name"]),
    (lambda root: (root / "tokenizer_en_fr_audio_8000.model").unlink(),
     ["tokenizer_en_fr_audio_8000.model", "tokenizer_name"]),
], ids=["model_type", "dep_q", "n_q", "another_mimi", "no_tokenizer"])
def test_bad_transcriber_is_refused_naming_file_and_field(tmp_path, capsys, change, names):
    b = stt_bundle()
    bad = _bad_copy(tmp_path, change)
    out = tmp_path / "model"
    assert main(["export", "--checkpoint", str(b.checkpoint), "--transcriber", str(bad),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    for name in names:
        assert name in err, err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model")]


def test_a_codec_in_other_bytes_with_the_same_weights_is_taken(tmp_path, run_outputs):
    """The transcriber's Mimi file need not be PersonaPlex's byte for byte: its weights
    decide (the first 8 codes of its encoder, frame after frame, are the model's), both when
    it is exported with the model and when it is added to one; and the user's words are then
    the same as with the very file."""
    from personaplex_edge.manifest import sha256_file

    b = stt_bundle()
    stt = _bad_copy(tmp_path, _resaved_mimi)
    name = b.stt_config["mimi_name"]
    assert sha256_file(stt / name) != sha256_file(b.stt_checkpoint / name)
    together = tmp_path / "together"
    assert main(["export", "--checkpoint", str(b.checkpoint), "--transcriber", str(stt),
                 "--out", str(together)]) == 0
    added = tmp_path / "added"
    shutil.copytree(plain_model_dir(), added)
    assert main(["export", "--transcriber", str(stt), "--out", str(added)]) == 0
    work = run_outputs["work"]
    for model in (together, added):
        assert main(["run", "--model", str(model), "--input", str(work / "in.wav"), "--output",
                     str(tmp_path / "o.wav"), "--user-text-out", str(tmp_path / "u.json"),
                     "--greedy", "--no-persona"]) == 0
        assert json.loads((tmp_path / "u.json").read_text()) == run_outputs["user"]


def test_another_codec_added_to_a_model_is_refused(tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(plain_model_dir(), model)
    before = (model / "manifest.json").read_bytes()
    stt = _bad_copy(tmp_path, _other_mimi)
    assert main(["export", "--transcriber", str(stt), "--out", str(model)]) == 2
    err = capsys.readouterr().err
    assert "mimi_name" in err and "other codes than the model's" in err
    assert (model / "manifest.json").read_bytes() == before


def test_adding_a_transcriber_refuses_the_flags_that_cannot_apply(tmp_path, capsys):
    """Added to an exported model (onnx, fp32, batch 1), the model's own settings and the
    engine flags of a model without engines cannot apply: one message names them all (exit 2,
    nothing written), instead of an fp32 transcriber on an onnx manifest."""
    b = stt_bundle()
    model = tmp_path / "model"
    shutil.copytree(plain_model_dir(), model)
    before = (model / "manifest.json").read_bytes()
    flags = ["--precision", "int4", "--backend", "tensorrt", "--library", "rtx", "--targets",
             "8.9", "--weightless", "--batch", "4", "--kv-dtype", "float16"]
    assert main(["export", "--transcriber", str(b.stt_checkpoint), "--out", str(model),
                 *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1, err
    for named in ("--precision int4", "--backend tensorrt", "--library rtx", "--targets 8.9",
                  "--weightless", "--batch 4", "--kv-dtype float16", "--transcriber-precision",
                  "precision fp32", "batch 1", "backend onnx"):
        assert named in err, (named, err)
    assert (model / "manifest.json").read_bytes() == before
    # the model's own values pass: they change nothing
    assert main(["export", "--transcriber", str(b.stt_checkpoint), "--out", str(model),
                 "--precision", "fp32", "--batch", "1", "--kv-dtype", "float32"]) == 0


def test_adding_a_transcriber_to_a_tensorrt_model_builds_its_engines_as_asked(tmp_path,
                                                                             capsys):
    """On a TensorRT model, --library rtx --targets 8.9 build the engines of the two graphs
    the transcriber adds (the encoder, its step) for those targets - TensorRT for RTX builds
    without a GPU - and leave the others' as they were; without them, the closing hint names
    those two graphs, not every engine."""
    pytest.importorskip("tensorrt_rtx", reason="TensorRT for RTX is not installed: pip "
                                               "install 'personaplex-edge[rtx]'")
    from personaplex_edge.export.precision import convert_model_dir

    b = stt_bundle()
    model = tmp_path / "fp16"
    convert_model_dir(plain_model_dir(), model, "fp16", backend="tensorrt",
                      progress=lambda s: None)
    assert main(["export", "--transcriber", str(b.stt_checkpoint), "--out", str(model)]) == 0
    hint = [line for line in capsys.readouterr().out.splitlines() if "no TensorRT engines" in line]
    assert len(hint) == 1 and hint[0].endswith(
        f"engines --model {model} --graphs mimi_encoder,transcriber_step"), hint
    assert main(["export", "--transcriber", str(b.stt_checkpoint), "--out", str(model),
                 "--library", "rtx", "--targets", "8.9"]) == 0
    graphs = json.loads((model / "manifest.json").read_text())["graphs"]
    built = {name for name, g in graphs.items() if g.get("engine")}
    assert built == {"mimi_encoder", "transcriber_step"}, built
    for name in built:
        assert graphs[name]["engine"]["targets"] == ["8.9"], graphs[name]["engine"]
        assert (model / graphs[name]["engine"]["file"]).is_file()


def test_transcriber_added_to_an_exported_model(tmp_path, run_outputs):
    """`export --transcriber CK --out DIR` on an export without one: the same transcriber and
    encoder as the export with both, the rest of the directory untouched."""
    b = stt_bundle()
    model = tmp_path / "model"
    shutil.copytree(plain_model_dir(), model)
    before = json.loads((model / "manifest.json").read_text())
    assert main(["export", "--transcriber", str(b.stt_checkpoint), "--out", str(model)]) == 0
    after = json.loads((model / "manifest.json").read_text())
    assert "transcriber" in after["contents"] and after["transcriber"]["vad_heads"] == 4
    assert after["graphs"]["mimi_encoder"]["outputs"][0]["shape"] == [1, 32]
    for name in ("mimi_decoder", "helium_step", "depformer_step"):
        assert after["graphs"][name]["sha256"] == before["graphs"][name]["sha256"]
    work = run_outputs["work"]
    assert main(["run", "--model", str(model), "--input", str(work / "in.wav"),
                 "--output", str(tmp_path / "o.wav"), "--user-text-out", str(tmp_path / "u.json"),
                 "--greedy", "--no-persona"]) == 0
    assert json.loads((tmp_path / "u.json").read_text()) == run_outputs["user"]


def test_a_transcriber_added_to_a_tensorrt_model_is_warned_of_as_its_export_is(tmp_path,
                                                                               capsys):
    """Added alone to an int8 TensorRT model, the transcriber's step takes the model's
    precision, and the export says before it starts what `export --precision int8 --backend
    tensorrt` says of the LM's steps: int8 for TensorRT is experimental."""
    from personaplex_edge.export.precision import convert_model_dir

    b = stt_bundle()
    model = tmp_path / "int8"
    convert_model_dir(plain_model_dir(), model, "int8", backend="tensorrt",
                      progress=lambda s: None)
    assert main(["export", "--transcriber", str(b.stt_checkpoint), "--out", str(model)]) == 0
    out = capsys.readouterr().out.splitlines()
    warned = [i for i, line in enumerate(out)
              if line.startswith("warning: transcriber_step in int8 for TensorRT is experimental")]
    exported = [i for i, line in enumerate(out)
                if "transcriber_step" in line and not line.startswith("warning")]
    assert warned and exported and warned[0] < exported[0], out
    manifest = json.loads((model / "manifest.json").read_text())
    assert manifest["graphs"]["transcriber_step"]["precision"] == "int8"


def test_verify_checks_the_transcriber_against_its_checkpoint(capsys):
    b = stt_bundle()
    assert main(["verify", "--model", str(stt_model_dir()), "--checkpoint", str(b.checkpoint),
                 "--transcriber", str(b.stt_checkpoint)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "transcriber_step" in line]
    assert any("torch" in line and "full" in line for line in lines), out
    assert any("signature" in line for line in lines), out
    # another transcriber checkpoint is named as such
    other = json.loads((b.stt_checkpoint / "config.json").read_text())
    assert main(["verify", "--model", str(stt_model_dir()), "--checkpoint", str(b.checkpoint),
                 "--transcriber", str(plain_stt_copy(b, other))]) == 1


def plain_stt_copy(b, config):
    """The transcriber checkpoint with another context: not the export's."""
    root = b.workdir / "stt_other"
    if not root.exists():
        shutil.copytree(b.stt_checkpoint, root)
        (root / "config.json").write_text(json.dumps({**config, "context": 30}))
    return root


def test_lockstep_rows_each_hear_their_own_audio(tmp_path):
    """A model exported with --batch 2: two conversations stepped together (the second joining
    five frames late, so rows are held too), each row's transcriber tokens those of its own
    audio - the first row's moshi's own, the second's what a batch-1 model hears."""
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.transcriber import resolve_transcriber
    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.conversation import step_many
    from personaplex_edge.runtime.persona import Persona

    b = stt_bundle()
    out = tmp_path / "model_b2"
    export_model(resolve_checkpoint(str(b.checkpoint)), out, batch=2, progress=lambda s: None,
                 transcriber=resolve_transcriber(str(b.stt_checkpoint), lambda s: None))
    other = b.pcm[::-1].copy()  # the other user: the same sounds, backwards

    def frame(pcm, i):
        return pcm[i * 1920:(i + 1) * 1920]

    single = Model.load(stt_model_dir(), device="cpu")
    try:
        conv = single.open_conversation(persona=Persona(enabled=False))
        conv.prefill()
        alone = []
        for i in range(FRAMES - 5):
            conv.step(frame(other, i))
            alone.append(conv.heard_token)
        conv.close()
    finally:
        single.close()
    model = Model.load(out, device="cpu")
    try:
        first, second = (model.open_conversation(persona=Persona(enabled=False))
                         for _ in range(2))
        assert first.group is second.group and {first.row, second.row} == {0, 1}
        first.prefill()
        second.prefill()
        heard = {first: [], second: []}
        for i in range(FRAMES):
            frames = {first: frame(b.pcm, i)}
            if i >= 5:
                frames[second] = frame(other, i - 5)
            step_many(frames)
            for conv in frames:
                heard[conv].append(conv.heard_token)
    finally:
        model.close()
    np.testing.assert_array_equal(heard[first], b.reference["text"][:FRAMES])
    assert heard[second] == alone


def test_a_silence_prefix_is_heard_as_moshi_feeds_it(tmp_path):
    """stt-2.6b-en's config asks for 1 s of silence before the audio, which moshi's
    run_inference pads in: 12.5 frames, so its frames straddle the user's. The same checkpoint
    asking for it: every frame's token equals moshi's on its padded audio - the silence after
    the input too, its first frame the input's last 40 ms - for two conversations one after
    the other on the model (each starts with the silence again); and moshi's tokens with and
    without the prefix differ, so the prefix is what is matched."""
    from conftest_stt import _speech_like
    from moshi_stt_reference import clear_input, reference_transcribe

    import personaplex_edge as pe

    b = stt_bundle()
    stt = tmp_path / "stt_prefix"
    shutil.copytree(b.stt_checkpoint, stt)
    config = {**b.stt_config, "stt_config": {**b.stt_config["stt_config"],
                                             "audio_silence_prefix_seconds": 1.0}}
    (stt / "config.json").write_text(json.dumps(config))
    pcm, ref = clear_input(lambda x: reference_transcribe(stt, x, with_vad=False),
                           _speech_like)
    unprefixed = reference_transcribe(b.stt_checkpoint, pcm, with_vad=False)["text"]
    # (1 s + the input + 0.5 s + 1 s) in whole frames, less the prefix's 12: the 40 ms the
    # prefix's half frame holds back of the input make it 19 frames after it, not 18
    assert len(ref["text"]) == (24000 + FRAMES * 1920 + 36000) // 1920 - 12 == FRAMES + 19
    assert not np.array_equal(ref["text"][:FRAMES], unprefixed[:FRAMES])

    model_dir = tmp_path / "model"
    shutil.copytree(plain_model_dir(), model_dir)
    assert main(["export", "--transcriber", str(stt), "--out", str(model_dir)]) == 0
    model = pe.load(model_dir, device="cpu")
    try:
        for _ in range(2):
            with model.conversation(persona=False, greedy=True) as conv:
                heard = []
                for at in range(0, FRAMES * 1920, 1920):
                    conv.step(pcm[at:at + 1920])
                    heard.append(conv.core.heard_token)
                heard += conv.core.flush_heard()
            np.testing.assert_array_equal(heard, ref["text"])
    finally:
        model.close()


def test_the_transcriber_in_its_own_precision(tmp_path, capsys):
    """--transcriber-precision int8: the step stored as int8 (MatMulNBits), its weights tied to
    the checkpoint by verify's spot check, and every frame's token is moshi's (float32) on
    nearly every frame: each step fed moshi's token of the frame before (teacher-forced, so
    that one flip does not carry on), as tests/test_precision.py holds the LM's int8 to its
    float32 (>= 85 %; int8 rounding flips a few argmaxes of a random model's flat logits, a
    wrong weight layout or scale agrees by chance: ~1 / 200 here). `run --user-text-out`
    writes a record of every frame moshi steps."""
    import personaplex_edge as pe

    b = stt_bundle()
    out = tmp_path / "model_int8"
    assert main(["export", "--checkpoint", str(b.checkpoint), "--transcriber",
                 str(b.stt_checkpoint), "--transcriber-precision", "int8", "--out",
                 str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["graphs"]["transcriber_step"]["precision"] == "int8"
    assert manifest["graphs"]["helium_step"]["precision"] == "fp32"
    capsys.readouterr()
    assert main(["verify", "--model", str(out), "--checkpoint", str(b.checkpoint),
                 "--transcriber", str(b.stt_checkpoint)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines()
                if "transcriber_step" in x and "weight rows" in x)
    assert "int8" in line
    want = b.reference["text"]
    model = pe.load(out, device="cpu")
    try:
        with model.conversation(persona=False, greedy=True) as conv:
            rows, row = conv.core.group.transcriber, conv.core.row
            got = []
            for i in range(FRAMES):
                if i:  # the step reads the token of the frame before: moshi's
                    rows.last[row] = want[i - 1]
                conv.step(b.pcm[i * 1920:(i + 1) * 1920])
                got.append(conv.core.heard_token)
    finally:
        model.close()
    agree = np.mean(np.array(got) == want[:FRAMES])
    assert agree >= 0.85, (agree, got, want[:FRAMES].tolist())
    write_audio(tmp_path / "in.wav", b.pcm)
    assert main(["run", "--model", str(out), "--input", str(tmp_path / "in.wav"), "--output",
                 str(tmp_path / "o.wav"), "--user-text-out", str(tmp_path / "u.json"),
                 "--no-persona"]) == 0
    assert len(json.loads((tmp_path / "u.json").read_text())) == FRAMES + FLUSH


def test_a_transcriber_from_the_hub_by_its_id(tmp_path, monkeypatch, run_outputs):
    """`--transcriber OWNER/NAME`: Kyutai's layout fetched through huggingface_hub (a hub in
    memory, tests/fake_hub.py), only the files its config names, then added to an exported
    model: the same transcriber as from the directory."""
    import fake_hub

    b = stt_bundle()
    hub = fake_hub.FakeHub.for_test(monkeypatch, tmp_path)
    hub.publish_dir("kyutai/stt-tiny-candle", b.stt_checkpoint)
    model = tmp_path / "model"
    shutil.copytree(plain_model_dir(), model)
    assert main(["export", "--transcriber", "kyutai/stt-tiny-candle", "--out", str(model)]) == 0
    fetched = sorted(p.rsplit("/", 1)[-1] for p in hub.downloads())
    assert fetched == sorted(["config.json", "model.safetensors", b.stt_config["mimi_name"],
                              b.stt_config["tokenizer_name"]])
    manifest = json.loads((model / "manifest.json").read_text())
    assert manifest["transcriber"]["source"] == "kyutai/stt-tiny-candle"
    assert manifest["transcriber"]["source_revision"]
    work = run_outputs["work"]
    assert main(["run", "--model", str(model), "--input", str(work / "in.wav"),
                 "--output", str(tmp_path / "o.wav"), "--user-text-out", str(tmp_path / "u.json"),
                 "--greedy", "--no-persona"]) == 0
    assert json.loads((tmp_path / "u.json").read_text()) == run_outputs["user"]


def test_the_transcriber_runs_on_a_simulated_rtx_gpu_as_on_the_cpu(run_outputs, tmp_path,
                                                                    monkeypatch):
    """A model with a transcriber, exported for TensorRT, on a simulated RTX card
    (tests/fake_gpu.py: TensorRT for RTX's runtime calls, the engines computing on the CPU):
    the transcriber's engine is checked and loaded beside the LM's, and the user's words of
    `run --user-text-out` are moshi's, token for token, through the engines' buffers, their
    rings and the flush after the input."""
    import dataclasses
    import sys

    import fake_gpu

    from personaplex_edge.manifest import load_model_dir, write_manifest

    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    model, _ = fake_gpu.simulated_copy(stt_model_dir(), tmp_path / "model", monkeypatch,
                                       "tensorrt-rtx")
    write_manifest(model, dataclasses.replace(load_model_dir(model), backend="tensorrt"))
    work = run_outputs["work"]
    assert main(["run", "--model", str(model), "--input", str(work / "in.wav"), "--output",
                 str(tmp_path / "out.wav"), "--user-text-out", str(tmp_path / "user.json"),
                 "--greedy", "--no-persona", "--device", "cuda"]) == 0
    assert "transcriber_step.onnx" in sys.modules["tensorrt_rtx"].deserialized
    b = stt_bundle()
    want = _records(b.reference["text"], b.stt_checkpoint / b.stt_config["tokenizer_name"])
    assert json.loads((tmp_path / "user.json").read_text()) == want


def test_batch_writes_the_users_words_as_moshi_hears_them(run_outputs, short_reference,
                                                          tmp_path):
    """`batch` on a model with a transcriber writes each item's user words (NAME.user.json
    beside its text JSON): moshi's whole output on each file - a shorter recording, its speech
    running to its end, stepped beside the longer one on the same worker, included - and
    the answers `run` writes. A finished item missing its user words is not skipped on a
    rerun."""
    b = stt_bundle()
    work = run_outputs["work"]
    folder = tmp_path / "calls"
    folder.mkdir()
    pcm = read_audio(work / "in.wav")
    short, short_want = short_reference
    write_audio(folder / "whole.wav", pcm)
    write_audio(folder / "short.wav", short)
    answers = tmp_path / "answers"
    args = ["batch", "--model", str(stt_model_dir()), "--input", str(folder), "--output",
            str(answers), "--greedy", "--no-persona", "--workers", "1"]
    assert main(args) == 0
    want = _records(b.reference["text"], b.stt_checkpoint / b.stt_config["tokenizer_name"])
    assert json.loads((answers / "whole.user.json").read_text()) == want
    assert json.loads((answers / "short.user.json").read_text()) == short_want
    assert json.loads((answers / "whole.json").read_text()) == run_outputs["stt"][1]
    np.testing.assert_array_equal(read_audio(answers / "whole.wav"), run_outputs["stt"][0])
    (answers / "short.user.json").unlink()
    before = (answers / "whole.wav").stat().st_mtime_ns
    assert main(args) == 0
    assert (answers / "short.user.json").is_file()
    assert (answers / "whole.wav").stat().st_mtime_ns == before  # finished: skipped
