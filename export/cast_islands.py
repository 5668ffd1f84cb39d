"""fp16 / bf16 islands: low-precision storage of a graph's big tensors, float32 everywhere else.

Per frame the LM reads every weight once and its whole KV ring, for one token: it is memory
bound, so precision is about bytes. This pass therefore stores in low precision what is big and
keeps in float32 what is small and sensitive:

    low precision   weight matrices (MatMul B), embedding tables, the KV ring (inputs
                    `past_key_values.*` and the row outputs `present.*`)
    float32         activations between ops, RMSNorm, RoPE, softmax and its mask, residual
                    adds, logits and the in-graph sampling; graph inputs and outputs other than
                    the ring keep their dtypes, so the runtime's host buffers do not change

Each fp16/bf16 product is an island: MatMul(cast(x), W_low) -> cast back to float32. A low
tensor may pass through layout ops (Transpose, Reshape, Slice, Gather of table rows) before it
reaches a MatMul; any other op gets a cast to float32 in front. Activations are one row per
frame, so the casts cost nothing next to the weights. A DequantizeLinear (linear_quant.py)
yields the type of its scales, so dequantised weights join the same islands.
"""

from __future__ import annotations

from typing import Iterable

import onnx
from onnx import TensorProto, helper

from .graph_edit import FLOAT_TYPES, ONNX_TYPE, EditableGraph, as_dtype

# ops that move or select elements without arithmetic: a low-precision tensor passes through
LAYOUT_OPS = {"Transpose", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Slice", "Gather",
              "Flatten", "Expand"}


def _matrix(t: TensorProto) -> bool:
    """Two or more axes longer than one: a weight or a table, not a gain or a frequency vector."""
    return t.data_type in FLOAT_TYPES and sum(d > 1 for d in t.dims) >= 2


def lower_precision(g: EditableGraph, low: str, ring_inputs: Iterable[str],
                    ring_outputs: Iterable[str], kv_dtype: str) -> None:
    """Stores float matrices in `low`, types the ring as `kv_dtype`, and inserts the casts that
    keep everything else float32 (see the module docstring)."""
    low_type, kv_type = ONNX_TYPE[low], ONNX_TYPE[kv_dtype]
    ring_inputs, ring_outputs = set(ring_inputs), set(ring_outputs)
    dtype_of: dict[str, int] = {}  # tensors held in a non-float32 float type, and which
    for name, t in list(g.inits.items()):
        if _matrix(t) and t.data_type == TensorProto.FLOAT and low_type != TensorProto.FLOAT:
            source = g.loader(name)
            g.put_lazy(name, low_type, list(t.dims),
                       lambda source=source: as_dtype(source(), low))
            dtype_of[name] = low_type
        elif t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
            dtype_of[name] = t.data_type  # e.g. the scales of dequantised weights
    for v in g.graph.input:
        if v.name in ring_inputs and kv_type != TensorProto.FLOAT:
            v.type.tensor_type.elem_type = kv_type
            dtype_of[v.name] = kv_type

    nodes: list[onnx.NodeProto] = []
    casts: dict[tuple[str, int], str] = {}  # (tensor, type) -> its cast (one per tensor)

    def cast(src: str, to: int, base: str) -> str:
        if (src, to) not in casts:
            out = g.fresh(base)
            nodes.append(helper.make_node("Cast", [src], [out], to=to,
                                          name=g.fresh(f"/cast/{out}")))
            casts[src, to] = out
        return casts[src, to]

    def as_float(name: str) -> str:
        return cast(name, TensorProto.FLOAT, f"{name}.f32")

    for node in list(g.graph.node):
        if node.op_type == "DequantizeLinear" and dtype_of.get(node.input[1]):
            nodes.append(node)  # its output takes the type of its (low) scale
            dtype_of[node.output[0]] = dtype_of[node.input[1]]
            continue
        lows = [i for i, n in enumerate(node.input) if n in dtype_of]
        if not lows:
            nodes.append(node)
        elif node.op_type in LAYOUT_OPS and lows == [0]:
            nodes.append(node)  # pure data movement: the output stays low
            for o in node.output:
                dtype_of[o] = dtype_of[node.input[0]]
        elif node.op_type == "MatMul":
            # the product in the low type of its stored operand; inputs cast to it, the result
            # cast back to float32 for whatever follows
            t = dtype_of[node.input[lows[0]]]
            for i, n in enumerate(node.input):
                if n not in dtype_of:
                    node.input[i] = cast(n, t, f"{n}.low")
                elif dtype_of[n] != t:
                    node.input[i] = cast(as_float(n), t, f"{n}.low")
            out = node.output[0]
            node.output[0] = g.fresh(f"{out}.low")
            nodes.append(node)
            nodes.append(helper.make_node("Cast", [node.output[0]], [out],
                                          to=TensorProto.FLOAT, name=g.fresh(f"/cast/{out}")))
        else:
            for i in lows:
                node.input[i] = as_float(node.input[i])
            nodes.append(node)

    # graph outputs: ring rows in kv_dtype, everything else float32 as before
    for out in g.graph.output:
        have = dtype_of.get(out.name, out.type.tensor_type.elem_type)
        want = kv_type if out.name in ring_outputs else out.type.tensor_type.elem_type
        if have == want:
            continue
        inner = g.fresh(f"{out.name}.inner")
        for node in nodes:
            node.output[:] = [inner if o == out.name else o for o in node.output]
            node.input[:] = [inner if i == out.name else i for i in node.input]
        nodes.append(helper.make_node("Cast", [inner], [out.name], to=want,
                                      name=g.fresh(f"/cast/{out.name}")))
        out.type.tensor_type.elem_type = want
    g.replace_nodes(nodes)
    del g.graph.value_info[:]  # intermediate types changed; nothing downstream needs them
