"""Runs an exported graph's arithmetic with torch, on any device, from its numpy-only dump
(scripts/gpu/onnx_dump.py): the bare GPU machine has torch but neither onnx nor a GPU build of
onnxruntime, and bf16 runs nowhere else (onnxruntime's CPU has no bf16 MatMul).

A dump is one .npz: its tensors (initializers and the constants folded at dump time) and, under
"__graph__", a JSON spec - the nodes in order (op, inputs, outputs, attributes), the graph's
inputs with fixed shapes, its outputs, `taps` (intermediates to expose, e.g. the logits each
TopK samples from) and `rings` (which output holds which ring input's new rows). Shape
arithmetic is folded away at dump time, so what runs here is the graph's real work, in the
dtypes the graph has (Cast nodes included): float16, bfloat16, int4 weights dequantised by
DequantizeLinear.

Only the ONNX ops the exported LM graphs use are implemented, each with ONNX's semantics
(broadcasting, negative indices, opset-13+ inputs for axes); any other op is a clear error
naming it, so a graph that grows a new op fails tests/test_gpu_check.py before it reaches a
GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

# dtype names in dumps -> torch (int4 values are stored and computed as int8)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
          "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool, "int4": torch.int8}
# ONNX TensorProto element types (Cast's `to`) -> dtype names
ONNX_TYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool",
              10: "float16", 11: "float64", 16: "bfloat16", 22: "int4"}


def to_torch(array: np.ndarray, dtype: str, device) -> torch.Tensor:
    """A dumped array as a tensor: bfloat16 travels as its uint16 bit patterns."""
    array = np.array(array, order="C")  # a writable copy; 0-d stays 0-d (ascontiguousarray
    if dtype == "bfloat16":              # would make it 1-d)
        t = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(array).to(DTYPES[dtype])
    return t.to(device)


class TorchGraph:
    def __init__(self, spec: dict, arrays: Mapping[str, np.ndarray], device="cpu"):
        self.spec = spec
        self.device = torch.device(device)
        self.inputs = {i["name"]: i for i in spec["inputs"]}
        self.outputs = list(spec["outputs"])
        self.taps = dict(spec.get("taps", {}))
        self.consts = {name: to_torch(arrays[meta["key"]], meta["dtype"], self.device)
                       for name, meta in spec["tensors"].items()}
        # small integer constants (shapes, axes, pads, k) as Python lists: read without a
        # device round trip
        self.static = {name: meta["values"] for name, meta in spec["tensors"].items()
                       if "values" in meta}
        for node in spec["nodes"]:
            if node["op"] not in OPS:
                raise NotImplementedError(f"{spec.get('name', 'graph')}: ONNX op {node['op']} "
                                          "is not implemented by scripts/gpu/onnx_torch.py")

    @classmethod
    def load(cls, path: str | Path, device="cpu") -> "TorchGraph":
        with np.load(path, allow_pickle=False) as data:
            spec = json.loads(str(data["__graph__"]))
            arrays = {k: data[k] for k in data.files if k != "__graph__"}
        return cls(spec, arrays, device)

    def ints(self, env: dict, name: str) -> list[int]:
        if name in self.static:
            return list(self.static[name])
        return [int(v) for v in env[name].reshape(-1).tolist()]

    def run(self, feeds: Mapping[str, torch.Tensor], keep=(), everything: bool = False
            ) -> dict[str, torch.Tensor]:
        """feeds: the graph's inputs (tensors on this graph's device, its dtypes) -> its
        outputs, plus the intermediates named in `keep` (every value with `everything`)."""
        missing = set(self.inputs) - set(feeds)
        if missing:
            raise ValueError(f"missing inputs {sorted(missing)}")
        env = dict(self.consts)
        env.update(feeds)
        for node in self.spec["nodes"]:
            args = [env[i] if i else None for i in node["inputs"]]
            try:
                outs = OPS[node["op"]](self, env, node, *args)
            except Exception as e:
                raise RuntimeError(f"{node['op']} -> {node['outputs']}: {e}") from e
            env.update(zip(node["outputs"], outs))
        if everything:
            return env
        return {n: env[n] for n in (*self.outputs, *keep)}


# ---- the ops ------------------------------------------------------------------------------------

def _attr(node, name, default=None):
    return node["attrs"].get(name, default)


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _binary(fn):
    return lambda g, env, node, a, b: [fn(a, b)]


def _unary(fn):
    return lambda g, env, node, a: [fn(a)]


def _div(g, env, node, a, b):
    if a.dtype.is_floating_point:
        return [a / b]
    return [torch.div(a, b, rounding_mode="trunc")]  # ONNX integer division truncates


def _mod(g, env, node, a, b):
    return [torch.fmod(a, b) if _attr(node, "fmod", 0) else torch.remainder(a, b)]


def _cast(g, env, node, x):
    return [x.to(DTYPES[ONNX_TYPES[_attr(node, "to")]])]


def _clip(g, env, node, x, lo=None, hi=None):
    return [x if lo is None and hi is None else torch.clamp(x, min=lo, max=hi)]


def _concat(g, env, node, *xs):
    return [torch.cat(xs, dim=_attr(node, "axis"))]


def _constant_of_shape(g, env, node, shape):
    value = _attr(node, "value", {"value": 0.0, "dtype": "float32"})
    return [torch.full(g.ints(env, node["inputs"][0]), value["value"],
                       dtype=DTYPES[value["dtype"]], device=g.device)]


def _gather(g, env, node, data, index):
    axis = _axis(_attr(node, "axis", 0), data.dim())
    index = torch.where(index < 0, index + data.shape[axis], index)
    picked = torch.index_select(data, axis, index.reshape(-1))
    return [picked.reshape((*data.shape[:axis], *index.shape, *data.shape[axis + 1:]))]


def _gather_elements(g, env, node, data, index):
    axis = _axis(_attr(node, "axis", 0), data.dim())
    index = torch.where(index < 0, index + data.shape[axis], index)
    return [torch.gather(data, axis, index)]


def _argmax(g, env, node, x):
    if _attr(node, "select_last_index", 0):
        raise NotImplementedError("ArgMax with select_last_index")
    return [torch.argmax(x, dim=_attr(node, "axis", 0), keepdim=bool(_attr(node, "keepdims", 1)))]


def _topk(g, env, node, x, k):
    values, index = torch.topk(x, g.ints(env, node["inputs"][1])[0], dim=_attr(node, "axis", -1),
                               largest=bool(_attr(node, "largest", 1)),
                               sorted=bool(_attr(node, "sorted", 1)))
    return [values, index]


def _reduce_axes(g, env, node, x):
    """Axes from the attribute (before opset 18) or the second input; none: all (or, with
    noop_with_empty_axes, none)."""
    axes = _attr(node, "axes")
    if axes is None and len(node["inputs"]) > 1 and node["inputs"][1]:
        axes = g.ints(env, node["inputs"][1])
    if not axes:
        return None if not _attr(node, "noop_with_empty_axes", 0) else []
    return [_axis(a, x.dim()) for a in axes]


def _reduce(fn):
    def op(g, env, node, x, *_):
        axes = _reduce_axes(g, env, node, x)
        if axes == []:
            return [x]
        keep = bool(_attr(node, "keepdims", 1))
        return [fn(x, dim=axes if axes is not None else list(range(x.dim())), keepdim=keep)]
    return op


def _range(g, env, node, start, limit, delta):
    return [torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype,
                         device=g.device)]


def _reshape(g, env, node, x, shape):
    target = g.ints(env, node["inputs"][1])
    if not _attr(node, "allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return [x.reshape(target)]


def _shape(g, env, node, x):
    dims = list(x.shape)[_attr(node, "start", 0):_attr(node, "end", None)]
    return [torch.tensor(dims, dtype=torch.int64, device=g.device)]


def _slice(g, env, node, x, *rest):
    names = node["inputs"]
    starts, ends = g.ints(env, names[1]), g.ints(env, names[2])
    axes = g.ints(env, names[3]) if len(names) > 3 and names[3] else list(range(len(starts)))
    steps = g.ints(env, names[4]) if len(names) > 4 and names[4] else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(axis, x.dim())
        n = x.shape[axis]
        start, end = start + n if start < 0 else start, end + n if end < 0 else end
        if step > 0:  # ONNX clamps to [0, n], as Python's slicing does
            index = [slice(None)] * x.dim()
            index[axis] = slice(max(0, min(start, n)), max(0, min(end, n)), step)
            x = x[tuple(index)]
        else:  # start in [0, n - 1], end in [-1, n - 1]; torch has no negative-step slice
            picks = range(max(0, min(start, n - 1)), max(-1, min(end, n - 1)), step)
            x = torch.index_select(x, axis, torch.tensor(list(picks), dtype=torch.int64,
                                                         device=x.device))
    return [x]


def _softmax(g, env, node, x):
    return [torch.softmax(x, dim=_attr(node, "axis", -1))]


def _transpose(g, env, node, x):
    perm = _attr(node, "perm") or list(reversed(range(x.dim())))
    return [x.permute(perm)]


def _unsqueeze(g, env, node, x, axes=None):
    axes = _attr(node, "axes") or g.ints(env, node["inputs"][1])
    rank = x.dim() + len(axes)
    for a in sorted(_axis(a, rank) for a in axes):
        x = x.unsqueeze(a)
    return [x]


def _where(g, env, node, cond, a, b):
    return [torch.where(cond, a, b)]


def _pad(g, env, node, x, pads, value=None, axes=None):
    if _attr(node, "mode", "constant") != "constant":
        raise NotImplementedError(f"Pad mode {_attr(node, 'mode')}")
    pads = g.ints(env, node["inputs"][1])
    axes = (g.ints(env, node["inputs"][3]) if len(node["inputs"]) > 3 and node["inputs"][3]
            else list(range(x.dim())))
    n = len(axes)
    begin, end = dict(zip(axes, pads[:n])), dict(zip(axes, pads[n:]))
    flat = []  # torch.nn.functional.pad: last dimension first, (begin, end) each
    for d in reversed(range(x.dim())):
        flat += [begin.get(d, begin.get(d - x.dim(), 0)), end.get(d, end.get(d - x.dim(), 0))]
    fill = 0.0 if value is None or value.numel() == 0 else value.reshape(-1)[0].item()
    return [torch.nn.functional.pad(x, flat, value=fill)]


def _dequantize(g, env, node, x, scale, zero=None):
    """y = (x - zero) * scale in float32, as the scale's dtype; per tensor, per axis, or in
    blocks of `block_size` along `axis` (opset 21: int4 weights)."""
    axis = _axis(_attr(node, "axis", 1), x.dim())
    block = _attr(node, "block_size", 0)
    s = scale.float()
    z = None if zero is None else zero.float()
    if block:
        s = s.repeat_interleave(block, dim=axis).narrow(axis, 0, x.shape[axis])
        z = None if z is None else z.repeat_interleave(block, dim=axis).narrow(
            axis, 0, x.shape[axis])
    elif s.dim() == 1 and s.numel() > 1:
        shape = [1] * x.dim()
        shape[axis] = -1
        s = s.reshape(shape)
        z = None if z is None else z.reshape(shape)
    y = x.float() if z is None else x.float() - z
    return [(y * s).to(scale.dtype)]


OPS = {
    "Add": _binary(torch.add), "Sub": _binary(torch.sub), "Mul": _binary(torch.mul),
    "Div": _div, "Mod": _mod, "MatMul": _binary(torch.matmul),
    "And": _binary(torch.logical_and), "Not": _unary(torch.logical_not),
    "Equal": _binary(torch.eq), "Greater": _binary(torch.gt), "GreaterOrEqual": _binary(torch.ge), "Less": _binary(torch.lt),
    "Neg": _unary(torch.neg), "Sqrt": _unary(torch.sqrt), "Sin": _unary(torch.sin),
    "Cos": _unary(torch.cos), "Sigmoid": _unary(torch.sigmoid),
    "Identity": _unary(lambda x: x),
    "Cast": _cast, "Clip": _clip, "Concat": _concat, "ConstantOfShape": _constant_of_shape,
    "Gather": _gather, "GatherElements": _gather_elements, "ArgMax": _argmax, "TopK": _topk,
    "ReduceMean": _reduce(torch.mean), "ReduceSum": _reduce(torch.sum), "Range": _range,
    "Reshape": _reshape, "Shape": _shape, "Slice": _slice, "Softmax": _softmax,
    "Transpose": _transpose, "Unsqueeze": _unsqueeze, "Where": _where, "Pad": _pad,
    "DequantizeLinear": _dequantize,
}
