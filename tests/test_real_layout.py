"""A checkpoint directory in the exact published layout, end to end.

The directory is made from the `moshi` reference (tiny widths): Mimi and the LM under the
published file and key names (LM in bf16), a SentencePiece model trained here, and a voices.tgz
of torch `.pt` voice prompts in the reference's format built from the moshi LM's own embedding
tables. It goes through `resolve_checkpoint` + `export_model` (what `personaplex-edge export
--checkpoint DIR --out OUT` runs), and the exported graphs are compared with the reference.

Also here: the download path (hub metadata and hf_hub_download monkeypatched: gated, missing,
offline, truncated, disk full) and the memory bound of the frugal LM export at d = 1024.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest_lm import OrtLM, lm_bundle, lm_graphs, run_schedule

from personaplex_edge.errors import CheckpointError, VoiceError
from personaplex_edge.export import hub
from personaplex_edge.export.hub import (CONFIG_FILE, LM_FILE, MIMI_FILE, TOKENIZER_FILE,
                                         VOICES_FILE, resolve_checkpoint)
from personaplex_edge.export.synthetic import write_voices_tgz
from personaplex_edge.manifest import load_model_dir
from personaplex_edge.streams import NUM_STREAMS

VOICE_FRAMES = {"NATF0": 5, "NATF2": 7, "VARM1": 4}


def _voice_prompts(ref, cfg, seed=3) -> dict[str, dict[str, torch.Tensor]]:
    """Voice prompts as the reference saves them: the summed input embedding of each prompt
    frame ([N, 1, 1, D], bf16 like the model) from moshi's own tables, and a token ring."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    with torch.no_grad():
        for name, frames in VOICE_FRAMES.items():
            text = torch.randint(0, cfg.text_vocab_size, (frames,), generator=gen)
            audio = torch.randint(0, cfg.audio_vocab_size, (cfg.num_audio_codebooks, frames),
                                  generator=gen)
            emb = ref.text_emb(text) + sum(ref.emb[k](audio[k])
                                           for k in range(cfg.num_audio_codebooks))  # [N, D]
            cache = torch.randint(0, cfg.audio_vocab_size, (1, NUM_STREAMS, 4), generator=gen)
            out[name] = {"embeddings": emb[:, None, None, :].to(torch.bfloat16),
                         "cache": cache.to(torch.int64)}
    return out


@pytest.fixture(scope="module")
def published(tmp_path_factory, tiny_codec_checkpoint):
    """(checkpoint directory, voice prompts as saved)."""
    from personaplex_edge.export.synthetic import train_tokenizer

    bundle = lm_bundle()
    root = tmp_path_factory.mktemp("published")
    shutil.copyfile(tiny_codec_checkpoint / MIMI_FILE, root / MIMI_FILE)
    shutil.copyfile(tiny_codec_checkpoint / CONFIG_FILE, root / CONFIG_FILE)
    shutil.copyfile(bundle.checkpoint, root / LM_FILE)
    train_tokenizer(root / TOKENIZER_FILE)
    voices = _voice_prompts(bundle.ref, bundle.cfg)
    write_voices_tgz(root / VOICES_FILE, voices)
    return root, voices


@pytest.fixture(scope="module")
def exported(published, tmp_path_factory):
    from personaplex_edge.export.model_export import export_model

    out = tmp_path_factory.mktemp("exported") / "model"
    export_model(resolve_checkpoint(str(published[0])), out, progress=lambda s: None)
    return out, load_model_dir(out, need="lm")


# ---- the export ----------------------------------------------------------------------------------

def test_published_files_are_all_used(published):
    root, _ = published
    ckpt = resolve_checkpoint(str(root))
    assert (ckpt.mimi.name, ckpt.lm.name, ckpt.tokenizer.name, ckpt.voices.name) == (
        MIMI_FILE, LM_FILE, TOKENIZER_FILE, VOICES_FILE)
    from safetensors import safe_open

    with safe_open(str(root / LM_FILE), framework="pt") as f:
        assert f.get_slice("text_emb.weight").get_dtype() == "BF16"


