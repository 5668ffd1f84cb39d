"""Lower-precision language-model graphs from the float32 export: fp16, bf16, int8, int4, fp8.

One graph is converted by three passes over an `EditableGraph` (graph_edit.py), its weights made
lazily and written one at a time, then checked and moved into place:

    transpose_fold.py   Transpose(W) -> W^T, so every linear weight is a MatMul's B [K, N]
    linear_quant.py     int8 / int4 / fp8 weights (MatMulNBits for onnxruntime, DequantizeLinear
                        for TensorRT)
    cast_islands.py     fp16 / bf16 storage of the big tensors and the KV ring, float32 for the
                        rest

The layout of each precision per backend, and what a backend cannot honour, is precision_plan.py.
The Mimi codec is not converted: it is compute bound on small convolutions, ~0.4 GB of weights
read per frame in float32 against ~15 GB for the LM, and its nearest-neighbour code choice and
audio are where fp16 rounding would be heard first.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Callable

import onnx

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.manifest import GraphEntry, Manifest, sha256_file

from .cast_islands import lower_precision
from .graph_edit import ONNX_TYPE, EditableGraph, external_files
from .linear_quant import quantize_linears
from .precision_plan import PRECISIONS, PrecisionPlan, lm_plans, plan_for  # noqa: F401
from .transpose_fold import fold_weight_transposes

# PRECISIONS and plan_for stay importable from here: the benchmarks and the GPU check name them
Progress = Callable[[str], None]


def apply_plan(g: EditableGraph, plan: PrecisionPlan, ring_inputs: list[str],
               ring_outputs: list[str]) -> None:
    """The three passes (module docstring) on `g`: its float32 weights and KV ring become
    `plan`'s, lazily (nothing is made until the graph is written)."""
    if plan.weight_format == "qdq":
        # DequantizeLinear with fp16 scales (opset 19) and block_size (21). Converted first,
        # while the weights are still references to files: the converter serialises the model.
        g.raise_opset(21)
    fold_weight_transposes(g)
    if plan.bits is not None:
        quantize_linears(g, plan)
        if plan.weight_format == "matmulnbits":
            g.add_opset("com.microsoft", 1)
    lower_precision(g, plan.compute, ring_inputs, ring_outputs, plan.kv_dtype)


def planned_entry(entry: GraphEntry, plan: PrecisionPlan, path: Path,
                  data_files: dict[str, str]) -> GraphEntry:
    """`entry` (its rings split) as the graph written at `path` in `plan`'s precision."""
    rings = [dataclasses.replace(r, dtype=plan.kv_dtype) for r in entry.rings]
    return dataclasses.replace(entry, file=path.name, sha256=sha256_file(path),
                               data_files=data_files, rings=rings, precision=plan.precision,
                               compute=plan.compute)


def convert_graph(src: Path, dst: Path, entry: GraphEntry, plan: PrecisionPlan) -> GraphEntry:
    """Writes the `plan` version of graph `src` to `dst` (may be the same path) and returns its
    manifest entry (new sha256s, ring dtypes)."""
    g = EditableGraph(src)
    old_files = external_files(src) if g.external else set()
    apply_plan(g, plan, [r.input_name for r in entry.rings], [r.output_name for r in entry.rings])
    tmp = dst.parent / f".{dst.name}.partial"
    data_files = g.save(tmp, f"{dst.name}.data")
    onnx.checker.check_model(str(tmp))
    os.replace(tmp, dst)
    if src.resolve() == dst.resolve():  # in place: the float32 weights' files are now unused
        for stale in old_files - set(data_files):
            (src.parent / stale).unlink(missing_ok=True)
    return planned_entry(entry, plan, dst, data_files)


def rewrites(plan: PrecisionPlan) -> bool:
    """Whether `plan` changes a float32 graph at all."""
    return plan.precision != "fp32" or plan.kv_dtype != "float32"


def _dir_bytes(model_dir: Path, entry: GraphEntry) -> int:
    return sum((model_dir / f).stat().st_size for f in (entry.file, *entry.data_files))


