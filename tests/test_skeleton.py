"""scripts/gpu/skeleton.py: a model directory's graphs carried without their weights and made
again on an offline GPU machine (how the 7B's fp16 graphs reach one). What must hold there: the
graphs unchanged, every tensor at its offset, small and integer tensors exact, the made
weights at the original's scale, a manifest the runtime accepts, and an LM that runs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

onnx = pytest.importorskip("onnx")


def _tensors(model_dir: Path, graph: str) -> dict[str, tuple[dict, np.ndarray]]:
    """{initializer: (its external-data entry, its stored bytes)} of one graph."""
    model = onnx.load(str(model_dir / f"{graph}.onnx"), load_external_data=False)
    out = {}
    for init in model.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        where = {e.key: e.value for e in init.external_data}
        with open(model_dir / where["location"], "rb") as f:
            f.seek(int(where.get("offset", 0)))
            raw = np.frombuffer(f.read(int(where["length"])), np.uint8)
        out[init.name] = ({"dtype": init.data_type, **where}, raw)
    return out


@pytest.fixture(scope="module")
def filled(demo_model_dir, tmp_path_factory):
    import skeleton

    tmp = tmp_path_factory.mktemp("skeleton")
    skel = skeleton.make(demo_model_dir, tmp / "skeleton", ["helium_step", "depformer_step"],
                         keep_bytes=4096)
    return skel, skeleton.fill(skel, tmp / "filled")


def test_the_skeleton_carries_graphs_not_weights(demo_model_dir, filled):
    skel, _ = filled
    carried = sum(p.stat().st_size for p in skel.iterdir())
    weights = sum(p.stat().st_size for p in demo_model_dir.glob("*_step.onnx.data"))
    assert carried < weights / 4
    for graph in ("helium_step", "depformer_step"):
        assert (skel / f"{graph}.onnx").read_bytes() == \
            (demo_model_dir / f"{graph}.onnx").read_bytes()


def test_filled_tensors_sit_where_the_graph_reads_them(demo_model_dir, filled):
    """Same offsets and lengths; tensors under the threshold and integer ones byte for byte;
    the made floats at the original's mean and spread, and not a copy of it."""
    _, out = filled
    made = 0
    for graph in ("helium_step", "depformer_step"):
        original, again = _tensors(demo_model_dir, graph), _tensors(out, graph)
        assert original.keys() == again.keys()
        assert (out / f"{graph}.onnx.data").stat().st_size == \
            (demo_model_dir / f"{graph}.onnx.data").stat().st_size
        for name, (where, raw) in original.items():
            where2, raw2 = again[name]
            assert where == where2
            if where["dtype"] != onnx.TensorProto.FLOAT or raw.size < 4096:
                assert np.array_equal(raw, raw2), name
                continue
            a, b = raw.view(np.float32), raw2.view(np.float32)
            assert not np.array_equal(a, b), name
            # the spread rounded to two digits, and a small tensor's own sampling noise
            assert abs(b.std() - a.std()) <= 0.1 * a.std() + 1e-6, name
            assert abs(b.mean() - a.mean()) <= 0.15 * a.std() + 0.02 * abs(a.mean()), name
            made += 1
    assert made > 10


def test_the_filled_directory_loads_and_its_lm_runs(demo_model_dir, filled):
    """The manifest names the new data files' hashes (the runtime hashes every file it
    opens); the LM's hidden state is of the original's size - random weights of the right
    scale - while its tokens are its own."""
    from lm_probe import open_lm

    from personaplex_edge.manifest import load_model_dir

    _, out = filled
    manifest = load_model_dir(out, need="lm")
    assert set(manifest.graphs) == {"helium_step", "depformer_step"}
    user = np.random.default_rng(0).integers(0, manifest.config.audio_vocab_size, (12, 8))
    a = open_lm(demo_model_dir, "ort-cpu", threads=1).run(user)
    b = open_lm(out, "ort-cpu", threads=1).run(user)
    assert np.isfinite(b.hidden).all()
    assert abs(np.abs(b.hidden).mean() / np.abs(a.hidden).mean() - 1) < 0.1
    assert not np.array_equal(a.tokens, b.tokens)


def test_a_changed_data_file_is_refused(filled, tmp_path):
    """The hashes are the filled files' own: a damaged one is caught at load."""
    import shutil

    from personaplex_edge.errors import ModelDirError
    from personaplex_edge.manifest import load_model_dir

    _, out = filled
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with open(copy / "helium_step.onnx.data", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelDirError):
        load_model_dir(copy)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_weights_are_made_again_in_their_own_dtype(demo_model_dir, tmp_path,
                                                                  precision):
    """The 7B travels as its fp16 (or bf16) GPU graphs: their 16-bit tables and matrices are
    made again as 16-bit values of the original's mean and spread (decoded from the stored
    bytes, finite, not a copy), everything else byte for byte, and the directory loads."""
    import skeleton

    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.manifest import load_model_dir
    from personaplex_edge.voices import bf16_bits_to_float32

    half = tmp_path / precision
    convert_model_dir(demo_model_dir, half, precision, backend="tensorrt",
                      progress=lambda s: None)
    graphs = ["helium_step", "depformer_step"]
    out = skeleton.fill(skeleton.make(half, tmp_path / "skeleton", graphs, keep_bytes=4096),
                        tmp_path / "filled")
    load_model_dir(out, need="lm")  # the new data files' hashes
    wanted = onnx.TensorProto.FLOAT16 if precision == "fp16" else onnx.TensorProto.BFLOAT16
    made = 0
    for graph in graphs:
        original, again = _tensors(half, graph), _tensors(out, graph)
        for name, (where, raw) in original.items():
            raw2 = again[name][1]
            if where["dtype"] != wanted or raw.size < 4096:
                assert np.array_equal(raw, raw2), name
                continue
            bits, bits2 = raw.view(np.uint16), raw2.view(np.uint16)
            decode = ((lambda b: b.view(np.float16).astype(np.float32)) if precision == "fp16"
                      else bf16_bits_to_float32)
            a, b = decode(bits), decode(bits2)
            assert np.isfinite(b).all() and not np.array_equal(bits, bits2), name
            assert abs(b.std() - a.std()) <= 0.1 * a.std() + 1e-3, name
            assert abs(b.mean() - a.mean()) <= 0.15 * a.std() + 0.02 * abs(a.mean()), name
            made += 1
    assert made > 10
