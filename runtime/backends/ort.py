"""One exported graph on onnxruntime: the session, loaded once per model and shared read-only by
every conversation (`OrtModelGraph`), and the buffers of one conversation's batch bound to it
(`OrtGraph`, from `bind()`). onnxruntime runs one session from several threads at once, each
run with its own IO binding, so conversations on one model need no lock.

Every input, output and state buffer of a bound graph is allocated once, on the backend's
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

from personaplex_edge.contract import STATE_INPUT_PREFIX
from personaplex_edge.errors import ModelDirError
from personaplex_edge.manifest import GraphEntry

from .ort_install import import_onnxruntime
from .state import BoundGraph, HostStore, dims_agree, write_ring_rows

_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64,
              "int32": np.int32, "bool": np.bool_}
_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16",
              "tensor(bfloat16)": "bfloat16",
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
    ort = import_onnxruntime()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = default_threads() if threads is None else threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return opts


def choose_providers(device: str = "auto") -> list[str]:
    available = import_onnxruntime().get_available_providers()
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


class OrtModelGraph:
    """A graph's onnxruntime session, checked against the manifest: the read-only half,
    holding the weights once however many conversations run on it."""

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
        check_signature(entry, self.session)
        self.device = "cuda" if self.session.get_providers()[0] == "CUDAExecutionProvider" \
            else "cpu"
        self.runs_on = f"onnxruntime-{self.device}"
        if self.device != "cpu" and (entry.rings or entry.state):
            raise ModelDirError(f"{entry.file} has state on the GPU, which OrtCudaGraph handles "
                                "(open graphs with runtime.backends.load_graph)")

    def bind(self) -> "OrtGraph":
        return OrtGraph(self)

    def close(self) -> None:
        self.session = None


def check_signature(entry: GraphEntry, session) -> None:
    """The graph's real inputs/outputs must be exactly what the manifest promises."""
    want_in = {t.name: (t.shape, t.dtype) for t in entry.inputs}
    want_out = {t.name: (t.shape, t.dtype) for t in entry.outputs}
    for s in entry.state:
        want_in[s.input_name] = (s.shape, s.dtype)
        want_out[s.output_name] = (s.shape, s.dtype)
    for r in entry.rings:
        want_in[r.input_name] = (r.shape, r.dtype)
        want_out[r.output_name] = (r.rows_shape, r.dtype)
    have_in = {a.name: (_dims(a.shape), _ORT_TYPES.get(a.type, a.type))
               for a in session.get_inputs()}
    have_out = {a.name: (_dims(a.shape), _ORT_TYPES.get(a.type, a.type))
                for a in session.get_outputs()}
    for kind, want, have in (("input", want_in, have_in), ("output", want_out, have_out)):
        problems = [f"{kind} {n}: manifest {want.get(n)}, graph {have.get(n)}"
                    for n in sorted(set(want) | set(have))
                    if not _agrees(want.get(n), have.get(n))]
        if problems:
            raise ModelDirError(f"{entry.file} disagrees with the manifest; re-export "
                                "the model:\n  " + "\n  ".join(problems[:10]))


def _dims(shape) -> tuple:
    """onnxruntime's shape with a symbolic (dynamic) dimension as -1."""
    return tuple(d if isinstance(d, int) else -1 for d in shape)


def _agrees(want, have) -> bool:
    """(shape, dtype) of the manifest against the graph's (see dims_agree)."""
    if want is None or have is None:
        return want == have
    return want[1] == have[1] and dims_agree(want[0], have[0])