def test_manifest_records_every_file(exported):
    out, manifest = exported
    assert manifest.contents == ["codec", "lm"]
    assert manifest.tokenizer == TOKENIZER_FILE and manifest.voices == "voices.npz"
    assert set(manifest.files) == {TOKENIZER_FILE, "voices.npz"}
    for name in ("helium_step", "depformer_step"):
        entry = manifest.graphs[name]
        # weights live in one external data file per graph, hashed in the manifest
        assert list(entry.data_files) == [f"{name}.onnx.data"]
        assert (out / f"{name}.onnx.data").stat().st_size > (out / entry.file).stat().st_size
    assert not any(p.name.startswith(".") for p in out.parent.iterdir())  # no staging left


def test_exported_lm_matches_moshi_lmgen(exported):
    out, manifest = exported
    bundle = lm_bundle()
    ours = OrtLM(manifest.config, out)
    zeros_text, zeros_audio = np.zeros((1, 250), np.float32), np.zeros((1, 8, 250), np.float32)

    def frame(tokens, position):
        text, audio, _ = ours.frame(tokens, position, zeros_text, zeros_audio)
        return text, audio

    text, audio, outputs = run_schedule(manifest.config, bundle.user_codes, frame)
    ref = bundle.ref_run
    np.testing.assert_array_equal(text, ref["text"].numpy())
    np.testing.assert_array_equal(audio, ref["audio"].numpy())
    np.testing.assert_array_equal(outputs, ref["outputs"].numpy())
    assert len(np.unique(audio[:, 0])) > 10


def test_frugal_graphs_equal_the_in_memory_export(exported):
    """Same inputs, same outputs: the streamed weights are the in-memory path's weights."""
    import onnxruntime as ort

    from personaplex_edge.export.lm import depformer_inputs, example_inputs, helium_inputs

    out, manifest = exported
    normal_dir, _ = lm_graphs()  # export_lm_graphs: weights held in memory, inline
    cfg = manifest.config
    for name, specs in (("helium_step", helium_inputs(cfg, 1, 250)),
                        ("depformer_step", depformer_inputs(cfg, 1, 250))):
        feed = example_inputs(specs, cfg, seed=11)
        want = ort.InferenceSession(str(normal_dir / f"{name}.onnx")).run(None, feed)
        got = ort.InferenceSession(str(out / f"{name}.onnx")).run(None, feed)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            # the same graph with the same weights: equal up to rounding (onnxruntime may take
            # another kernel path on another CPU); one wrong weight moves outputs far more
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max()))


def test_exported_codec_matches_moshi(exported, tiny_cfg, tiny_mimi_ref):
    from moshi_reference import reference_stream

    from personaplex_edge.runtime.codec import Codec

    out, manifest = exported
    frames = 6
    gen = torch.Generator().manual_seed(5)
    pcm = torch.randn(frames * tiny_cfg.mimi_config.samples_per_frame, generator=gen) * 0.2
    want, _ = reference_stream(tiny_mimi_ref, pcm, tiny_cfg.mimi_config.samples_per_frame)
    codec = Codec.load(out, device="cpu", threads=1)
    np.testing.assert_array_equal(codec.encode(pcm.numpy()), want.numpy())


# ---- the voice bank ------------------------------------------------------------------------------

def test_voice_bank_holds_the_reference_voices_exactly(exported, published):
    from personaplex_edge.voices import available_voices, load_voice

    out, manifest = exported
    _, saved = published
    assert available_voices(out, manifest) == sorted(VOICE_FRAMES)
    for name in VOICE_FRAMES:
        voice = load_voice(out, manifest, f"{name}.pt")  # the reference's spelling works too
        want = saved[name]["embeddings"].float().reshape(VOICE_FRAMES[name], -1).numpy()
        assert voice.embeddings.dtype == np.float32 and voice.cache.dtype == np.int64
        np.testing.assert_array_equal(voice.embeddings, want)  # bf16 kept bit for bit
        np.testing.assert_array_equal(voice.cache, saved[name]["cache"][0].numpy())
        assert voice.cache.shape == (NUM_STREAMS, 4)
    assert load_voice(out, manifest, "natf2").name == "NATF2"


