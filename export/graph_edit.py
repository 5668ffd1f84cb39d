"""A generic ONNX graph editor for rewrites of graphs whose weights stay on disk.

The precision passes (transpose_fold.py, linear_quant.py, cast_islands.py) edit a loaded graph
through `EditableGraph`: replace initializers, find fresh names, drop what nothing uses. New
weights are lazy: `put_lazy` records a placeholder (name, type, shape) and a function that makes
the array; nothing is computed until the graph is saved, one tensor at a time, each written
before the next is made. Converting the 7B LM therefore holds one weight in memory, not the
model. Saving writes the weights inline when they fit one protobuf, else through the project's
one external-data writer (external_data.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .external_data import ExternalDataFile

ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
             "bfloat16": TensorProto.BFLOAT16}
FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}
_INLINE_LIMIT = 1_800_000_000  # protobuf's 2 GB cap, with room for the graph itself
_INLINE_BELOW = 1024  # constants smaller than this stay in the graph even when data is external


def element_bytes(data_type: int, count: int) -> int:
    """Stored bytes of `count` elements of an ONNX type (int4: two to a byte)."""
    if data_type in (TensorProto.INT4, TensorProto.UINT4):
        return (count + 1) // 2
    return count * onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize


def tensor_bytes(t: TensorProto) -> int:
    """Stored bytes of an initializer, from its type and shape (its data not read)."""
    return element_bytes(t.data_type, int(np.prod(t.dims, dtype=np.int64)))


class EditableGraph:
    """A graph loaded without its external weights, with the few edits the passes need."""

    def __init__(self, path: Path, model: onnx.ModelProto | None = None):
        """The graph at `path`, or `model` (a copy is edited; `path` is then where its external
        data would be)."""
        self.path = Path(path)
        if model is None:
            self.model = onnx.load(str(path), load_external_data=False)
        else:
            self.model = onnx.ModelProto()
            self.model.CopyFrom(model)
        self.graph = self.model.graph
        self.inits = {t.name: t for t in self.graph.initializer}
        self.lazy: dict[str, Callable[[], np.ndarray]] = {}
        self.external = any(t.data_location == TensorProto.EXTERNAL for t in self.inits.values())
        self._taken = {n for node in self.graph.node for n in (*node.input, *node.output)}
        self._taken |= set(self.inits) | {v.name for v in self.graph.input}

    def array(self, name: str) -> np.ndarray:
        """The initializer's values (a lazy one is made now)."""
        if name in self.lazy:
            return self.lazy[name]()
        return numpy_helper.to_array(self.inits[name], base_dir=str(self.path.parent))

    def loader(self, name: str) -> Callable[[], np.ndarray]:
        """A function giving the initializer's values as they are now (for chaining)."""
        if name in self.lazy:
            return self.lazy[name]
        tensor, base = self.inits[name], str(self.path.parent)
        # bound to this proto: `name` may be replaced (by its converted self) before it runs
        return lambda: numpy_helper.to_array(tensor, base_dir=base)

    def put(self, tensor: TensorProto) -> None:
        """Adds or replaces an initializer."""
        if tensor.name in self.inits:
            self.graph.initializer.remove(self.inits[tensor.name])
        self.graph.initializer.append(tensor)
        self.inits[tensor.name] = tensor
        self.lazy.pop(tensor.name, None)
        self._taken.add(tensor.name)

    def put_lazy(self, name: str, data_type: int, dims, make: Callable[[], np.ndarray]) -> None:
        """An initializer whose values `make()` gives when the graph is written; `make` must
        return an array that numpy_helper.from_array stores as `data_type`."""
        placeholder = TensorProto(name=name, data_type=data_type, dims=[int(d) for d in dims])
        self.put(placeholder)
        self.lazy[name] = make

    def adopt_inputs(self, sources: dict[str, Callable[[], np.ndarray]]) -> None:
        """Graph inputs named in `sources` become lazy initializers made by their source (the
        parameters of a graph traced without its weights, read from a checkpoint when the graph
        is written). The graph is then saved with external data, whatever its size."""
        kept = []
        for v in self.graph.input:
            if v.name not in sources:
                kept.append(v)
                continue
            t = v.type.tensor_type
            self.put_lazy(v.name, t.elem_type, [d.dim_value for d in t.shape.dim],
                          sources[v.name])
        missing = sorted(set(sources) - {v.name for v in self.graph.input})
        if missing:
            raise ValueError(f"{self.path.name}: no graph input for {missing[:5]}")
        del self.graph.input[:]
        self.graph.input.extend(kept)
        self.external = True

    def materialize(self, name: str) -> TensorProto:
        tensor = numpy_helper.from_array(np.ascontiguousarray(self.lazy[name]()), name)
        want = self.inits[name]
        if tensor.data_type != want.data_type or list(tensor.dims) != list(want.dims):
            raise AssertionError(f"{name}: made {tensor.data_type} {list(tensor.dims)}, "
                                 f"declared {want.data_type} {list(want.dims)}")
        return tensor

    def drop_unused(self) -> None:
        used = {n for node in self.graph.node for n in node.input}
        used |= {o.name for o in self.graph.output}
        for name in [n for n in self.inits if n not in used]:
            self.graph.initializer.remove(self.inits.pop(name))
            self.lazy.pop(name, None)

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self._taken:
            i += 1
            name = f"{base}_{i}"
        self._taken.add(name)
        return name

    def replace_nodes(self, nodes: list[onnx.NodeProto]) -> None:
        del self.graph.node[:]
        self.graph.node.extend(nodes)

    def raise_opset(self, version: int) -> None:
        """Converts the default domain to at least `version` (a no-op when it already is)."""
        from onnx import version_converter

        current = next(o.version for o in self.model.opset_import
                       if o.domain in ("", "ai.onnx"))
        if current >= version:
            return
        self.model.CopyFrom(version_converter.convert_version(self.model, version))
        self.graph = self.model.graph
        self.inits = {t.name: t for t in self.graph.initializer}

    def add_opset(self, domain: str, version: int) -> None:
        if not any(o.domain == domain for o in self.model.opset_import):
            self.model.opset_import.append(helper.make_opsetid(domain, version))

    def _raw(self, t: TensorProto) -> bytes:
        """An initializer's raw bytes: made now if lazy, else read from the source graph."""
        if t.name in self.lazy:
            return self.materialize(t.name).raw_data
        if t.data_location == TensorProto.EXTERNAL:
            t = TensorProto.FromString(t.SerializeToString())
            onnx.external_data_helper.load_external_data_for_tensor(t, str(self.path.parent))
        return t.raw_data if t.HasField("raw_data") else numpy_helper.from_array(
            numpy_helper.to_array(t), t.name).raw_data

    def stored_bytes(self) -> int:
        """What the graph's weights take once written."""
        return sum(tensor_bytes(t) for t in self.graph.initializer)

    def save(self, path: Path, data_name: str,
             progress: Callable[[int], None] | None = None) -> dict[str, str]:
        """Writes the graph to `path`; weights inline when they fit in one protobuf, else in the
        file `data_name` beside it (through a temporary name, so that the source graph's data
        file of the same name stays readable until the new one is complete). Returns the
        external data files written, {name: sha256}; `progress(n)` after each n bytes."""
        path = Path(path)
        total = sum(int(np.prod(t.dims, dtype=np.int64)) * 4 for t in self.inits.values())
        if not self.external and total < _INLINE_LIMIT:
            for t in self.graph.initializer:
                if t.name in self.lazy:
                    t.CopyFrom(self.materialize(t.name))
            onnx.save_model(self.model, str(path))
            return {}
        data = ExternalDataFile(path.parent / f".{data_name}.partial", location=data_name,
                                progress=progress)
        try:
            for t in self.graph.initializer:
                raw = self._raw(t)
                if len(raw) < _INLINE_BELOW and t.data_location != TensorProto.EXTERNAL:
                    t.raw_data = raw  # small constants stay inline
                    continue
                ref = data.add(t.name, t.data_type, t.dims, [raw], len(raw))
                del raw
                t.CopyFrom(ref)
            digest = data.close()
        except BaseException:
            data.abort()
            raise
        onnx.save_model(self.model, str(path))
        data.path.replace(path.parent / data_name)
        return {data_name: digest}


def external_files(path: Path) -> set[str]:
    """The external data files a saved graph refers to."""
    model = onnx.load(str(path), load_external_data=False)
    return {e.value for t in model.graph.initializer for e in t.external_data
            if e.key == "location"}


class SharedValue:
    """One computation feeding several lazy tensors (a quantised weight and its scales): made
    on the first call, dropped after the last of `uses` calls."""

    def __init__(self, make: Callable[[], object], uses: int):
        self.make, self.uses, self.value = make, uses, None

    def get(self):
        if self.value is None:
            self.value = self.make()
        result = self.value
        self.uses -= 1
        if self.uses == 0:
            self.value = None
        return result


def as_dtype(array: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values stored as `dtype` (bfloat16 through ml_dtypes, which onnx understands)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return array.astype(ml_dtypes.bfloat16)
    return array.astype(np.dtype(dtype))
