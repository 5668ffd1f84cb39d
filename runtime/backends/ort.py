"""One exported graph on onnxruntime, with its state owned by the runtime and bound once.

Every input, output and state buffer is allocated when the graph is loaded, on the backend's
device, and bound with IO binding. State ping-pongs between two buffer sets: call n reads set A
(`past.*`) and writes set B (`present.*`), call n+1 the reverse, so no state is copied or
allocated per frame and the graph never reads a buffer it is writing. Per call only the small
inputs are copied in (`np.copyto` into a bound host buffer, or one host-to-device copy) and the
small outputs read back. KV rings are read whole by the graph, which returns only the call's new
rows; `run()` writes those in place at their slots (see RingSpec), so no ring is ever copied.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from personaplex_edge.errors import ModelDirError
from personaplex_edge.manifest import GraphEntry

from .state import check_state, copy_input

_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64,
              "int32": np.int32, "bool": np.bool_}
_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16",
              "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(bool)": "bool"}


def default_threads() -> int:
    """Intra-op threads: PERSONAPLEX_THREADS, else every core onnxruntime would use."""
    value = os.environ.get("PERSONAPLEX_THREADS")
    return int(value) if value else 0  # 0 lets onnxruntime pick (one per physical core)


def session_options(threads: int | None = None):
    """Options for every session the runtime makes. Intra-op threads do not spin when idle:
    a session's threads that keep spinning after its run steal the cores of the next graph in
    the frame (measured on 2 cores, Mimi encode + decode interleaved: 62 ms with spinning,
    33 ms without, 31-38 ms with one process-wide pool, which would force every other session
    in the process onto that pool)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = default_threads() if threads is None else threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return opts


