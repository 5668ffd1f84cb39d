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
