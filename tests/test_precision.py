"""Lower-precision LM graphs (export/precision.py): they run in onnxruntime on the CPU through the
runtime's own graph objects (so the manifest's ring dtypes must agree with the graphs), choose
the float32 model's greedy tokens on most frames, store what the plan says, keep the sensitive
ops in float32, and the weight formats compute exactly what their dequantised weights do.

Agreement thresholds (tiny random model, 70 frames, teacher-forced: each precision is fed the
float32 run's tokens and its own choices compared) and why. A random model's logits are nearly
flat, so top-1 margins are tiny and any rounding flips some argmaxes; the tiny model is also
the worst case for blockwise formats (its depformer is 32 wide: one 4-bit block spans a whole
column). Measured: fp16 100% text / 99.8% audio; int8 ~97% / ~88%; int4 ~79% / ~25%. The
thresholds sit well below those and far above what a broken format gives (a wrong layout or
scale is chance: 1/32000 text, 1/2048 audio):
    fp16  text >= 0.95, audio >= 0.95     (fp16 keeps 11 bits: almost never flips)
    int8  text >= 0.85, audio >= 0.70
    int4  text >= 0.55, audio >= 0.12     (audio: a 4-bit 32-wide depformer on flat logits)
    fp8   text >= 0.80, audio >= 0.40     (e4m3 keeps 3 mantissa bits: ~93% / ~62% measured)
The mid-size benchmark (benchmarks/bench_precision.py) reports the real-width numbers.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from personaplex_edge.config import preset
from personaplex_edge.manifest import load_model_dir

FRAMES = 70
THRESHOLDS = {"fp16": (0.95, 0.95), "int8": (0.85, 0.70), "int4": (0.55, 0.12),
              "fp8": (0.80, 0.40)}
# ops that must see float32 inputs: RMSNorm (ReduceMean, Sqrt), softmax, RoPE (Cos, Sin),
# sampling (TopK, ArgMax)
FP32_OPS = {"ReduceMean", "Sqrt", "Softmax", "Cos", "Sin", "TopK", "ArgMax"}


@pytest.fixture(scope="module")
def fp32_dir(tmp_path_factory) -> Path:
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    root = tmp_path_factory.mktemp("precision")
    ckpt = write_synthetic_checkpoint(preset("tiny"), root / "ckpt")
    out = root / "fp32"
    export_model(resolve_checkpoint(str(ckpt)), out, progress=lambda s: None)
    return out


@pytest.fixture(scope="module")
def converted(fp32_dir) -> dict[str, Path]:
    """fp16, int8, int4 for onnxruntime; bf16 (a TensorRT precision: the export refuses it for
    onnxruntime) and int8/int4/fp8 in TensorRT's form (qdq-*)."""
    from personaplex_edge.export.precision import convert_model_dir

    out = {}
    for precision in ("fp16", "int8", "int4"):
        out[precision] = fp32_dir.parent / precision
        convert_model_dir(fp32_dir, out[precision], precision, progress=lambda s: None)
    out["bf16"] = fp32_dir.parent / "bf16"
    convert_model_dir(fp32_dir, out["bf16"], "bf16", backend="tensorrt", progress=lambda s: None)
    for precision in ("int8", "int4", "fp8"):
        out[f"qdq-{precision}"] = fp32_dir.parent / f"qdq-{precision}"
        convert_model_dir(fp32_dir, out[f"qdq-{precision}"], precision, backend="tensorrt",
                          progress=lambda s: None)
    out["int4+int8"] = fp32_dir.parent / "int4+int8"  # Helium int4, depformer int8
    convert_model_dir(fp32_dir, out["int4+int8"], "int4", progress=lambda s: None,
                      depformer_precision="int8")
    return out


@pytest.fixture(scope="module")
def user_codes() -> np.ndarray:
    cfg = preset("tiny")
    return np.random.default_rng(5).integers(0, cfg.audio_vocab_size, (FRAMES, 8))


@pytest.fixture(scope="module")
def fp32_tokens(fp32_dir, user_codes) -> np.ndarray:
    from lm_probe import GreedyLM

    return GreedyLM(fp32_dir, threads=1).run(user_codes).tokens


def _forced_agreement(model_dir: Path, user_codes, reference, backend: str = "onnx"):
    from lm_probe import GreedyLM, agreement

    manifest = dataclasses.replace(load_model_dir(model_dir), backend=backend)
    run = GreedyLM(model_dir, manifest, threads=1).run(user_codes, forced=reference)
    return agreement(run.tokens, reference)


@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
def test_greedy_tokens_agree_with_fp32(converted, user_codes, fp32_tokens, precision):
    a = _forced_agreement(converted[precision], user_codes, fp32_tokens)
    text, audio = THRESHOLDS[precision]
    assert a["text"] >= text and a["audio"] >= audio, (precision, a)


