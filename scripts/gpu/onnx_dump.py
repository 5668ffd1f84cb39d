"""Writes an exported ONNX graph as a numpy-only dump for scripts/gpu/onnx_torch.py (its format is
described there): what carries a graph's arithmetic to a machine without the onnx package.

Every input shape is fixed (Helium's frames axis at 1, one live frame), so everything computed
from shapes and constants alone is static. Those values are computed once here, by the same
interpreter on the CPU, and the small ones - integer tensors (shapes, indices, masks over
constants) and scalars - become constants, their nodes dropped; float tensors derived from
weights (a Cast of a table, a DequantizeLinear of int4 weights) are left to run on the device,
as the graph runs them. Nodes nothing needs are dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FOLD_MAX = 64  # elements: a float static value folded only up to this size (scalars, eps)


def _dtype_name(array: np.ndarray) -> str:
    name = array.dtype.name
    return {"bool": "bool"}.get(name, name)


def _storable(array: np.ndarray) -> tuple[np.ndarray, str]:
    """(what the .npz stores, the dtype name): bfloat16 as its bits, int4 as int8."""
    name = _dtype_name(array)
    if name == "bfloat16":
        return array.view(np.uint16), name
    if name == "int4":
        return array.astype(np.int8), name
    return array, name


def _attributes(node) -> dict:
    import onnx
    from onnx import numpy_helper

    out = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, onnx.TensorProto):
            array = numpy_helper.to_array(value)  # ConstantOfShape's fill value
            value = {"value": array.reshape(-1)[0].item(), "dtype": _dtype_name(array)}
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        out[a.name] = value
    return out


def _constant(node) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    a = node.attribute[0]
    value = onnx.helper.get_attribute_value(a)
    if a.name == "value":
        return numpy_helper.to_array(value)
    kinds = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
             "value_ints": np.int64}
    return np.array(value, kinds[a.name])


def raw_spec(onnx_path: Path, fixed: dict[str, int]) -> tuple[dict, dict[str, np.ndarray]]:
    """The graph as a spec + arrays, nothing folded yet (Constant nodes become tensors);
    symbolic dimensions take their value from `fixed`."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path))  # with its external data
    graph = model.graph
    arrays: dict[str, np.ndarray] = {}
    tensors: dict[str, dict] = {}

    def add(name: str, array: np.ndarray) -> None:
        stored, dtype = _storable(np.asarray(array))
        key = f"t{len(arrays)}"
        arrays[key] = stored
        tensors[name] = {"key": key, "dtype": dtype}

    for init in graph.initializer:
        add(init.name, numpy_helper.to_array(init))
    nodes = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            raise NotImplementedError(f"{onnx_path.name}: op {node.domain}.{node.op_type}")
        if node.op_type == "Constant":
            add(node.output[0], _constant(node))
            continue
        nodes.append({"op": node.op_type, "inputs": list(node.input),
                      "outputs": list(node.output), "attrs": _attributes(node)})
    inits = {i.name for i in graph.initializer}
    inputs = []
    for v in graph.input:
        if v.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else fixed[d.dim_param]
                for d in v.type.tensor_type.shape.dim]
        from onnx_torch import ONNX_TYPES

        inputs.append({"name": v.name, "shape": dims,
                       "dtype": ONNX_TYPES[v.type.tensor_type.elem_type]})
    taps = {"logits": [n["inputs"][0] for n in nodes if n["op"] == "TopK"]}
    spec = {"name": onnx_path.stem, "inputs": inputs, "outputs": [o.name for o in graph.output],
            "tensors": tensors, "nodes": nodes, "taps": taps}
    return spec, arrays


def _numpy(t) -> tuple[np.ndarray, str]:
    """A tensor as (what the .npz stores, its dtype name)."""
    import torch

    if t.dtype == torch.bfloat16:
        return t.cpu().view(torch.int16).numpy().view(np.uint16), "bfloat16"
    array = t.cpu().numpy()
    return array, _dtype_name(array)


def zero_feeds(spec: dict, device="cpu") -> dict:
    import torch

    from onnx_torch import DTYPES

    return {i["name"]: torch.zeros(i["shape"], dtype=DTYPES[i["dtype"]], device=device)
            for i in spec["inputs"]}


def fold(spec: dict, arrays: dict[str, np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
    """Static values folded into constants, unneeded nodes dropped (module docstring)."""
    from onnx_torch import TorchGraph

    env = TorchGraph(spec, arrays, "cpu").run(zero_feeds(spec), everything=True)
    dynamic = {i["name"] for i in spec["inputs"]}
    folded: dict[str, np.ndarray] = {}
    for node in spec["nodes"]:
        if node["op"] != "Shape" and any(i in dynamic for i in node["inputs"] if i):
            dynamic.update(node["outputs"])
            continue
        for out in node["outputs"]:
            value = env[out]
            if not value.dtype.is_floating_point or value.numel() <= FOLD_MAX:
                folded[out] = _numpy(value)
    needed = set(spec["outputs"]) | {t for taps in spec["taps"].values() for t in taps}
    nodes = []
    for node in reversed(spec["nodes"]):
        wanted = [o for o in node["outputs"] if o in needed]
        if not wanted or all(o in folded for o in wanted):
            continue
        nodes.append(node)
        needed.update(i for i in node["inputs"] if i)
    nodes.reverse()
    out_arrays: dict[str, np.ndarray] = {}
    tensors: dict[str, dict] = {}
    for name in sorted(needed):
        if name in folded:
            array, dtype = folded[name]
            meta = {"dtype": dtype}
        elif name in spec["tensors"]:
            meta = dict(spec["tensors"][name])
            array = arrays[meta.pop("key")]
        else:
            continue  # a graph input or a node output
        key = f"t{len(out_arrays)}"
        out_arrays[key] = array
        meta["key"] = key
        if meta["dtype"] in ("int64", "int32") and array.size <= 64:
            meta["values"] = array.reshape(-1).tolist()
        tensors[name] = meta
    return {**spec, "nodes": nodes, "tensors": tensors}, out_arrays


def dump_graph(onnx_path: Path, out: Path, fixed: dict[str, int], rings=(),
               precision: str = "") -> dict:
    """onnx_path -> the dump at `out` (.npz); `rings`: the manifest's RingSpecs of the graph.
    Returns the spec written."""
    spec, arrays = fold(*raw_spec(onnx_path, fixed))
    spec["precision"] = precision
    spec["rings"] = [{"input": r.input_name, "output": r.output_name, "axis": r.axis,
                      "position": r.position} for r in rings]
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, __graph__=np.array(json.dumps(spec)), **arrays)
    return spec
