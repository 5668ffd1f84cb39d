"""Weight-only quantisation of a graph's linear layers: each float32 MatMul weight replaced by its
int8 / int4 / fp8 form (the numbers: weight_quant.py), in one of two graph forms:

    backend onnx       MatMulNBits (onnxruntime contrib op, CPU and CUDA), float32 activations;
                       accuracy_level 4 lets the CPU kernel use int8 dot products (measured on
                       this 2-core AVX-512 VNNI CPU: int8 with level 0 is 100x slower)
    backend tensorrt   DequantizeLinear on the weight -> MatMul, the form TensorRT's weight-only
                       quantisation parses (int4 needs opset 21 for block_size); the dequantised
                       weight takes the type of its scales (fp16), inside cast_islands.py's fp16
                       islands. TensorRT documents weight-only quantisation for INT4 only: for
                       int8 and fp8 it may fold the dequantised weight back to fp16 at build
                       time (see precision_plan.py's warning; the engine build says which).

int4 blocks run along K. Where K is not a whole number of blocks (a 176-wide tiny layer in
blocks of 64), the stored weight is padded with zero rows to whole blocks [K_pad, N], and the
activation is padded with zeros to K_pad in front of the MatMul: the product is unchanged (the
extra terms are 0 * 0), every block has the size the block_size attribute says (a ragged last
block is legal ONNX, but kernels that tile by block need whole ones), and the real 7B widths
(multiples of 128) need no padding at all.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph_edit import ONNX_TYPE, EditableGraph, SharedValue, as_dtype
from .precision_plan import PrecisionPlan
from .weight_quant import (block_for, matmulnbits_layout, quantize_blockwise, quantize_fp8,
                           quantize_per_channel)


def _is_linear(g: EditableGraph, node: onnx.NodeProto) -> bool:
    """A MatMul whose B is a float32 weight matrix."""
    w = node.input[1] if node.op_type == "MatMul" else None
    return (w in g.inits and len(g.inits[w].dims) == 2
            and g.inits[w].data_type == TensorProto.FLOAT)


class _Ranks:
    """The rank of a tensor, from shape inference run once, when first asked (weights are not
    read: only graphs with a ragged int4 K need it)."""

    def __init__(self, g: EditableGraph):
        self.g, self.ranks = g, None

    def __call__(self, name: str) -> int:
        if self.ranks is None:
            model = onnx.shape_inference.infer_shapes(self.g.model)
            self.ranks = {v.name: len(v.type.tensor_type.shape.dim)
                          for v in (*model.graph.value_info, *model.graph.input,
                                    *model.graph.output)
                          if v.type.tensor_type.HasField("shape")}
        if name not in self.ranks:
            raise AssertionError(f"the rank of {name} is unknown: cannot pad it")
        return self.ranks[name]


def _pad_last_axis(g: EditableGraph, nodes: list, x: str, rank: int, extra: int) -> str:
    """Appends a Pad of `x`'s last axis by `extra` zeros (constant pads, as TensorRT wants)."""
    pads = np.zeros(2 * rank, np.int64)  # [begin_0 .. begin_r-1, end_0 .. end_r-1]
    pads[-1] = extra
    pads_name = g.fresh(f"{x}.pads")
    g.put(numpy_helper.from_array(pads, pads_name))
    out = g.fresh(f"{x}.padded")
    nodes.append(helper.make_node("Pad", [x, pads_name], [out], name=g.fresh(f"/pad/{out}"),
                                  mode="constant"))
    return out


def _matmulnbits(g, node, plan, k, n, block, source, q_name, s_name):
    n_blocks = -(-k // block)
    shared = SharedValue(lambda: matmulnbits_layout(
        quantize_blockwise(source(), plan.bits, block)), uses=2)
    g.put_lazy(q_name, TensorProto.UINT8, [n, n_blocks, block * plan.bits // 8],
               lambda: shared.get()[0])  # [N, n_blocks, blob]
    g.put_lazy(s_name, TensorProto.FLOAT, [n * n_blocks],
               lambda: shared.get()[1].reshape(-1))  # [N * n_blocks]
    a = node.input[0]
    return [helper.make_node(
        "MatMulNBits", [a, q_name, s_name], list(node.output), name=node.name,
        domain="com.microsoft", K=k, N=n, bits=plan.bits, block_size=block,
        accuracy_level=plan.accuracy_level)]


def _dequantized(g, node, plan, k, n, block, source, q_name, s_name, rank_of):
    """DequantizeLinear(q, scales) -> MatMul, the weight [K, N] (int4: [K_pad, N])."""
    import ml_dtypes

    a, w = node.input
    nodes = []
    if plan.precision == "fp8":
        shared = SharedValue(lambda: quantize_fp8(source()), uses=2)
        q_type, q_dims, s_dims, attrs = TensorProto.FLOAT8E4M3FN, [k, n], [n], {"axis": 1}
    elif plan.bits == 4:
        n_blocks = -(-k // block)
        k_pad = n_blocks * block
        # the padded rows are zeros in quantize_blockwise's q and stay stored
        shared = SharedValue(lambda: (lambda bq: (bq.q.astype(ml_dtypes.int4), bq.scales))(
            quantize_blockwise(source(), 4, block)), uses=2)
        q_type, q_dims, s_dims = TensorProto.INT4, [k_pad, n], [n_blocks, n]
        attrs = {"axis": 0, "block_size": block}
        if k_pad != k:
            a = _pad_last_axis(g, nodes, a, rank_of(a), k_pad - k)
    else:
        shared = SharedValue(lambda: quantize_per_channel(source(), 8), uses=2)
        q_type, q_dims, s_dims, attrs = TensorProto.INT8, [k, n], [n], {"axis": 1}
    g.put_lazy(q_name, q_type, q_dims, lambda: shared.get()[0])
    g.put_lazy(s_name, ONNX_TYPE[plan.compute], s_dims,
               lambda: as_dtype(shared.get()[1], plan.compute))
    deq = g.fresh(f"{w}.dequantized")
    nodes.append(helper.make_node("DequantizeLinear", [q_name, s_name], [deq],
                                  name=g.fresh(f"{node.name}/dequantize"), **attrs))
    nodes.append(helper.make_node("MatMul", [a, deq], list(node.output), name=node.name))
    return nodes


def quantize_linears(g: EditableGraph, plan: PrecisionPlan) -> int:
    """Replaces every float32 linear weight by its `plan` form (module docstring); the
    numbers are made when the graph is written. Returns how many were replaced."""
    rank_of = _Ranks(g)
    nodes, count = [], 0
    for node in list(g.graph.node):
        if not _is_linear(g, node):
            nodes.append(node)
            continue
        w = node.input[1]
        k, n = (int(d) for d in g.inits[w].dims)  # [K, N]
        block = block_for(k, plan.block_size) if plan.block_size else 0
        names = (g.loader(w), g.fresh(f"{w}.q{plan.bits}"), g.fresh(f"{w}.scales"))
        if plan.weight_format == "matmulnbits":
            nodes += _matmulnbits(g, node, plan, k, n, block, *names)
        else:
            nodes += _dequantized(g, node, plan, k, n, block, *names, rank_of)
        count += 1
    g.replace_nodes(nodes)
    g.drop_unused()
    return count
