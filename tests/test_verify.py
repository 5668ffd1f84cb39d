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
        measured = found[("torch", name)]["measured"]["outputs"]
        assert measured.keys() == at_export["outputs"].keys()
        np.testing.assert_allclose(list(measured.values()), list(at_export["outputs"].values()),
                                   rtol=1e-3, atol=1e-9)
        assert max(measured.values()) <= 1e-4
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


def test_a_converted_language_model_is_left_to_its_hashes_and_signatures(tiny, tmp_path):
    from personaplex_edge.export.precision import convert_model_dir

    int4 = tmp_path / "int4"
    convert_model_dir(tiny, int4, "int4", progress=lambda s: None)
    code, report = _verify(tmp_path, int4, "--checkpoint", str(tiny.parent / "ckpt"))
    found = _by(report)
    assert code == 0
    assert "not compared: stored in int4" in found[("torch", "helium_step")]["detail"]
    assert found[("torch", "mimi_decoder")]["measured"]["how"] == "full"