@pytest.mark.parametrize("precision", ["int8", "int4", "fp8"])
def test_tensorrt_weight_formats_run_on_cpu_and_agree(converted, user_codes, fp32_tokens,
                                                      precision):
    """The DequantizeLinear forms built for TensorRT also run in onnxruntime (CPU), which
    checks their numbers without a GPU."""
    a = _forced_agreement(converted[f"qdq-{precision}"], user_codes, fp32_tokens)
    text, audio = THRESHOLDS.get(precision, THRESHOLDS["int8"])
    assert a["text"] >= text and a["audio"] >= audio, (precision, a)


def test_manifest_records_precision_and_ring_dtypes(fp32_dir, converted):
    from personaplex_edge.export.precision import ring_dtypes_agree

    expect = {"fp16": "float16", "bf16": "bfloat16", "int8": "float32", "int4": "float32",
              "qdq-int4": "float16"}
    for name, kv in expect.items():
        manifest = load_model_dir(converted[name])  # also checks every sha256
        assert manifest.precision == name.removeprefix("qdq-")
        helium = manifest.graphs["helium_step"]
        assert helium.rings and {r.dtype for r in helium.rings} == {kv}
        assert ring_dtypes_agree(converted[name], helium) == []
        # the codec is not converted: byte-identical graphs
        for codec in ("mimi_encoder", "mimi_decoder"):
            assert manifest.graphs[codec].sha256 == load_model_dir(fp32_dir).graphs[codec].sha256
    assert load_model_dir(converted["qdq-int4"]).backend == "tensorrt"


def test_a_manifest_from_before_per_graph_precisions_reads_the_lm_as_its_precision(
        converted, tmp_path):
    """Model directories exported before graph entries carried their own precision: the LM
    graphs are read as the manifest's precision (an engine rebuild must not take them for
    float32), the codec as float32."""
    import json

    old = tmp_path / "old"
    shutil.copytree(converted["fp16"], old)
    data = json.loads((old / "manifest.json").read_text())
    for entry in data["graphs"].values():
        del entry["precision"]
    (old / "manifest.json").write_text(json.dumps(data))
    graphs = load_model_dir(old).graphs
    assert {n: g.precision for n, g in graphs.items()} == {
        "mimi_encoder": "fp32", "mimi_decoder": "fp32", "helium_step": "fp16",
        "depformer_step": "fp16"}


def test_stored_bytes_match_the_plan(fp32_dir, converted):
    """Bytes per frame counted in the graphs equal what the plan's layout predicts for the
    config, and shrink in the expected order."""
    from frame_bytes import (estimate_bytes_per_frame, layout_for,
                                                     model_bytes_per_frame)
    from personaplex_edge.export.precision_plan import plan_for

    cfg = preset("tiny")
    totals = {}
    uniform = [(n, p) for n, p in converted.items() if "+" not in n]  # mixed: its own test
    for name, path in [("fp32", fp32_dir)] + uniform:
        precision = name.removeprefix("qdq-")
        plan = plan_for(precision, "tensorrt" if name.startswith("qdq-") or name == "bf16"
                        else "onnx")
        counted = model_bytes_per_frame(path, load_model_dir(path))
        weights = counted["helium_step"] + counted["depformer_step"]
        est = estimate_bytes_per_frame(cfg, layout_for(plan))
        # the estimate leaves out norm gains, RoPE frequencies and constants (a few KB here)
        assert abs(weights - est["weights"]) <= 0.02 * est["weights"], (name, weights, est)
        assert counted["kv"] == est["kv"], name
        totals[name] = weights
    assert totals["fp16"] == pytest.approx(totals["fp32"] / 2, rel=0.01)
    assert totals["bf16"] == totals["fp16"]
    assert totals["int8"] < 0.6 * totals["fp16"]
    assert totals["int4"] < 0.65 * totals["int8"]


def _matmulnbits_bits(path: Path) -> set[int]:
    model = onnx.load(str(path), load_external_data=False)
    return {a.i for n in model.graph.node if n.op_type == "MatMulNBits"
            for a in n.attribute if a.name == "bits"}


