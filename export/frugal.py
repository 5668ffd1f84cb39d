"""Weights streamed from a safetensors checkpoint into a graph's external data, tensor by tensor.

The 7B LM is 16.7 GB of bf16 and 33 GB once converted to float32: a machine that can run it
cannot also hold a second copy for the exporter. So the graphs are traced without their weights
(parameters stay graph inputs) and each parameter is then written here, straight from the
checkpoint file to the graph's `<graph>.onnx.data`, converted on the way:

    safetensors file --reads (row blocks)--> bf16 bits --numpy--> float32 --> .onnx.data

(the reader is safetensors_file.py, the writer external_data.py). A parameter's value is a
`WeightPlan`: rows of one or more checkpoint tensors, concatenated along dim 0 and reshaped.
That one form covers the published layout's packings: the depformer's per-step slices of
`in_proj_weight` (a row range), Helium's stacked audio tables (16 tensors one after another)
and every plain tensor (all rows of one). Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np

from personaplex_edge.errors import CheckpointError

from .external_data import ExternalDataFile
from .safetensors_file import SafetensorsHeader


@dataclass(frozen=True)
class Segment:
    """Rows start..stop (None: all) of checkpoint tensor `key`."""

    key: str
    start: int = 0
    stop: int | None = None


@dataclass(frozen=True)
class WeightPlan:
    """A parameter = its segments concatenated along dim 0, reshaped to `shape`."""

    segments: tuple[Segment, ...]
    shape: tuple[int, ...]

    @classmethod
    def whole(cls, key: str, shape: tuple[int, ...]) -> "WeightPlan":
        return cls((Segment(key),), tuple(shape))

    @property
    def nbytes(self) -> int:
        return 4 * math.prod(self.shape)  # float32

    def keys(self) -> list[str]:
        return [s.key for s in self.segments]

    def check(self, header: SafetensorsHeader, name: str) -> None:
        """The segments exist and add up to exactly `shape`."""
        elems = 0
        for s in self.segments:
            t = header.info(s.key)
            stop = t.shape[0] if s.stop is None else s.stop
            elems += (stop - s.start) * t.row_elements
        if elems != math.prod(self.shape):
            raise CheckpointError(f"{header.path}: parameter {name} {list(self.shape)} cannot be "
                                  f"built from {self.keys()} ({elems} elements)")

    def blocks(self, header: SafetensorsHeader) -> Iterator[np.ndarray]:
        for s in self.segments:
            yield from header.iter_rows(s.key, s.start, s.stop)

    def read(self, header: SafetensorsHeader) -> np.ndarray:
        """The whole parameter as float32 `shape` (for the check's torch side)."""
        return np.concatenate([b.reshape(-1) for b in self.blocks(header)]).reshape(self.shape)


def attach_external_weights(model_path: str | Path, plans: Mapping[str, WeightPlan],
                            header: SafetensorsHeader,
                            progress: Callable[[int], None] | None = None) -> dict[str, str]:
    """Turns the parameter inputs of a graph exported without its weights (torch.onnx.export
    with export_params=False, keep_initializers_as_inputs=True) into initializers whose data is
    written from `header`'s file into `<model>.data`. `plans` maps each parameter input name to
    what it is made of; every plan must be used and every parameter input must have a plan.
    Returns {data file name: sha256}."""
    import onnx

    model_path = Path(model_path)
    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    if graph.initializer:
        raise ValueError(f"{model_path.name} already holds weights")
    names = {i.name for i in graph.input}
    unused = sorted(set(plans) - names)
    if unused:
        raise ValueError(f"{model_path.name}: no graph input for parameter(s) {unused[:5]}")
    for name in plans:
        plans[name].check(header, name)
    data = ExternalDataFile(model_path.with_name(model_path.name + ".data"), progress=progress)
    try:
        kept = []
        for inp in graph.input:
            plan = plans.get(inp.name)
            if plan is None:
                kept.append(inp)
                continue
            dims = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
            if dims != plan.shape or inp.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
                raise ValueError(f"{model_path.name}: parameter {inp.name} is {dims} in the "
                                 f"graph, {plan.shape} float32 in the plan")
            graph.initializer.append(data.add_float32(inp.name, plan.shape,
                                                      plan.blocks(header)))
        digest = data.close()
    except BaseException:
        data.abort()
        raise
    del graph.input[:]
    graph.input.extend(kept)
    model_path.write_bytes(model.SerializeToString())
    return {data.path.name: digest}