class OrtGraph(BoundGraph):
    """One conversation batch's buffers bound to a shared session. `inputs`/`outputs` are host
    arrays: write the former, call `run()`, read the latter (valid until the next run)."""

    def __init__(self, graph: OrtModelGraph):
        import onnxruntime as ort

        entry = self.entry = graph.entry
        self.graph = graph
        self.device = graph.device
        self.batch = entry.inputs[0].shape[0]
        self._session = graph.session
        # host-side buffers for the per-call inputs and outputs
        self.inputs = {t.name: np.zeros(t.shape, _NP_DTYPES[t.dtype]) for t in entry.inputs}
        self.outputs = {t.name: np.zeros(t.shape, _NP_DTYPES[t.dtype]) for t in entry.outputs}
        self._dev_inputs = {n: self._value(a) for n, a in self.inputs.items()}
        self._dev_outputs = {n: self._value(a) for n, a in self.outputs.items()}
        # two state sets, ping-pong; the OrtValues share the numpy arrays' memory
        host = [{s.name: np.full(s.shape, s.init, _NP_DTYPES[s.dtype]) for s in entry.state}
                for _ in range(2)]
        self._stores = [{n: HostStore(a) for n, a in h.items()} for h in host]
        self._state_values = [{n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in h.items()}
                              for h in host]
        # KV rings: read whole by the graph, written one row per step by us, in place
        self.rings = {r.input_name: np.zeros(r.shape, _NP_DTYPES[r.dtype]) for r in entry.rings}
        self._ring_stores = {n: HostStore(a) for n, a in self.rings.items()}
        self._rows = {r.output_name: np.zeros(r.rows_shape, _NP_DTYPES[r.dtype])
                      for r in entry.rings}
        self._bindings = [self._bind(read=i, write=1 - i) for i in range(2)]
        self._turn = 0
        # each row's ring position before a call, by the input or state that holds it
        self._positions = {r.position: np.zeros(self.batch, np.int64) for r in entry.rings}

    def _value(self, host: np.ndarray):
        import onnxruntime as ort

        if self.device == "cpu":
            return ort.OrtValue.ortvalue_from_numpy(host)  # shares host memory
        return ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)

    def _bind(self, read: int, write: int):
        import onnxruntime as ort

        binding = self._session.io_binding()
        for name, value in self._dev_inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name, value in self._dev_outputs.items():
            binding.bind_ortvalue_output(name, value)
        for s in self.entry.state:
            binding.bind_ortvalue_input(s.input_name, self._state_values[read][s.name])
            binding.bind_ortvalue_output(s.output_name, self._state_values[write][s.name])
        for r in self.entry.rings:
            binding.bind_ortvalue_input(r.input_name,
                                        ort.OrtValue.ortvalue_from_numpy(self.rings[r.input_name]))
            binding.bind_ortvalue_output(r.output_name,
                                         ort.OrtValue.ortvalue_from_numpy(self._rows[r.output_name]))
        return binding

    def ring_positions(self, position: str) -> np.ndarray:
        """[B]: where each row's next rows go, from the graph input or state `position` names
        (a RingSpec's), as it is before the call (a view)."""
        if position in self.inputs:
            return self.inputs[position].reshape(-1)
        return self._stores[self._turn][position.removeprefix(STATE_INPUT_PREFIX)].array.reshape(-1)

    def _call(self, active: list[int] | None) -> None:
        self._check_open(self._session)
        if self.device != "cpu":
            for name, host in self.inputs.items():
                self._dev_inputs[name].update_inplace(host)
        for name, before in self._positions.items():
            np.copyto(before, self.ring_positions(name))
        self._session.run_with_iobinding(self._bindings[self._turn])
        rows = range(self.batch) if active is None else active
        for r in self.entry.rings:
            write_ring_rows(r, self.rings[r.input_name], self._rows[r.output_name],
                            self._positions[r.position], rows)
        if self.device != "cpu":
            for name, value in self._dev_outputs.items():
                np.copyto(self.outputs[name], value.numpy())

    def run_frames(self, frames: dict[str, np.ndarray], active: list[int]) -> None:
        """One call over F frames (a graph with a frames axis: helium_step): `frames` holds the
        framed inputs ([B, F, ...], e.g. tokens and extra_embedding); the other inputs are
        `inputs` as they are. The F new K/V rows of each `active` row go to slots
        position[b]..position[b] + F - 1; the other rows are not written. The per-call buffers
        are made for this call: it runs once per persona, not per frame."""
        import onnxruntime as ort

        count = self._frames_count(frames, self._session)
        binding = self._session.io_binding()
        keep = []  # the arrays the binding reads and writes, alive for the call
        for name, value in self._dev_inputs.items():
            if name in frames:
                a = np.ascontiguousarray(frames[name])
                keep.append(a)
                binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(a))
            else:
                binding.bind_ortvalue_input(name, value)
        for name, value in self._dev_outputs.items():
            binding.bind_ortvalue_output(name, value)
        rows = {}
        for r in self.entry.rings:
            shape = list(r.rows_shape)
            shape[r.axis] = count
            rows[r.output_name] = np.zeros(shape, self._rows[r.output_name].dtype)
            binding.bind_ortvalue_input(r.input_name,
                                        ort.OrtValue.ortvalue_from_numpy(self.rings[r.input_name]))
            binding.bind_ortvalue_output(r.output_name,
                                         ort.OrtValue.ortvalue_from_numpy(rows[r.output_name]))
        for name, before in self._positions.items():
            np.copyto(before, self.ring_positions(name))
        self._session.run_with_iobinding(binding)
        for r in self.entry.rings:
            write_ring_rows(r, self.rings[r.input_name], rows[r.output_name],
                            self._positions[r.position], active)

    def close(self) -> None:
        """Lets this batch's bindings go now; the graph cannot run after this (the shared
        session stays with its model)."""
        self._session = self._bindings = None
