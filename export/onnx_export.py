"""One step function -> one ONNX graph with fixed shapes and explicit state.

A step is `fn(*inputs, state) -> (output or tuple of outputs, new_state dict)`. `export_step` flattens it to
positional tensors (inputs, then `past.<name>` per StateSpec; outputs, then `present.<name>`),
traces it with fixed shapes, checks the graph with the onnx checker, and returns the manifest
entry. Graphs over 2 GB keep their weights as external data beside the .onnx file.

With `weights`, the graph is traced without its weights (they are graph inputs named after the
parameters, built as cheap placeholders) and `weights(path)` writes them as external data
(export/frugal.py): how the 7B LM is exported without holding it in memory twice.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnx
import torch
from torch import nn

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.manifest import GraphEntry, StateSpec, TensorSpec, sha256_file

OPSET = 17
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                 "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


def initial_state(specs: Sequence[StateSpec]) -> dict[str, torch.Tensor]:
    return {s.name: torch.full(s.shape, s.init, dtype=torch_dtype(s.dtype)) for s in specs}


class _FlatStep(nn.Module):
    def __init__(self, owner: nn.Module, fn: Callable, n_inputs: int, state: Sequence[StateSpec]):
        super().__init__()
        self.owner = owner  # registers the weights so the trace sees parameters, not constants
        self.fn = fn
        self.n_inputs = n_inputs
        self.state = list(state)

    def forward(self, *args):
        inputs = args[:self.n_inputs]
        state = {s.name: t for s, t in zip(self.state, args[self.n_inputs:])}
        outputs, new = self.fn(*inputs, state)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        missing = [s.name for s in self.state if s.name not in new]
        assert not missing, f"step did not return state {missing}"
        return (*outputs, *[new[s.name] for s in self.state])


class _WeightsAsInputs(nn.Module):
    """`flat` with its parameters passed in as trailing inputs. The module is hidden from
    registration, so the exporter sees no parameters at all: its ONNX shape inference would
    otherwise serialise every parameter (twice), which for the 7B LM is 2 x 30 GB of work.
    (torch.func.functional_call does this swap but refuses to run under the tracer.)"""

    def __init__(self, flat: _FlatStep, names: Sequence[str]):
        super().__init__()
        self._hidden = [flat]
        self.names = list(names)

    def forward(self, *args):
        flat = self._hidden[0]
        n = len(args) - len(self.names)
        originals = {}
        try:
            for name, tensor in zip(self.names, args[n:]):
                owner, _, leaf = name.rpartition(".")
                module = flat.get_submodule(owner)
                originals[name] = getattr(module, leaf)
                delattr(module, leaf)  # unregisters the parameter ...
                setattr(module, leaf, tensor)  # ... so a plain (traced) tensor can stand in
            return flat(*args[:n])
        finally:
            for name, param in originals.items():
                owner, _, leaf = name.rpartition(".")
                module = flat.get_submodule(owner)
                delattr(module, leaf)
                module.register_parameter(leaf, param)


@torch.no_grad()
def trace_step(owner: nn.Module, fn: Callable, inputs: Sequence[tuple[TensorSpec, torch.Tensor]],
               outputs: Sequence[str], state: Sequence[StateSpec], path: str | Path,
               weightless: bool = False,
               dynamic_axes: dict[str, dict[int, str]] | None = None) -> list[TensorSpec]:
    """Traces `fn` (a method of `owner`) into the graph `path` (export_step's arguments); with
    `weightless`, its parameters are graph inputs named `owner.<parameter name>` after the
    others, and no weight is written. Returns the specs of the non-state outputs."""
    path = Path(path)
    flat = _FlatStep(owner, fn, len(inputs), state).eval()
    examples = [t for _, t in inputs] + list(initial_state(state).values())
    input_names = [s.name for s, _ in inputs] + [s.input_name for s in state]
    output_names = list(outputs) + [s.output_name for s in state]
    results = flat(*examples)
    if weightless:
        params = dict(flat.named_parameters())  # "owner.<parameter name>"
        flat = _WeightsAsInputs(flat, list(params))
        examples += list(params.values())
        input_names = input_names + list(params)
    out_specs = [TensorSpec(name, tuple(t.shape), str(t.dtype).removeprefix("torch."))
                 for name, t in zip(outputs, results[:len(outputs)])]
    for spec, t in zip(state, results[len(outputs):]):
        if tuple(t.shape) != spec.shape or str(t.dtype).removeprefix("torch.") != spec.dtype:
            raise AssertionError(f"state {spec.name}: step returns {tuple(t.shape)} {t.dtype}, "
                                 f"declared {spec.shape} {spec.dtype}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about constant shapes are intended
        # Constant folding stays off: the TorchScript exporter's folding drops initializers that
        # have equal values (all-ones norm weights, say) while nodes still use them, giving an
        # invalid graph. onnxruntime and TensorRT fold constants themselves at load.
        torch.onnx.export(flat, tuple(examples), str(path), input_names=input_names,
                          output_names=output_names, opset_version=OPSET, dynamo=False,
                          do_constant_folding=False, dynamic_axes=dynamic_axes)
    return out_specs


def export_step(owner: nn.Module, fn: Callable, inputs: Sequence[tuple[TensorSpec, torch.Tensor]],
                outputs: Sequence[str], state: Sequence[StateSpec], path: str | Path,
                weights: Callable[[Path], dict[str, str]] | None = None,
                dynamic_axes: dict[str, dict[int, str]] | None = None) -> GraphEntry:
    """Traces `fn` (a method of `owner`) into `path` and returns its manifest entry.

    `inputs` pairs each non-state input's spec with an example tensor; `outputs` names the
    non-state outputs in the order `fn` returns them. `weights(path)`, when given, turns the
    parameter inputs of the weightless trace into external data and returns {data file: sha256};
    parameters are then named `owner.<parameter name>`. `dynamic_axes` ({tensor: {axis: name}})
    leaves those axes free in the graph (the manifest records the traced sizes)."""
    path = Path(path)
    out_specs = trace_step(owner, fn, inputs, outputs, state, path, weights is not None,
                           dynamic_axes)
    data_files = {} if weights is None else dict(weights(path))
    input_names = [s.name for s, _ in inputs] + [s.input_name for s in state]
    onnx.checker.check_model(str(path))
    model = onnx.load(str(path), load_external_data=False)
    left = [i.name for i in model.graph.input if i.name not in input_names]
    if left:
        raise AssertionError(f"{path.name}: parameters without weights: {left[:5]}")
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            location = next(e.value for e in init.external_data if e.key == "location")
            if location not in data_files:
                data_files[location] = sha256_file(path.parent / location)
    return GraphEntry(file=path.name, sha256=sha256_file(path),
                      inputs=[s for s, _ in inputs], outputs=out_specs, state=list(state),
                      data_files=data_files)


class ExportMismatch(PersonaPlexError):
    """An exported graph that does not compute what its torch module computes."""


# The largest absolute difference a float output of a graph may show against its torch module
# (with rtol 1e-4 on top): float32 rounding, reordered by onnxruntime's kernels, stays ~100x below.
CHECK_ATOL = 1e-4


@torch.no_grad()
def verify_step(path: str | Path, fn: Callable, inputs: dict[str, np.ndarray],
                outputs: Sequence[str], state: Sequence[StateSpec] = (), frames: int = 1,
                atol: float | None = CHECK_ATOL, low_memory: bool = False,
                weights: dict[str, np.ndarray] | None = None) -> dict[str, float]:
    """Runs the graph in onnxruntime beside its step function (`fn(*inputs, state) ->
    (outputs, new_state)`, as given to export_step) for `frames` calls from the initial state,
    feeding each its own state back; raises ExportMismatch on the first output that differs
    (beyond `atol`; integer outputs must be equal). Returns what it measured, per output over
    every call: the largest absolute difference of a float output, the fraction of elements
    that differ of an integer one. With `atol` None nothing is refused but a shape or dtype:
    the figures are only measured.
    `low_memory` keeps onnxruntime to one copy of the weights, for graphs as large as the
    memory allows: no pre-packed duplicates, no arena, and basic optimisation only. (Basic
    still folds each weight's Transpose into one transposed copy; without it every Transpose
    runs at once at the start of each call, a second copy of all weights.)
    `weights` feeds the graph's parameters as inputs (a graph traced without its weights,
    export_step): then the extended optimisations run, which fuse each weight's Transpose
    into its MatMul (FusedMatMul), so no transposed copy is made at all."""
    import onnxruntime as ort

    path = Path(path)
    opts = ort.SessionOptions()
    if low_memory:
        opts.add_session_config_entry("session.disable_prepacking", "1")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.enable_cpu_mem_arena = False
    if weights:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    weights = weights or {}
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    state_t = initial_state(state)
    state_n = {s.input_name: v.numpy() for s, v in zip(state, state_t.values())}
    names = list(outputs) + [s.output_name for s in state]
    measured = dict.fromkeys(outputs, 0.0)
    for frame in range(frames):
        want, new = fn(*[torch.from_numpy(v) for v in inputs.values()], state_t)
        want = [want] if isinstance(want, torch.Tensor) else list(want)
        state_t.update(new)
        got = sess.run(names, {**inputs, **state_n, **weights})
        for name, g, w in zip(outputs, got, want):
            w = w.numpy()
            if g.shape != w.shape or g.dtype != w.dtype:
                raise ExportMismatch(f"{path.name}: output {name} is {g.shape} {g.dtype} in "
                                     f"onnxruntime, {w.shape} {w.dtype} in torch")
            if np.issubdtype(w.dtype, np.integer):
                figure = float(np.mean(g != w)) if w.size else 0.0
                bad = figure > 0
            else:
                figure = float(np.abs(g.astype(np.float64) - w).max()) if w.size else 0.0
                bad = atol is not None and not np.allclose(g, w, atol=atol, rtol=1e-4)
            measured[name] = max(measured[name], figure)
            if bad and atol is not None:
                what = ("max abs diff" if not np.issubdtype(w.dtype, np.integer)
                        else "fraction differing")
                raise ExportMismatch(f"{path.name}: output {name} differs between onnxruntime "
                                     f"and torch at call {frame} ({what} {figure:.3g})")
        state_n = {s.input_name: v for s, v in zip(state, got[len(outputs):])}
    return measured


def graph_ops(path: str | Path) -> set[str]:
    """Every op type in a graph (subgraphs included), for the TensorRT op check."""
    model = onnx.load(str(path), load_external_data=False)
    ops: set[str] = set()

    def walk(graph):
        for node in graph.node:
            ops.add(node.op_type if node.domain in ("", "ai.onnx") else
                    f"{node.domain}.{node.op_type}")
            for attr in node.attribute:
                if attr.g is not None and attr.g.node:
                    walk(attr.g)

    walk(model.graph)
    return ops
