"""Every exported graph uses only ops that TensorRT's ONNX parser supports, and no If/Loop
(static graphs, so TensorRT and CUDA graphs can take them as they are)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest_lm import lm_bundle, lm_graphs

from personaplex_edge.export.onnx_export import graph_ops

OPS_FILE = Path(__file__).resolve().parents[1] / "export" / "trt_onnx_ops.txt"
FORBIDDEN = {"If", "Loop", "Scan"}  # control flow: shapes and work must not depend on data


def trt_ops() -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in OPS_FILE.read_text().splitlines())
    return {line for line in lines if line}


@pytest.fixture(scope="module")
def codec_graphs(tiny_codec_dir) -> list[Path]:
    """The tiny codec's graphs as `export` writes them."""
    return [tiny_codec_dir / "mimi_encoder.onnx", tiny_codec_dir / "mimi_decoder.onnx"]


@pytest.fixture(scope="module")
def lm_graph_paths() -> list[Path]:
    lm_bundle()
    graph_dir, entries = lm_graphs()
    return [graph_dir / e.file for e in entries.values()]


def test_op_list_is_trt_parser_list():
    ops = trt_ops()
    # a few anchors of the published support matrix, and ops it does not support
    assert {"MatMul", "TopK", "GatherElements", "ArgMax", "Softmax", "Conv"} <= ops
    assert not ops & {"Multinomial", "Unique", "StringNormalizer", "MatMulInteger"}


def _check(paths: list[Path]) -> None:
    allowed = trt_ops()
    for path in paths:
        ops = graph_ops(path)
        assert ops, f"{path.name}: no ops read"
        assert not ops & FORBIDDEN, f"{path.name} uses control flow {sorted(ops & FORBIDDEN)}"
        unsupported = sorted(ops - allowed)
        assert not unsupported, f"{path.name} uses ops TensorRT cannot parse: {unsupported}"


def test_codec_graphs_use_trt_ops_only(codec_graphs):
    _check(codec_graphs)


def test_lm_graphs_use_trt_ops_only(lm_graph_paths):
    _check(lm_graph_paths)
    assert "TopK" in graph_ops(lm_graph_paths[0])  # sampling happens inside the graph


def test_checker_catches_a_foreign_op(tmp_path):
    import onnx
    from onnx import helper

    node = helper.make_node("Unique", ["x"], ["y"])  # not in TensorRT's parser
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [4])],
                              [helper.make_tensor_value_info("y", 1, [None])])
    path = tmp_path / "foreign.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(AssertionError, match="Unique"):
        _check([path])


def test_checker_catches_control_flow(tmp_path):
    import onnx
    from onnx import helper

    def branch(name, value):
        const = helper.make_node("Constant", [], [f"{name}_out"],
                                 value=helper.make_tensor(f"{name}_v", 1, [1], [value]))
        return helper.make_graph([const], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", 1, [1])])

    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("then", 1.0),
                            else_branch=branch("else", 0.0))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", 9, [])],
                              [helper.make_tensor_value_info("y", 1, [1])])
    path = tmp_path / "branchy.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert "If" in trt_ops()  # the parser would take it; the project must not
    with pytest.raises(AssertionError, match="control flow"):
        _check([path])


# ---- the graphs TensorRT actually receives: converted for --backend tensorrt ------------------

TRT_PRECISIONS = ("fp16", "bf16", "int8", "int4", "fp8")


@pytest.fixture(scope="module")
def tensorrt_graphs(tmp_path_factory) -> dict[str, list[Path]]:
    """The tiny LM graphs in every TensorRT form (precision.convert_graph, as the export
    converts them)."""
    from personaplex_edge.export.precision import convert_graph
    from personaplex_edge.export.precision_plan import plan_for

    lm_bundle()
    graph_dir, entries = lm_graphs()
    out = {}
    for precision in TRT_PRECISIONS:
        d = tmp_path_factory.mktemp(f"trt-{precision}")
        plan = plan_for(precision, "tensorrt")
        out[precision] = []
        for entry in entries.values():
            convert_graph(graph_dir / entry.file, d / entry.file, entry, plan)
            out[precision].append(d / entry.file)
    return out


def _load(path: Path):
    import onnx

    return onnx.load(str(path), load_external_data=False)


def test_tensorrt_graphs_use_trt_ops_only(tensorrt_graphs):
    """fp16/bf16 islands and the DequantizeLinear weights, at the opset they are written in
    (21, for DequantizeLinear's block_size), stay within the parser's list, with no control
    flow and no onnxruntime-only op."""
    for precision, paths in tensorrt_graphs.items():
        _check(paths)
        for path in paths:
            model = _load(path)
            opset = {o.domain or "ai.onnx": o.version for o in model.opset_import}
            assert set(opset) == {"ai.onnx"}, (precision, path.name, opset)  # no com.microsoft
            if precision in ("int8", "int4", "fp8"):
                assert opset["ai.onnx"] == 21, (precision, path.name, opset)
                assert "DequantizeLinear" in graph_ops(path)


def test_tensorrt_weight_only_form(tensorrt_graphs):
    """Every DequantizeLinear dequantises a stored weight (an initializer of the precision's
    type) straight into a MatMul's B; int4 blocks run along K in whole blocks (K padded with
    zero rows, the activation padded by a constant Pad), int8 and fp8 have one scale per output
    channel. The tiny model's 176- and 88-wide layers exercise the padding."""
    from onnx import TensorProto, numpy_helper

    stored = {"int8": TensorProto.INT8, "int4": TensorProto.INT4,
              "fp8": TensorProto.FLOAT8E4M3FN}
    padded = 0
    for precision, want in stored.items():
        for path in tensorrt_graphs[precision]:
            graph = _load(path).graph
            inits = {t.name: t for t in graph.initializer}
            consumers: dict[str, list] = {}
            for node in graph.node:
                for i, name in enumerate(node.input):
                    consumers.setdefault(name, []).append((node, i))
            dqs = [n for n in graph.node if n.op_type == "DequantizeLinear"]
            assert dqs, (precision, path.name)
            for dq in dqs:
                q, scale = (inits[n] for n in dq.input[:2])
                attrs = {a.name: a.i for a in dq.attribute}
                assert q.data_type == want and scale.data_type == TensorProto.FLOAT16
                uses = consumers[dq.output[0]]
                assert [(n.op_type, i) for n, i in uses] == [("MatMul", 1)], dq.name
                k, n = q.dims
                if precision == "int4":
                    block = attrs["block_size"]
                    assert attrs["axis"] == 0 and k % block == 0, (dq.name, k, block)
                    assert list(scale.dims) == [k // block, n]
                    # the activation, back through the fp16 island's Cast
                    producer = {o: p for p in graph.node for o in p.output}
                    pad = producer.get(uses[0][0].input[0])
                    while pad is not None and pad.op_type == "Cast":
                        pad = producer.get(pad.input[0])
                    if pad is not None and pad.op_type == "Pad":  # K was ragged: padded to k
                        pads = numpy_helper.to_array(inits[pad.input[1]])
                        assert pads[-1] > 0 and not pads[:-1].any()
                        padded += 1
                else:
                    assert attrs.get("axis") == 1 and list(scale.dims) == [n]
    assert padded >= 2  # Helium's linear_out (K 176, block 64), the depformer's (K 88, 32)
