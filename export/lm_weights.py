"""The LM graphs' weights, from the checkpoint to the model directory in one pass.

A graph is traced without its weights (its parameters are graph inputs, onnx_export.py). Each
parameter then becomes a weight read from the checkpoint (frugal.WeightPlan), converted to the
graph's precision (precision.apply_plan: transposes folded, int8 / int4 / fp8 quantised, fp16 /
bf16 stored) and written once into the graph's external data, one tensor at a time:

    model.safetensors --rows, bf16 -> float32--> a parameter --precision--> <graph>.onnx.data

No float32 copy is written first: an int4 7B needs the disk of its 5.5 GB, not 31 GB more.
Two checks tie what is written to the checkpoint (lm.export_lm_graphs_frugal runs them):

    in memory   the float32 graph runs in onnxruntime with its weights fed as inputs, made
                from the checkpoint (nothing written), beside the torch module on the same
                arrays: what the graph computes (lm.check_lm_graph)
    spot check  three output channels (first, middle, last) of every written weight, made again
                from the checkpoint through torch's bf16 conversion (not the numpy one that
                wrote them) and the same precision passes, against the bytes in the data file:
                a wrong offset, order, slice or conversion of any tensor, at any size
                (spot_check)
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch
from onnx import TensorProto, numpy_helper

from personaplex_edge.progress import Meter

from .frugal import SafetensorsHeader, WeightPlan
from .graph_edit import EditableGraph, element_bytes
from .onnx_export import ExportMismatch
from .precision import apply_plan, rewrites
from .precision_plan import PrecisionPlan

PREFIX = "owner."  # what onnx_export names a traced module's parameters
Sources = dict[str, Callable[[], np.ndarray]]  # graph input -> its float32 weight


def checkpoint_sources(plans: dict[str, WeightPlan], header: SafetensorsHeader) -> Sources:
    """Each parameter's float32 values as the export writes them (the numpy path)."""
    return {PREFIX + name: (lambda plan=plan: plan.read(header)) for name, plan in plans.items()}


def final_graph(trace: onnx.ModelProto, path: Path, sources: Sources,
                plan: PrecisionPlan | None, rings: tuple[list[str], list[str]] = ([], []),
                ) -> EditableGraph:
    """The graph `trace` (traced without weights) with its parameters made by `sources` and
    converted to `plan` (None: float32 as traced), nothing made yet; `rings` are its KV ring
    (inputs, row outputs)."""
    g = EditableGraph(path, trace)
    if plan is not None and plan.weight_format == "qdq":
        g.raise_opset(21)  # before the weights are placeholders: the converter checks them
    g.adopt_inputs(sources)
    if plan is not None and rewrites(plan):
        apply_plan(g, plan, *rings)
    return g


def write_graph(g: EditableGraph, path: Path, progress: Callable[[str], None]) -> dict[str, str]:
    """Writes `g` to `path` (replacing what is there) and its weights to `<path>.data`, made one
    at a time, with progress; returns {data file: sha256}."""
    meter = Meter(f"{path.name}.data", g.stored_bytes(), progress)
    tmp = path.parent / f".{path.name}.partial"
    try:
        files = g.save(tmp, f"{path.name}.data", progress=meter.advance)
    finally:
        meter.close()
    os.replace(tmp, path)
    return files


def made(sources: Sources) -> dict[str, np.ndarray]:
    """Every source's array: a traced graph's weights as onnxruntime feeds (the in-memory
    check; one float32 copy of the graph's weights)."""
    return {name: make() for name, make in sources.items()}


def read_parameter(plan: WeightPlan, header: SafetensorsHeader) -> torch.Tensor:
    """A parameter as float32, converted by torch from the stored bits: a path independent of
    the numpy conversion that wrote the graph's data, so the check covers that too."""
    out = torch.empty(plan.shape, dtype=torch.float32)
    flat, at = out.view(-1), 0
    for s in plan.segments:
        dtype = header.info(s.key).dtype
        for bits in header.iter_raw(s.key, s.start, s.stop):
            t = torch.from_numpy(bits.view(np.int16) if dtype == "BF16" else bits).reshape(-1)
            flat[at:at + t.numel()] = t.view(torch.bfloat16) if dtype == "BF16" else t
            at += t.numel()
    return out


# ---- the spot check ------------------------------------------------------------------------------