def test_the_depformer_takes_its_own_precision(converted, user_codes, fp32_tokens):
    """int4 Helium + int8 depformer: each graph stores its own format and says so in the
    manifest; teacher-forced, the text tokens (Helium's alone) are exactly int4's, and the
    audio tokens (the depformer's) agree with float32 at least as often as with int4 alone."""
    from frame_bytes import (estimate_bytes_per_frame, layout_for,
                                                     model_bytes_per_frame)
    from personaplex_edge.export.precision_plan import plan_for

    mixed = converted["int4+int8"]
    manifest = load_model_dir(mixed)
    assert manifest.precision == "int4"
    assert {n: g.precision for n, g in manifest.graphs.items()} == {
        "mimi_encoder": "fp32", "mimi_decoder": "fp32", "helium_step": "int4",
        "depformer_step": "int8"}
    assert _matmulnbits_bits(mixed / "helium_step.onnx") == {4}
    assert _matmulnbits_bits(mixed / "depformer_step.onnx") == {8}
    counted = model_bytes_per_frame(mixed, manifest)
    est = estimate_bytes_per_frame(preset("tiny"), layout_for(plan_for("int4")),
                                   layout_for(plan_for("int8")))
    weights = counted["helium_step"] + counted["depformer_step"]
    assert abs(weights - est["weights"]) <= 0.02 * est["weights"], (weights, est)

    a_mixed = _forced_agreement(mixed, user_codes, fp32_tokens)
    a_int4 = _forced_agreement(converted["int4"], user_codes, fp32_tokens)
    assert a_mixed["text"] == a_int4["text"]
    assert a_mixed["audio"] >= a_int4["audio"], (a_mixed, a_int4)