def test_unknown_voice_lists_the_known_ones(exported):
    from personaplex_edge.voices import load_voice

    out, manifest = exported
    with pytest.raises(VoiceError, match="NATF0, NATF2, VARM1"):
        load_voice(out, manifest, "NATM9")


def test_voice_bank_of_another_model_is_refused(published, tmp_path):
    from personaplex_edge.config import preset
    from personaplex_edge.export.voices import convert_voice_bank

    cfg = preset("tiny")
    wider = cfg.from_dict({**cfg.to_dict(), "temporal_config": {
        **cfg.to_dict()["temporal_config"], "hidden_size": 128, "head_dim": 32}})
    with pytest.raises(CheckpointError, match=r"NATF0 has embeddings \[5, 1, 1, 64\]"):
        convert_voice_bank(published[0] / VOICES_FILE, tmp_path / "v.npz", wider)
    (tmp_path / "bad.tgz").write_bytes(b"not a tarball")
    with pytest.raises(CheckpointError, match="not a readable .tgz"):
        convert_voice_bank(tmp_path / "bad.tgz", tmp_path / "v.npz", cfg)


# ---- damaged local checkpoints -------------------------------------------------------------------

def _copy(published, tmp_path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(published[0], root)
    return root


def test_truncated_lm_fails_before_the_export(published, tmp_path):
    from personaplex_edge.cli import main

    root = _copy(published, tmp_path)
    size = (root / LM_FILE).stat().st_size
    with open(root / LM_FILE, "r+b") as f:
        f.truncate(size - 1000)  # an interrupted download
    with pytest.raises(CheckpointError, match=rf"{LM_FILE} is truncated: {size - 1000:,} bytes"):
        resolve_checkpoint(str(root))
    assert main(["export", "--checkpoint", str(root), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_cut_header_and_broken_tokenizer(published, tmp_path):
    root = _copy(published, tmp_path)
    (root / MIMI_FILE).write_bytes((root / MIMI_FILE).read_bytes()[:100])
    with pytest.raises(CheckpointError, match=f"{MIMI_FILE} is not a readable safetensors"):
        resolve_checkpoint(str(root))
    root = _copy(published, tmp_path / "b")
    (root / TOKENIZER_FILE).write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="not a readable SentencePiece model"):
        resolve_checkpoint(str(root))


# ---- the hub -------------------------------------------------------------------------------------

REPO = "nvidia/personaplex-7b-v1"


def _hub_error(cls, message):
    """huggingface_hub's HTTP errors need a live response; only the type matters here."""
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    return err


@pytest.fixture
def fake_hub(published, monkeypatch, tmp_path):
    """The published directory served as a hub repository: metadata and downloads patched,
    nothing cached yet. Returns a namespace whose fields a test changes to break things."""
    import huggingface_hub

    root = published[0]
    state = SimpleNamespace(
        sizes={p.name: p.stat().st_size for p in root.iterdir()},
        info_error=None, download_error={}, downloaded=[], free=10 ** 12)

    def get_paths_info(self, repo, paths, **kw):
        assert repo == REPO
        if state.info_error is not None:
            raise state.info_error
        return [SimpleNamespace(path=p, size=state.sizes[p]) for p in paths if p in state.sizes]

    def hf_hub_download(repo, name, **kw):
        if name in state.download_error:
            raise state.download_error[name]
        if name not in state.sizes:
            raise _hub_error(huggingface_hub.errors.EntryNotFoundError, name)
        state.downloaded.append(name)
        return str(root / name)

    monkeypatch.setattr(huggingface_hub.HfApi, "get_paths_info", get_paths_info)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr(hub.shutil, "disk_usage",
                        lambda p: SimpleNamespace(total=state.free, used=0, free=state.free))
    return state


def test_hub_download_gives_the_same_files(fake_hub, published):
    lines = []
    ckpt = resolve_checkpoint(REPO, progress=lines.append)
    assert ckpt.source == REPO and ckpt.lm == published[0] / LM_FILE
    assert sorted(fake_hub.downloaded) == sorted(
        [CONFIG_FILE, MIMI_FILE, LM_FILE, TOKENIZER_FILE, VOICES_FILE])
    codec_only = resolve_checkpoint(REPO, with_lm=False, progress=lines.append)
    assert codec_only.lm is None and codec_only.voices is None


def test_hub_gated_repo(fake_hub):
    from huggingface_hub.errors import GatedRepoError

    fake_hub.info_error = _hub_error(GatedRepoError, "401")
    with pytest.raises(CheckpointError, match="gated.*accept its licence.*HF_TOKEN"):
        resolve_checkpoint(REPO, progress=lambda s: None)
    assert fake_hub.downloaded == [CONFIG_FILE]  # no weights
    # metadata unavailable (offline): the download itself says so
    fake_hub.downloaded.clear()
    fake_hub.info_error = RuntimeError("no network")
    fake_hub.download_error[MIMI_FILE] = _hub_error(GatedRepoError, "401")
    with pytest.raises(CheckpointError, match="gated"):
        resolve_checkpoint(REPO, progress=lambda s: None)
    assert fake_hub.downloaded == [CONFIG_FILE]


def test_hub_missing_file_fails_before_any_download(fake_hub):
    del fake_hub.sizes[LM_FILE]
    with pytest.raises(CheckpointError, match=f"has no file {LM_FILE}"):
        resolve_checkpoint(REPO, progress=lambda s: None)
    assert fake_hub.downloaded == [CONFIG_FILE]  # read first: it may name the Mimi file


def test_hub_offline_and_not_cached(fake_hub):
    from huggingface_hub.errors import LocalEntryNotFoundError

    fake_hub.info_error = RuntimeError("offline")
    fake_hub.download_error[VOICES_FILE] = LocalEntryNotFoundError("not cached")
    lines = []
    assert resolve_checkpoint(REPO, progress=lines.append).voices is None  # optional: skipped
    assert any(VOICES_FILE in line and "going on without it" in line for line in lines)
    fake_hub.download_error[LM_FILE] = LocalEntryNotFoundError("not cached")
    with pytest.raises(CheckpointError, match=f"cannot download {LM_FILE}.*not in the local cache"):
        resolve_checkpoint(REPO, progress=lambda s: None)


def test_hub_size_disagreeing_with_the_download(fake_hub):
    fake_hub.sizes[TOKENIZER_FILE] += 10  # the hub's file is longer than what arrived
    with pytest.raises(CheckpointError, match=f"{TOKENIZER_FILE} has .* the hub says"):
        resolve_checkpoint(REPO, progress=lambda s: None)


def test_hub_download_that_cannot_fit(fake_hub):
    fake_hub.sizes[LM_FILE] = 16_742_874_000 + 8  # the real size, say
    fake_hub.free = 5 * 10 ** 9
    with pytest.raises(CheckpointError, match=r"needs 16\.7 GB .* 5\.0 GB free.*HF_HUB_CACHE"):
        resolve_checkpoint(REPO, progress=lambda s: None)
    assert fake_hub.downloaded == [CONFIG_FILE]


def test_the_configs_mimi_name_chooses_the_codec_file(fake_hub, published, tmp_path):
    """The seed's mimi_name names the Mimi file, on the hub and in a local directory; a name
    that is a path is refused (it would leave the checkpoint)."""
    root = published[0]
    local = tmp_path / "renamed"
    shutil.copytree(root, local)
    (local / MIMI_FILE).rename(local / "mimi-v2.safetensors")
    config = json.loads((local / CONFIG_FILE).read_text())
    config["mimi_name"] = "mimi-v2.safetensors"
    (local / CONFIG_FILE).write_text(json.dumps(config))
    assert resolve_checkpoint(str(local)).mimi == local / "mimi-v2.safetensors"
    (local / "mimi-v2.safetensors").rename(local / MIMI_FILE)
    with pytest.raises(CheckpointError, match="has no mimi-v2.safetensors"):
        resolve_checkpoint(str(local))
    config["mimi_name"] = "../elsewhere.safetensors"
    (local / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="must be a file name inside the checkpoint"):
        resolve_checkpoint(str(local))
    # on the hub: the file the config names is the one asked for
    config["mimi_name"] = "mimi-v2.safetensors"
    published_config = (root / CONFIG_FILE).read_text()
    try:
        (root / CONFIG_FILE).write_text(json.dumps(config))
        with pytest.raises(CheckpointError, match="has no file mimi-v2.safetensors"):
            resolve_checkpoint(REPO, progress=lambda s: None)
    finally:
        (root / CONFIG_FILE).write_text(published_config)


# ---- the memory bound ----------------------------------------------------------------------------

_RSS_CHILD = r"""
import glob, json, os, sys
os.environ.setdefault("NO_TORCH_COMPILE", "1")
from safetensors.torch import save_file
from personaplex_edge.config import PersonaPlexConfig
from personaplex_edge.export.synthetic import random_lm_tensors
cfg = PersonaPlexConfig.from_dict(json.loads(sys.argv[1]))
ckpt, out = sys.argv[2], sys.argv[3]
if not os.path.exists(ckpt):  # its own process: the writer's memory must not count
    save_file(random_lm_tensors(cfg), ckpt)
    sys.exit(0)
from personaplex_edge.export.lm import export_lm_graphs_frugal
def peak_rss():
    # VmHWM belongs to this process's own address space, new at exec; ru_maxrss would carry
    # the forking parent's resident size (a big pytest process) into the child
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
base = peak_rss()
export_lm_graphs_frugal(cfg, ckpt, out)
print(json.dumps({"base": base, "peak": peak_rss(),
                  "written": sum(os.path.getsize(p) for p in glob.glob(out + "/*.onnx.data"))}))
"""


@pytest.mark.slow
def test_frugal_export_memory_bound(tmp_path):
    """d = 1024, text vocab 32000, 2 layers: peak RSS of the whole export (check included) within
    1.3 x the float32 weights written + 1 GB. Holding the weights in torch and in onnxruntime at
    once (the in-memory path) needs ~2.5 GB here and fails it."""
    cfg = {"temporal_config": {"hidden_size": 1024, "num_hidden_layers": 2,
                               "num_attention_heads": 8, "intermediate_size": 2816,
                               "max_position_embeddings": 250},
           "depformer_config": {"hidden_size": 256, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "head_dim": 64,
                                "intermediate_size": 704}}
    args = [sys.executable, "-c", _RSS_CHILD, json.dumps(cfg), str(tmp_path / "lm.safetensors"),
            str(tmp_path / "out")]
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    subprocess.run(args, check=True, env=env)
    run = subprocess.run(args, check=True, env=env, capture_output=True, text=True)
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert r["written"] > 0.55e9  # the weights really were written (~0.62 GB of float32)
    assert r["peak"] <= 1.3 * r["written"] + 1e9, r


def test_reduced_check_for_graphs_too_large_to_run(tmp_path, monkeypatch):
    """With too little memory for a full check, a one-layer probe is checked and every weight
    spot-checked; a damaged weight in the data file is caught by the spot check."""
    from personaplex_edge.export import lm
    from personaplex_edge.export.safetensors_file import SafetensorsHeader
    from personaplex_edge.export.onnx_export import ExportMismatch

    bundle = lm_bundle()
    monkeypatch.setattr(lm, "available_memory", lambda: 1 << 20)  # 1 MB available
    lines = []
    entries = lm.export_lm_graphs_frugal(bundle.cfg, bundle.checkpoint, tmp_path,
                                         progress=lines.append)
    assert sum("one-layer probe checked" in line for line in lines) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{n}.onnx{x}" for n in entries for x in ("", ".data"))  # the probes are gone
    header = SafetensorsHeader(bundle.checkpoint, rename=lm._canonical_key)
    plans = lm.depformer_plan(bundle.cfg)
    # three rows (first, middle, last) of every segment; norms have a single row
    assert lm.spot_check_weights(tmp_path / "depformer_step.onnx", plans, header) > 2 * len(plans)
    import onnx

    model = onnx.load(str(tmp_path / "depformer_step.onnx"), load_external_data=False)
    init = next(t for t in model.graph.initializer if t.name.endswith("in_projs.7.weight"))
    offset = int(next(e.value for e in init.external_data if e.key == "offset"))
    with open(tmp_path / "depformer_step.onnx.data", "r+b") as f:
        f.seek(offset)
        f.write(np.float32(1e3).tobytes())  # the first element of step 7's slice
    # the slice's first row in the packed tensor
    row = 7 * 3 * bundle.cfg.depformer_config.hidden_size
    with pytest.raises(ExportMismatch, match=rf"in_projs\.7\.weight row {row} of "
                                             r"'depformer\.layers\.0\.self_attn\.in_proj"):
        lm.spot_check_weights(tmp_path / "depformer_step.onnx", plans, header)


def test_a_weight_written_wrong_in_its_precision_is_caught(tmp_path, monkeypatch):
    """The weights are written in their precision straight from the checkpoint: the spot check
    makes a middle output channel of each again (torch's bf16 conversion, the same passes) and
    finds one written wrong in the int4 data, naming the weight, row and checkpoint tensor."""
    from personaplex_edge.export import external_data, lm
    from personaplex_edge.export.onnx_export import ExportMismatch
    from personaplex_edge.export.precision_plan import lm_plans

    bundle = lm_bundle()
    plans = lm_plans("int4", depformer_precision="int8")
    lines = []
    entries = lm.export_lm_graphs_frugal(bundle.cfg, bundle.checkpoint, tmp_path / "good",
                                         progress=lines.append, precisions=plans)
    assert (entries["helium_step"].precision, entries["depformer_step"].precision) == (
        "int4", "int8")
    assert sum("spot-checked" in line for line in lines) == 2
    n = 2 * bundle.cfg.temporal_config.intermediate_size  # linear_in's output channels
    add = external_data.ExternalDataFile.add

    def damaged(self, name, data_type, dims, chunks, nbytes):
        if name == "owner.layers.1.gating.linear_in.weight.T.q4":  # [N, blocks, blob] uint8
            raw = bytearray(b"".join(bytes(c) for c in chunks))
            raw[(n // 2) * (nbytes // n)] ^= 0x11  # the middle channel's first byte
            chunks = [bytes(raw)]
        return add(self, name, data_type, dims, chunks, nbytes)

    monkeypatch.setattr(external_data.ExternalDataFile, "add", damaged)
    with pytest.raises(ExportMismatch, match=rf"linear_in\.weight\.T\.q4 row {n // 2} of "
                                             r"'transformer\.layers\.1\.gating\.linear_in"):
        lm.export_lm_graphs_frugal(bundle.cfg, bundle.checkpoint, tmp_path / "bad",
                                   precisions=plans)


def test_export_that_cannot_fit_on_disk(published, tmp_path, monkeypatch):
    from personaplex_edge.errors import PersonaPlexError
    from personaplex_edge.export import model_export

    ckpt = resolve_checkpoint(str(published[0]))
    need = model_export.output_bytes(ckpt)
    assert need > (published[0] / LM_FILE).stat().st_size  # bf16 -> float32 (less 8 steps)
    monkeypatch.setattr(model_export.shutil, "disk_usage",
                        lambda p: SimpleNamespace(total=need, used=need - 1000, free=1000))
    with pytest.raises(PersonaPlexError, match=r"the export \(fp32\) needs .* GB free"):
        model_export.export_model(ckpt, tmp_path / "out", progress=lambda s: None)
    assert not (tmp_path / "out").exists()
    # each weight is written once, in its precision, with no float32 copy first: the peak is
    # the model itself, smaller for each narrower precision; engines add about their graphs
    peaks = {p: model_export.output_bytes(ckpt, p) for p in ("int4", "int8", "fp16")}
    assert peaks["int4"] < peaks["int8"] < peaks["fp16"] < need
    assert peaks["fp16"] < model_export.output_bytes(ckpt, "fp16", engines=True) \
        < 2 * peaks["fp16"]
