"""`personaplex-edge verify` on a good export and on exports tampered with in each way it must
catch: a file's bytes, a graph's signature, and weights changed together with their hash (only
the comparison with the checkpoint can see those)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from personaplex_edge.cli import main
from personaplex_edge.export.onnx_export import CHECK_ATOL
from personaplex_edge.manifest import MANIFEST, load_model_dir, sha256_file


@pytest.fixture
def tiny(tiny_export) -> Path:
    """The tiny model (codec and LM, random weights) exported in float32; its checkpoint
    beside it in ../ckpt."""
    return tiny_export


def _verify(tmp_path: Path, model: Path, *more: str) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    code = main(["verify", "--model", str(model), "--json", str(report), *more])
    return code, json.loads(report.read_text())


def _by(report: dict) -> dict[tuple[str, str], dict]:
    return {(f["check"], f["target"]): f for f in report["findings"]}


def test_a_good_export_passes_and_the_checkpoint_check_measures_what_the_export_did(
        tiny, tmp_path, capsys):
    code, report = _verify(tmp_path, tiny, "--checkpoint", str(tiny.parent / "ckpt"))
    assert code == 0 and report["ok"], capsys.readouterr().out
    found = _by(report)
    manifest = load_model_dir(tiny)
    files = {e.file for e in manifest.graphs.values()} | {
        f for e in manifest.graphs.values() for f in e.data_files} | set(manifest.files)
    assert {t for c, t in found if c == "sha256"} == files
    graphs = set(manifest.graphs)
    assert {t for c, t in found if c == "signature"} == graphs
    assert {t for c, t in found if c == "torch"} == graphs
    for name, entry in manifest.graphs.items():
        at_export = entry.check  # recorded by the export, against the same torch modules
        assert at_export["how"] == "full" and set(at_export["outputs"]) == {
            t.name for t in entry.outputs} | {r.output_name for r in entry.rings}
        record = found[("torch", name)]["measured"]
        measured = record["outputs"]
        # the same check as the export's: the same outputs over the same number of calls, each
        # within the bound both apply. The figures themselves are rounding noise (a few
        # float32 ulps, ~5e-7) whose last bits depend on the path onnxruntime takes on a given
        # CPU: comparing them to each other would only test the CPU.
        assert (record["how"], record["calls"]) == (at_export["how"], at_export["calls"])
        assert measured.keys() == at_export["outputs"].keys()
        assert max(measured.values()) <= CHECK_ATOL
        assert max(at_export["outputs"].values()) <= CHECK_ATOL
    assert capsys.readouterr().out.rstrip().endswith(f"{tiny}: verified")


def test_a_file_changed_after_the_export_is_named(tiny_codec_dir, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_codec_dir, model)
    graph = model / "mimi_decoder.onnx"
    data = bytearray(graph.read_bytes())
    data[-10] ^= 0xFF
    graph.write_bytes(bytes(data))
    code, report = _verify(tmp_path, model)
    assert code == 1 and not report["ok"]
    failed = [(f["check"], f["target"]) for f in report["findings"] if not f["ok"]]
    assert failed[0] == ("sha256", "mimi_decoder.onnx")
    # the bytes flipped may also leave the graph unreadable: only that graph is named
    assert {target.removesuffix(".onnx") for _, target in failed} == {"mimi_decoder"}
    assert "disagreement(s): sha256 mimi_decoder.onnx" in capsys.readouterr().out


def test_a_manifest_promising_another_signature_is_named(tiny_codec_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_codec_dir, model)
    data = json.loads((model / MANIFEST).read_text())
    data["graphs"]["mimi_encoder"]["outputs"][0]["shape"] = [1, 7]
    (model / MANIFEST).write_text(json.dumps(data))
    code, report = _verify(tmp_path, model)
    (failed,) = [f for f in report["findings"] if not f["ok"]]
    assert code == 1 and (failed["check"], failed["target"]) == ("signature", "mimi_encoder")
    assert "codes" in failed["detail"] and "(1, 7)" in failed["detail"]


def test_weights_changed_with_their_hash_are_caught_against_the_checkpoint(
        tiny_codec_dir, tiny_codec_checkpoint, tmp_path):
    import onnx
    from onnx import numpy_helper

    model = tmp_path / "model"
    shutil.copytree(tiny_codec_dir, model)
    path = model / "mimi_decoder.onnx"
    graph = onnx.load(str(path))
    init = max(graph.graph.initializer, key=lambda t: np.prod(t.dims))  # a real weight
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(graph, str(path))
    data = json.loads((model / MANIFEST).read_text())
    data["graphs"]["mimi_decoder"]["sha256"] = sha256_file(path)  # the hash made to agree
    (model / MANIFEST).write_text(json.dumps(data))

    code, report = _verify(tmp_path, model)
    assert code == 0  # hashes and signatures cannot see it
    code, report = _verify(tmp_path, model, "--checkpoint", str(tiny_codec_checkpoint))
    failed = [f for f in report["findings"] if not f["ok"]]
    assert code == 1 and [(f["check"], f["target"]) for f in failed] == [
        ("torch", "mimi_decoder")]
    assert "differs between onnxruntime and torch" in failed[0]["detail"]
    assert _by(report)[("torch", "mimi_encoder")]["ok"]


def _int4(tiny: Path, out: Path, **plan_changes) -> Path:
    import dataclasses

    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.export.precision_plan import lm_plans

    plans = {g: dataclasses.replace(p, **plan_changes) for g, p in lm_plans("int4").items()}
    convert_model_dir(tiny, out, "int4", plans=plans, progress=lambda s: None)
    return out


def test_a_converted_language_model_is_spot_checked_in_its_precision(tiny, tmp_path):
    """int4 weights cannot be held to float32's tolerance: each stored weight is made again
    from the checkpoint through the same conversion, three output channels at a time."""
    int4 = _int4(tiny, tmp_path / "int4")
    code, report = _verify(tmp_path, int4, "--checkpoint", str(tiny.parent / "ckpt"))
    found = _by(report)
    assert code == 0 and report["ok"]
    for graph in ("helium_step", "depformer_step"):
        f = found[("weights", graph)]
        assert f["ok"] and f["measured"]["weight_rows_compared"] > 0, f
        assert "int4 weights equal what the checkpoint makes" in f["detail"]
        assert ("torch", graph) not in found
    assert found[("torch", "mimi_decoder")]["measured"]["how"] == "full"


def test_a_converted_weight_changed_with_its_hash_is_caught(tiny, tmp_path):
    """One packed int4 byte of a row the spot check reads (the first output channel of the
    largest weight), its data file's hash made to agree: only the checkpoint can see it."""
    import onnx

    int4 = _int4(tiny, tmp_path / "int4")
    path = int4 / "helium_step.onnx"
    graph = onnx.load(str(path), load_external_data=False)
    packed = [t for t in graph.graph.initializer if t.data_type == onnx.TensorProto.UINT8
              and t.data_location == onnx.TensorProto.EXTERNAL]
    target = max(packed, key=lambda t: np.prod(t.dims))
    where = {e.key: e.value for e in target.external_data}
    data = int4 / where["location"]
    with open(data, "r+b") as f:
        f.seek(int(where.get("offset", 0)))
        byte = f.read(1)
        f.seek(int(where.get("offset", 0)))
        f.write(bytes([byte[0] ^ 0x77]))
    manifest = json.loads((int4 / MANIFEST).read_text())
    manifest["graphs"]["helium_step"]["data_files"][where["location"]] = sha256_file(data)
    (int4 / MANIFEST).write_text(json.dumps(manifest))

    code, report = _verify(tmp_path, int4)
    assert code == 0  # hashes and signatures cannot see it
    code, report = _verify(tmp_path, int4, "--checkpoint", str(tiny.parent / "ckpt"))
    failed = [f for f in report["findings"] if not f["ok"]]
    assert code == 1 and [(f["check"], f["target"]) for f in failed] == [
        ("weights", "helium_step")]
    assert "differs from the checkpoint" in failed[0]["detail"]
    assert _by(report)[("weights", "depformer_step")]["ok"]


def test_a_layout_this_version_does_not_write_is_said_not_compared(tiny, tmp_path):
    """int4 in blocks of 64 (a benchmark's layout; the export writes 32): its scales have
    another shape, so a comparison would be wrong, not the weights; it is left to the
    hashes, saying why."""
    int4 = _int4(tiny, tmp_path / "int4b64", block_size=64)
    code, report = _verify(tmp_path, int4, "--checkpoint", str(tiny.parent / "ckpt"))
    f = _by(report)[("weights", "helium_step")]
    assert code == 0 and f["ok"] and "not compared" in f["detail"]
    assert "not laid out as this version writes int4" in f["detail"]