def _convert_lm(src: Path, dst: Path, manifest: Manifest, plans: dict[str, PrecisionPlan],
                progress: Progress) -> dict[str, GraphEntry]:
    """Converts the LM graphs of `src` into `dst` (the same directory: in place); returns all
    graph entries, the converted ones updated."""
    graphs = dict(manifest.graphs)
    for name, plan in plans.items():
        if name not in graphs or not rewrites(plan):
            continue
        before = _dir_bytes(src, graphs[name])
        graphs[name] = convert_graph(src / graphs[name].file, dst / graphs[name].file,
                                     graphs[name], plan)
        after = _dir_bytes(dst, graphs[name])
        progress(f"  {graphs[name].file}: {plan.precision}"
                 + (f" ({plan.weight_format}, {plan.bits}-bit, block {plan.block_size})"
                    if plan.bits else "")
                 + (f", KV {plan.kv_dtype}" if graphs[name].rings else "")
                 + f": {before / 1e6:.0f} -> {after / 1e6:.0f} MB")
    return graphs


def convert_precision(model_dir: str | Path, manifest: Manifest, precision: str,
                      kv_dtype: str | None = None, block_size: int | None = None,
                      progress: Progress = print,
                      depformer_precision: str | None = None) -> Manifest:
    """Rewrites the LM graphs of a float32 model directory in place to `precision` (the
    depformer to `depformer_precision` when given), for the manifest's backend. Returns the
    manifest to write: graph entries with new sha256s, precisions and ring dtypes, `precision`
    set. (The export no longer goes through float32: it writes each weight in its precision
    straight from the checkpoint, lm_weights.py.)"""
    model_dir = Path(model_dir)
    if manifest.precision != "fp32":
        raise PersonaPlexError(f"{model_dir} is already {manifest.precision}; convert from a "
                               "float32 export")
    plans = lm_plans(precision, manifest.backend, kv_dtype, block_size, depformer_precision)
    graphs = _convert_lm(model_dir, model_dir, manifest, plans, progress)
    return dataclasses.replace(manifest, graphs=graphs, precision=precision)


def convert_model_dir(src: str | Path, dst: str | Path, precision: str,
                      backend: str = "onnx", kv_dtype: str | None = None,
                      block_size: int | None = None, progress: Progress = print,
                      depformer_precision: str | None = None,
                      plans: dict[str, PrecisionPlan] | None = None) -> Manifest:
    """A `precision` copy of the float32 model directory `src` in `dst` (written atomically;
    `src` is left as it is): the codec, tokenizer and voices copied, the LM graphs converted.
    A library tool for tests and benchmarks: unlike the export it does not refuse what a
    backend's runtime cannot run (precision_plan.refusals), so a graph can be inspected.
    `plans` (graph name -> PrecisionPlan) replaces the plans the other arguments make, for a
    layout no flag asks for (a MatMulNBits accuracy level, a block size per graph)."""
    from personaplex_edge.atomic import staged_dir
    from personaplex_edge.manifest import load_model_dir, write_manifest

    src, dst = Path(src), Path(dst)
    manifest = dataclasses.replace(load_model_dir(src), backend=backend)
    plans = plans or lm_plans(precision, backend, kv_dtype, block_size, depformer_precision)
    with staged_dir(dst) as stage:
        for name, entry in manifest.graphs.items():
            if name not in plans or not rewrites(plans[name]):
                for f in (entry.file, *entry.data_files):
                    shutil.copy2(src / f, stage / f)
        for f in manifest.files:
            (stage / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / f, stage / f)
        graphs = _convert_lm(src, stage, manifest, plans, progress)
        manifest = dataclasses.replace(manifest, graphs=graphs, precision=precision)
        write_manifest(stage, manifest)
    return manifest


def ring_dtypes_agree(model_dir: str | Path, entry: GraphEntry) -> list[str]:
    """Where the graph's ring inputs/outputs disagree with the entry's RingSpecs (empty: none).
    The runtime allocates ring buffers from the manifest, so they must match the graph."""
    model = onnx.load(str(Path(model_dir) / entry.file), load_external_data=False)
    types = {v.name: v.type.tensor_type.elem_type
             for v in (*model.graph.input, *model.graph.output)}
    problems = []
    for r in entry.rings:
        for name in (r.input_name, r.output_name):
            if types.get(name) != ONNX_TYPE.get(r.dtype):
                problems.append(f"{name}: graph {onnx.TensorProto.DataType.Name(types[name])}, "
                                f"manifest {r.dtype}")
    return problems