def _windows(rows: int) -> list[tuple[int, int]]:
    """The first, a middle and the last row of a parameter."""
    return sorted({(r, r + 1) for r in (0, rows // 2, rows - 1)})


def _read_rows(t: TensorProto, base: Path, start: int, stop: int) -> np.ndarray:
    """Rows start..stop (first axis) of a stored initializer, decoded by onnx itself."""
    dims = list(t.dims)
    per_row = math.prod(dims[1:])
    packed = t.data_type in (TensorProto.INT4, TensorProto.UINT4)
    if packed and per_row % 2:  # rows do not start on bytes: read it all (tiny graphs only)
        whole = numpy_helper.to_array(t, base_dir=str(base))
        return whole[start:stop]
    row_bytes = element_bytes(t.data_type, per_row)
    if t.data_location == TensorProto.EXTERNAL:
        ext = {e.key: e.value for e in t.external_data}
        with open(base / ext["location"], "rb") as f:
            f.seek(int(ext.get("offset", 0)) + start * row_bytes)
            raw = f.read((stop - start) * row_bytes)
    else:
        raw = t.raw_data[start * row_bytes:stop * row_bytes]
    part = TensorProto(name=t.name, data_type=t.data_type, dims=[stop - start, *dims[1:]],
                       raw_data=raw)
    return numpy_helper.to_array(part)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(np.asarray(a).astype(np.float32),
                                                 np.asarray(b).astype(np.float32))


def _compare(t: TensorProto, base: Path, want: np.ndarray, window: tuple[int, int]) -> bool:
    """Whether the stored tensor holds `want`: what the conversion makes of rows `window` of
    its parameter. The one axis where `want` is shorter than the stored tensor is the one those
    rows map to (a converted weight keeps one axis per output channel, scaled by the blocks or
    bytes of each); along the others, the first, a middle and the last index are compared."""
    dims = list(t.dims)
    if list(want.shape) == dims:  # not cut by the window: the whole (small) tensor
        return _same(_read_rows(t, base, 0, dims[0]) if dims else numpy_helper.to_array(
            t, base_dir=str(base)), want)
    axes = [i for i, (w, d) in enumerate(zip(want.shape, dims)) if w != d]
    a, b = window
    if len(axes) != 1 or want.shape[axes[0]] % (b - a):
        raise AssertionError(f"{t.name}: {list(want.shape)} made for rows {a}..{b} does not "
                             f"map onto its stored {dims}")
    axis = axes[0]
    per = want.shape[axis] // (b - a)
    lo, hi = a * per, b * per
    if axis == 0:
        return _same(_read_rows(t, base, lo, hi), want)
    cut = [slice(None)] * (len(dims) - 1)
    cut[axis - 1] = slice(lo, hi)
    for i in _windows(dims[0]):
        row = _read_rows(t, base, *i)[0]
        if not _same(row[tuple(cut)], want[i[0]]):
            return False
    return True


def spot_check(path: str | Path, build: Callable[[Sources], EditableGraph],
               plans: dict[str, WeightPlan], header: SafetensorsHeader) -> int:
    """Compares every weight stored in graph `path` with what `build` (the graph's own
    construction, e.g. final_graph) makes of the checkpoint, three output channels at a time,
    the parameters read by torch (read_parameter). Returns the parameter rows compared;
    raises ExportMismatch naming the first weight, row and checkpoint tensor that differ."""
    path = Path(path)
    stored = {t.name: t for t in onnx.load(str(path), load_external_data=False).graph.initializer}
    windows = {name: _windows(plan.shape[0]) for name, plan in plans.items()}
    compared = 0
    for k in range(3):
        cut = {name: w[min(k, len(w) - 1)] for name, w in windows.items()}
        used: list[str] = []  # the parameters the weight being made reads

        def source(name):
            def make():
                used.append(name)
                return read_parameter(plans[name].rows(header, *cut[name]), header).numpy()
            return make

        g = build({PREFIX + name: source(name) for name in plans})
        last: str | None = None
        for weight, make in g.lazy.items():
            used.clear()
            want = make()
            if weight not in stored:
                raise ExportMismatch(f"{path.name} has no weight {weight}: not the graph its "
                                     "export would write")
            t = stored[weight]
            if list(want.shape) == list(t.dims) and not used:  # a constant, or made from one
                if not _compare(t, path.parent, want, (0, 1)):
                    raise ExportMismatch(f"{path.name}: {weight} differs from its graph's own")
                continue
            # no parameter read: the second output of one conversion (a quantised weight's
            # scales, made with it), so the parameter read last
            name = used[0] if used else last
            last = name
            if k >= len(windows[name]):
                continue  # a parameter of fewer rows: compared already
            window = cut[name]
            if not _compare(t, path.parent, want, window):
                s = plans[name].rows(header, *window).segments[0]
                raise ExportMismatch(f"{path.name}: {weight} row {s.start} of '{s.key}' "
                                     "differs from the checkpoint")
            compared += window[1] - window[0]
    return compared


def stored_build(path: str | Path) -> Callable[[Sources], EditableGraph]:
    """spot_check's `build` for a graph stored as traced (float32: each parameter an
    initializer of its own name)."""
    def build(sources: Sources) -> EditableGraph:
        g = EditableGraph(Path(path))
        for name, make in sources.items():
            g.put_lazy(name, g.inits[name].data_type, g.inits[name].dims, make)
        return g
    return build
