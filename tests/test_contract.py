"""The model-directory contract and the errors a user can act on."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from personaplex_edge import manifest as manifest_mod
from personaplex_edge.config import PersonaPlexConfig, preset
from personaplex_edge.errors import CheckpointError, ConfigError, ModelDirError, StateError
from personaplex_edge.export.hub import MIMI_FILE, resolve_checkpoint
from personaplex_edge.export.mimi import load_mimi
from personaplex_edge.export.model_export import export_model
from personaplex_edge.atomic import staged_dir
from personaplex_edge.manifest import MANIFEST, load_model_dir
from personaplex_edge.runtime.codec import Codec


def test_config_json_round_trip_and_overrides():
    cfg = preset("tiny")
    again = PersonaPlexConfig.from_dict(json.loads(cfg.to_json()))
    assert again == cfg
    # the published config.json carries no architecture fields: defaults are PersonaPlex-7B
    real = PersonaPlexConfig.from_dict({"model_type": "personaplex", "version": "7b-v1"})
    assert real.temporal_config.hidden_size == 4096 and real.mimi_config.samples_per_frame == 1920
    assert real.depformer_config.num_active_codebooks == 8 and real.text_embedding_rows == 32001
    partial = PersonaPlexConfig.from_dict({"mimi_config": {"num_filters": 8}})
    assert partial.mimi_config.num_filters == 8 and partial.mimi_config.hidden_size == 512


def test_config_rejects_unknown_and_inconsistent_fields():
    with pytest.raises(ConfigError, match="hidden_sise"):
        PersonaPlexConfig.from_dict({"temporal_config": {"hidden_sise": 10}})
    with pytest.raises(ConfigError, match="the SEANet hop"):
        PersonaPlexConfig.from_dict({"mimi_config": {"upsampling_ratios": [7, 6, 5, 4]}})


def _rewrite(src, dst, edit):
    tensors = load_file(str(src))
    edit(tensors)
    save_file(tensors, str(dst))


def test_checkpoint_missing_tensor_is_named(tiny_cfg, tiny_codec_checkpoint, tmp_path):
    key = "decoder_transformer.transformer.layers.1.linear2.weight"
    _rewrite(tiny_codec_checkpoint / MIMI_FILE, tmp_path / "m.safetensors",
             lambda t: t.pop(key))
    with pytest.raises(CheckpointError, match=f"missing tensor '{key}'"):
        load_mimi(tmp_path / "m.safetensors", tiny_cfg.mimi_config)


def test_checkpoint_misshaped_tensor_is_named(tiny_cfg, tiny_codec_checkpoint, tmp_path):
    key = "encoder.model.3.conv.conv.weight"

    def shrink(t):
        t[key] = t[key][:, :-1].contiguous()
    _rewrite(tiny_codec_checkpoint / MIMI_FILE, tmp_path / "m.safetensors", shrink)
    with pytest.raises(CheckpointError, match=rf"tensor '{key}' has shape"):
        load_mimi(tmp_path / "m.safetensors", tiny_cfg.mimi_config)


def test_config_that_disagrees_with_weights_names_the_tensor(tiny_codec_checkpoint, tiny_cfg):
    wider = PersonaPlexConfig.from_dict({"mimi_config": {**tiny_cfg.to_dict()["mimi_config"],
                                                  "num_filters": 8}}).mimi_config
    with pytest.raises(CheckpointError, match=r"tensor 'decoder\.model\.0\.conv\.conv\.weight' has shape \[64, 32, 7\], "
                       r"the config implies \[128, 32, 7\]"):
        load_mimi(tiny_codec_checkpoint / MIMI_FILE, wider)


def test_checkpoint_directory_without_mimi(tmp_path):
    with pytest.raises(CheckpointError, match=MIMI_FILE):
        resolve_checkpoint(str(tmp_path), with_lm=False)
    with pytest.raises(CheckpointError, match="neither a directory nor a hub repository"):
        resolve_checkpoint(str(tmp_path / "no" / "such" / "dir"), with_lm=False)


@pytest.fixture
def model_copy(tiny_codec_dir, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(tiny_codec_dir, dst)  # a copy: its files are hashed in their turn
    return dst


def test_manifest_hash_mismatch(model_copy):
    graph = model_copy / "mimi_decoder.onnx"
    data = bytearray(graph.read_bytes())
    data[-10] ^= 0xFF  # flip bits inside the last initializer
    graph.write_bytes(bytes(data))
    with pytest.raises(ModelDirError, match="mimi_decoder.onnx' does not match its sha256"):
        load_model_dir(model_copy)


def test_hash_is_checked_again_after_a_change(model_copy):
    load_model_dir(model_copy)  # verified and stamped
    graph = model_copy / "mimi_encoder.onnx"
    data = bytearray(graph.read_bytes())
    data[-10] ^= 0xFF
    graph.write_bytes(bytes(data))
    with pytest.raises(ModelDirError, match="does not match its sha256"):
        load_model_dir(model_copy)


def test_export_leaves_the_files_verified_so_the_first_run_does_not_hash(
        tiny_codec_checkpoint, tmp_path, monkeypatch):
    out = tmp_path / "fresh"
    export_model(resolve_checkpoint(str(tiny_codec_checkpoint), with_lm=False), out,
                 progress=lambda s: None)

    def no_hashing(path):
        raise AssertionError(f"{path} hashed again after the export verified it")

    stamps = json.loads(manifest_mod.stamp_path(manifest_mod.manifest_sha256(out)).read_text())
    manifest = json.loads((out / MANIFEST).read_text())
    assert {g["file"] for g in manifest["graphs"].values()} <= set(stamps)
    monkeypatch.setattr(manifest_mod, "sha256_file", no_hashing)
    load_model_dir(out)


def test_a_long_first_check_is_announced(model_copy, monkeypatch):
    monkeypatch.setattr(manifest_mod, "HASH_REPORT_BYTES", 1)
    said = []
    load_model_dir(model_copy, progress=said.append)
    assert len(said) == 1 and "GB of model files" in said[0]
    said.clear()
    load_model_dir(model_copy, progress=said.append)  # remembered: nothing to hash, no line
    assert said == []


def test_missing_graph_file(model_copy):
    (model_copy / "mimi_encoder.onnx").unlink()
    with pytest.raises(ModelDirError, match="'mimi_encoder.onnx' named in manifest.json is missing"):
        Codec.load(model_copy)


def test_manifest_of_another_version(model_copy):
    manifest = json.loads((model_copy / MANIFEST).read_text())
    manifest["format_version"] = 99
    (model_copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ModelDirError, match="format version 99"):
        load_model_dir(model_copy)


def test_directory_without_manifest(tmp_path):
    with pytest.raises(ModelDirError, match="not an exported model"):
        load_model_dir(tmp_path)
    with pytest.raises(ModelDirError, match="does not exist"):
        load_model_dir(tmp_path / "nowhere")


def test_manifest_that_disagrees_with_the_graph(model_copy):
    manifest = json.loads((model_copy / MANIFEST).read_text())
    manifest["graphs"]["mimi_encoder"]["state"][0]["shape"][-1] += 1
    (model_copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ModelDirError, match="disagrees with the manifest"):
        Codec.load(model_copy, device="cpu")


def test_wrong_or_missing_state_is_refused(tiny_codec_dir):
    codec = Codec.load(tiny_codec_dir, device="cpu")
    state = codec.encoder.state()
    name = next(iter(state))
    wrong = dict(state)
    wrong[name] = np.zeros(state[name].shape[:-1] + (state[name].shape[-1] + 1,),
                           state[name].dtype)
    with pytest.raises(StateError, match=f"state '{name}' must be"):
        codec.encoder.set_state(wrong)
    missing = dict(state)
    missing.pop(name)
    with pytest.raises(StateError, match="missing"):
        codec.encoder.set_state(missing)
    with pytest.raises(StateError, match="has no input 'audio'"):
        codec.encoder.set_input("audio", np.zeros((1, 1, 1920), np.float32))


def test_state_round_trip_resumes_the_stream(tiny_codec_dir):
    """Saving the state and restoring it later continues exactly where the stream was."""
    rng = np.random.default_rng(5)
    pcm = (rng.standard_normal(20 * 1920) * 0.2).astype(np.float32)
    codec = Codec.load(tiny_codec_dir, device="cpu")
    codec.encode(pcm[:10 * 1920])
    saved = codec.encoder.state()
    expected = codec.encode(pcm[10 * 1920:])
    codec.reset()
    codec.encoder.set_state(saved)
    np.testing.assert_array_equal(codec.encode(pcm[10 * 1920:]), expected)


def test_staged_dir_is_all_or_nothing(tmp_path):
    target = tmp_path / "out"
    with staged_dir(target) as stage:
        (stage / "a.txt").write_text("first")
    assert (target / "a.txt").read_text() == "first"
    with pytest.raises(RuntimeError):
        with staged_dir(target) as stage:
            (stage / "a.txt").write_text("second")
            raise RuntimeError("export failed half-way")
    assert (target / "a.txt").read_text() == "first"  # the old directory is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial left behind


def test_an_export_killed_between_its_renames_is_restored_not_removed(tmp_path):
    """A writer killed after moving the earlier directory aside and before putting the new one
    in place left the only complete copy in `.out.old-PID-*/out`, and no `out`: the next
    write puts it back (and says so) before anything else, so even a next write that fails
    leaves it there."""
    import subprocess

    from personaplex_edge.atomic import OLD_MARK

    dead = subprocess.Popen(["true"])
    dead.wait()  # a process id that no longer runs
    holder = tmp_path / f".out{OLD_MARK}{dead.pid}-x1y2"
    (holder / "out").mkdir(parents=True)
    (holder / "out" / "a.txt").write_text("first")
    said = []
    with pytest.raises(RuntimeError):
        with staged_dir(tmp_path / "out", progress=said.append) as stage:
            (stage / "a.txt").write_text("second")
            raise RuntimeError("this export failed too")
    assert (tmp_path / "out" / "a.txt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert len(said) == 1 and said[0].startswith(f"restored {tmp_path / 'out'}")


def test_export_and_runtime_import_nothing_of_each_other():
    """The arrow between the halves: export/ (torch) and runtime/ (no torch) meet only in
    personaplex_edge/ (the contract); neither imports the other."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for room, other in (("export", "runtime"), ("runtime", "export")):
        for path in (root / room).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):  # `from X import a` may import X.a
                    base = ("." * node.level) + (node.module or "")
                    names = [base] + [base.rstrip(".") + "." + a.name if node.module else
                                      base + a.name for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                for name in names:
                    parts = name.lstrip(".").split(".")
                    hit = (name.startswith("personaplex_edge.") and parts[1:2] == [other]) or (
                        name.startswith("..") and parts[:1] == [other])
                    assert not hit, f"{path.relative_to(root)} imports {name}"