def test_sensitive_ops_stay_float32(converted):
    """RMSNorm, softmax, RoPE and sampling see float32; every weight matrix is low precision."""
    for name in ("fp16", "bf16", "qdq-int4"):
        path = converted[name] / "helium_step.onnx"
        model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
        types = {v.name: v.type.tensor_type.elem_type
                 for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
        types.update({t.name: t.data_type for t in model.graph.initializer})
        checked = 0
        for node in model.graph.node:
            if node.op_type in FP32_OPS:
                assert types[node.input[0]] == onnx.TensorProto.FLOAT, (name, node.name)
                checked += 1
        assert checked >= 5
        floats = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
        # only vectors stay float32 (norm gains, RoPE frequencies), no matrices
        assert all(sum(d > 1 for d in t.dims) < 2 for t in floats), name


def test_weight_formats_compute_their_dequantised_weights():
    """MatMulNBits (our packing) and DequantizeLinear int4 / int8 / fp8 in onnxruntime equal a
    float32 product with the dequantised weight: the layouts are read as written."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from personaplex_edge.export.weight_quant import (matmulnbits_layout, pack_int4,
                                                      quantize_blockwise, quantize_fp8,
                                                      quantize_per_channel)

    rng = np.random.default_rng(0)
    k, n = 200, 48  # K not a multiple of the block: padding is exercised
    w = (rng.standard_normal((k, n)) / 10).astype(np.float32)
    a = rng.standard_normal((1, k)).astype(np.float32)

    def run(nodes, inits, opset):
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT,
                                                                         [1, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n])],
                              inits)
        m = helper.make_model(g, opset_imports=opset)
        opts = ort.SessionOptions()
        # onnxruntime fuses DequantizeLinear(int4) + MatMul into MatMulNBits with int8
        # activations by default; level 0 keeps float32 activations, so the product is exact
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
        sess = ort.InferenceSession(m.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        return sess.run(None, {"A": a})[0]

    for bits in (4, 8):
        bq = quantize_blockwise(w, bits, 32)
        packed, scales = matmulnbits_layout(bq)
        y = run([helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft",
                                  K=k, N=n, bits=bits, block_size=32, accuracy_level=0)],
                [numpy_helper.from_array(packed, "B"),
                 numpy_helper.from_array(scales.reshape(-1), "S")],
                [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        np.testing.assert_allclose(y, a @ bq.dequantize(), rtol=1e-4, atol=1e-5)
        # and the format is a fair approximation: error within a few steps of the grid
        assert np.abs(bq.dequantize() - w).max() <= np.abs(w).max() / (2 ** (bits - 1) - 1)

    bq = quantize_blockwise(w, 4, 32)
    y = run([helper.make_node("DequantizeLinear", ["Q", "S"], ["W"], axis=0, block_size=32),
             helper.make_node("MatMul", ["A", "W"], ["Y"])],
            [helper.make_tensor("Q", TensorProto.INT4, [k, n], pack_int4(bq.q[:k]), raw=True),
             numpy_helper.from_array(bq.scales, "S")], [helper.make_opsetid("", 21)])
    np.testing.assert_allclose(y, a @ bq.dequantize(), rtol=1e-4, atol=1e-5)

    for q, scales in (quantize_per_channel(w, 8), quantize_fp8(w)):
        y = run([helper.make_node("DequantizeLinear", ["Q", "S"], ["W"], axis=1),
                 helper.make_node("MatMul", ["A", "W"], ["Y"])],
                [numpy_helper.from_array(q, "Q"), numpy_helper.from_array(scales, "S")],
                [helper.make_opsetid("", 21)])
        np.testing.assert_allclose(y, a @ (q.astype(np.float32) * scales), rtol=1e-4,
                                   atol=1e-5)
        assert np.abs(y - a @ w).max() < 0.1 * np.abs(a @ w).max()


def test_refuses_what_it_cannot_do(fp32_dir, converted, tmp_path):
    from personaplex_edge.errors import PersonaPlexError
    from personaplex_edge.export.precision import convert_precision
    from personaplex_edge.export.precision_plan import plan_for

    with pytest.raises(PersonaPlexError, match="already int8"):
        convert_precision(converted["int8"], load_model_dir(converted["int8"]), "int4")
    with pytest.raises(PersonaPlexError, match="TensorRT precision"):
        plan_for("fp8", "onnx")
    with pytest.raises(PersonaPlexError, match="unknown precision"):
        plan_for("int3")
    # an impossible choice is refused before the export writes (or even loads) anything
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model

    said = []
    with pytest.raises(PersonaPlexError, match="TensorRT precision"):
        export_model(resolve_checkpoint(str(fp32_dir.parent / "ckpt")), tmp_path / "never",
                     precision="int4", depformer_precision="fp8", progress=said.append)
    assert said == [] and not (tmp_path / "never").exists()
    # bf16 for onnxruntime, whose runtime binds no bfloat16 buffers: refused the same way, with
    # what works instead
    for kwargs in ({"precision": "bf16"}, {"precision": "fp16", "kv_dtype": "bfloat16"},
                   {"precision": "int4", "depformer_precision": "bf16"}):
        with pytest.raises(PersonaPlexError, match="cannot run on onnxruntime.*--backend tensorrt"):
            export_model(resolve_checkpoint(str(fp32_dir.parent / "ckpt")), tmp_path / "never",
                         progress=said.append, **kwargs)
        assert said == [] and not (tmp_path / "never").exists()
    # in place (the export's staging use): the directory stays valid, its fp32 files replaced
    stage = tmp_path / "stage"
    shutil.copytree(fp32_dir, stage)
    manifest = convert_precision(stage, load_model_dir(stage), "fp16", progress=lambda s: None,
                                 depformer_precision="int8")
    from personaplex_edge.manifest import write_manifest

    write_manifest(stage, manifest)
    done = load_model_dir(stage)
    assert done.precision == "fp16"
    assert [done.graphs[g].precision for g in ("helium_step", "depformer_step")] == \
        ["fp16", "int8"]


def test_tensorrt_form_uses_only_ops_tensorrt_parses(converted):
    """What is converted for TensorRT (fp16/bf16 islands, DequantizeLinear weights) stays
    within TensorRT's ONNX op list, with no control flow; the onnx backend's int4 does not
    (MatMulNBits), which the engine build refuses with a message (tests/test_graph_ops.py checks
    the same forms converted graph by graph, with their weight layout)."""
    from test_graph_ops import FORBIDDEN, trt_ops

    from personaplex_edge.export.onnx_export import graph_ops

    allowed = trt_ops()
    for name in ("fp16", "bf16", "qdq-int8", "qdq-int4", "qdq-fp8"):
        for graph in ("helium_step", "depformer_step"):
            ops = graph_ops(converted[name] / f"{graph}.onnx")
            assert ops <= allowed and not ops & FORBIDDEN, (name, graph, ops - allowed)
    assert "com.microsoft.MatMulNBits" in graph_ops(converted["int4"] / "helium_step.onnx")


def test_the_command_line_offers_every_precision_the_export_knows():
    """The CLI's choices and the export's table both come from the contract, and every
    contract precision has a plan for some backend."""
    from personaplex_edge.cli import build_parser
    from personaplex_edge.contract import BACKENDS, PRECISIONS
    from personaplex_edge.export.precision_plan import plan_for

    export = build_parser()._subparsers._group_actions[0].choices["export"]
    choices = {a.dest: tuple(a.choices) for a in export._actions if a.choices}
    assert choices["precision"] == choices["depformer_precision"] == PRECISIONS
    assert choices["backend"] == BACKENDS
    for precision in PRECISIONS:
        assert plan_for(precision, "tensorrt").precision == precision


def test_a_bf16_model_on_the_cpu_is_one_message_with_what_works(converted, capsys):
    """bf16 graphs are TensorRT's: onnxruntime's CPU would fail on a MatMul it lacks. Loaded
    for the CPU (--device cpu, or auto without a GPU), the model is refused with the way out."""
    from personaplex_edge.cli import main
    from personaplex_edge.errors import ModelDirError
    from personaplex_edge.runtime.api import Model

    with pytest.raises(ModelDirError, match="helium_step, depformer_step are bfloat16.*fp16"):
        Model.load(converted["bf16"], device="cpu")
    rc = main(["bench", "--model", str(converted["bf16"]), "--frames", "2", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("error:") == 1 and "Traceback" not in err