def choose_providers(device: str = "auto") -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "cuda":
        if "CUDAExecutionProvider" not in available:
            raise ModelDirError("--device cuda needs onnxruntime-gpu with a working CUDA "
                                "(pip install 'personaplex-edge[gpu]'); this onnxruntime offers "
                                + ", ".join(available))
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if device != "auto":
        raise ModelDirError(f"unknown device {device!r}; use auto, cpu or cuda")
    if "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class OrtGraph:
    """A graph with bound buffers. `inputs`/`outputs` are host arrays: write the former, call
    `run()`, read the latter (valid until the next run)."""

    def __init__(self, model_dir: str | Path, entry: GraphEntry,
                 providers: Sequence[str] = ("CPUExecutionProvider",), threads: int | None = None):
        import onnxruntime as ort

        self.entry = entry
        path = Path(model_dir) / entry.file
        try:
            self.session = ort.InferenceSession(str(path), session_options(threads),
                                                providers=list(providers))
        except Exception as e:
            raise ModelDirError(f"onnxruntime cannot load {path}: {e}") from e
        self._check_signature()
        self.device = "cuda" if self.session.get_providers()[0] == "CUDAExecutionProvider" \
            else "cpu"

        # host-side buffers for the per-call inputs and outputs
        self.inputs = {t.name: np.zeros(t.shape, _NP_DTYPES[t.dtype]) for t in entry.inputs}
        self.outputs = {t.name: np.zeros(t.shape, _NP_DTYPES[t.dtype]) for t in entry.outputs}
        self._dev_inputs = {n: self._device_value(a) for n, a in self.inputs.items()}
        self._dev_outputs = {n: self._device_value(a) for n, a in self.outputs.items()}
        # two state sets, ping-pong
        self._state = [{s.name: self._device_value(np.full(s.shape, s.init, _NP_DTYPES[s.dtype]))
                        for s in entry.state} for _ in range(2)]
        # KV rings: read whole by the graph, written one row per step by us, in place
        self.rings = {r.input_name: self._device_value(np.zeros(r.shape, _NP_DTYPES[r.dtype]))
                      for r in entry.rings}
        self._rows = {r.output_name: self._device_value(np.zeros(r.rows_shape,
                                                                 _NP_DTYPES[r.dtype]))
                      for r in entry.rings}
        if entry.rings and self.device != "cpu":
            raise ModelDirError("KV rings on the GPU are handled by OrtCudaGraph (open graphs "
                                "with runtime.backends.open_graph; it needs cuda-python)")
        self._positions = {r.input_name: 0 for r in entry.rings}
        self._bindings = [self._bind(read=i, write=1 - i) for i in range(2)]
        self._turn = 0

    # -- setup --------------------------------------------------------------------------------
    def _check_signature(self) -> None:
        """The graph's real inputs/outputs must be exactly what the manifest promises."""
        want_in = {t.name: (t.shape, t.dtype) for t in self.entry.inputs}
        want_out = {t.name: (t.shape, t.dtype) for t in self.entry.outputs}
        for s in self.entry.state:
            want_in[s.input_name] = (s.shape, s.dtype)
            want_out[s.output_name] = (s.shape, s.dtype)
        for r in self.entry.rings:
            want_in[r.input_name] = (r.shape, r.dtype)
            want_out[r.output_name] = (r.rows_shape, r.dtype)
        have_in = {a.name: (tuple(a.shape), _ORT_TYPES.get(a.type, a.type))
                   for a in self.session.get_inputs()}
        have_out = {a.name: (tuple(a.shape), _ORT_TYPES.get(a.type, a.type))
                    for a in self.session.get_outputs()}
        for kind, want, have in (("input", want_in, have_in), ("output", want_out, have_out)):
            problems = [f"{kind} {n}: manifest {want.get(n)}, graph {have.get(n)}"
                        for n in sorted(set(want) | set(have)) if want.get(n) != have.get(n)]
            if problems:
                raise ModelDirError(f"{self.entry.file} disagrees with the manifest; re-export "
                                    "the model:\n  " + "\n  ".join(problems[:10]))

    def _device_value(self, host: np.ndarray):
        import onnxruntime as ort

        if getattr(self, "device", "cpu") == "cpu":
            return ort.OrtValue.ortvalue_from_numpy(host)  # shares host memory
        return ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)

    def _bind(self, read: int, write: int):
        binding = self.session.io_binding()
        for name, value in self._dev_inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name, value in self._dev_outputs.items():
            binding.bind_ortvalue_output(name, value)
        for s in self.entry.state:
            binding.bind_ortvalue_input(s.input_name, self._state[read][s.name])
            binding.bind_ortvalue_output(s.output_name, self._state[write][s.name])
        for r in self.entry.rings:
            binding.bind_ortvalue_input(r.input_name, self.rings[r.input_name])
            binding.bind_ortvalue_output(r.output_name, self._rows[r.output_name])
        return binding

    def ring_position(self, spec) -> int:
        """Where the next call's first row goes: the graph input or state `spec.position`
        names, as it is before the call (all batch rows share it)."""
        if spec.position in self.inputs:
            return int(self.inputs[spec.position].flat[0])
        value = self._state[self._turn][spec.position.removeprefix("past.")]
        return int(value.numpy().flat[0])

    def _write_rings(self) -> None:
        """Stores the last call's new K/V rows in place at their slots of each ring."""
        for r in self.entry.rings:
            r.write(self.rings[r.input_name].numpy(), self._rows[r.output_name].numpy(),
                    self._positions[r.input_name])

    # -- per call -------------------------------------------------------------------------------
    def run(self) -> dict[str, np.ndarray]:
        if self.device != "cpu":
            for name, host in self.inputs.items():
                self._dev_inputs[name].update_inplace(host)
        for r in self.entry.rings:
            self._positions[r.input_name] = self.ring_position(r)
        self.session.run_with_iobinding(self._bindings[self._turn])
        self._turn = 1 - self._turn
        self._write_rings()
        if self.device != "cpu":
            for name, value in self._dev_outputs.items():
                np.copyto(self.outputs[name], value.numpy())
        return self.outputs

    def reset(self) -> None:
        """Back to the initial state (the manifest's init values), in place. KV rings need no
        clearing: slots not written since the reset are masked by position."""
        for s in self.entry.state:
            value = self._state[self._turn][s.name]
            if self.device == "cpu":
                value.numpy()[...] = s.init
            else:
                value.update_inplace(np.full(s.shape, s.init, _NP_DTYPES[s.dtype]))

    def state(self) -> dict[str, np.ndarray]:
        """The current state, KV rings included, as host arrays (a copy; to save a stream, or
        for inspection and tests)."""
        out = {n: v.numpy().copy() for n, v in self._state[self._turn].items()}
        out.update({n: v.numpy().copy() for n, v in self.rings.items()})
        return out

    def set_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Replaces the whole state (e.g. one saved with `state()`), checking every tensor."""
        for name, a in check_state(self.entry, arrays).items():
            value = self.rings[name] if name in self.rings else self._state[self._turn][name]
            if self.device == "cpu":
                np.copyto(value.numpy(), a)
            else:
                value.update_inplace(a)

    def close(self) -> None:
        """Lets onnxruntime's session and its bindings go now (host buffers: nothing else to
        free); the graph cannot run after this."""
        self.session = self._bindings = None

    def set_input(self, name: str, value: np.ndarray) -> None:
        copy_input(self.entry.file, self.inputs, name, value)
