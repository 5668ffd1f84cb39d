"""One graph on onnxruntime's WebGPU provider, state and KV rings on the adapter: the WebGPU
counterpart of ort_cuda.py, with the same two halves (the shared session,
`OrtWebGpuModelGraph`; one conversation batch's buffers, `OrtWebGpuGraph`).

Per call, only the graph's small inputs go up and its small outputs come down (tokens, codes,
1920 samples); the state tensors ping-pong between two sets on the adapter, and each KV ring is
written in place after the step by webgpu_rings.RingWriter (its new rows only).

onnxruntime copies a bound input to the device of the node that reads it when it is bound, not
at each run (a host array read on the adapter, or a state tensor that a node kept on the CPU
reads): so each call binds its inputs again, and the copy each needs happens then - the small
inputs go up from the host arrays themselves, the rest stay where they are.

Graph capture (`capture=True`, the provider's enableGraphCapture): the first run of each state
parity records the step's GPU commands and later runs replay them. Replay needs every buffer
fixed and every node on the adapter, so the inputs and outputs are then buffers on the adapter
too (the host arrays copied into them and out of them each call, nothing bound again), each
parity is its own captured graph, and each conversation bound to the shared session takes its
own pair of graph ids. Without capture the outputs are bound as the host arrays themselves.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np

from personaplex_edge.contract import STATE_INPUT_PREFIX
from personaplex_edge.errors import ModelDirError
from personaplex_edge.manifest import GraphEntry

from .ort import check_signature, session_options
from .state import BoundGraph, host_dtype
from .webgpu_adapter import WebGpuAdapter
from .webgpu_rings import ADAPTER_LOCK, RingWriter, WebGpuStore, device_value

# int64 arithmetic (positions, token indices) kept on the adapter instead of a trip through
# the CPU between kernels: without it the depformer's every step sends its token to the host
PROVIDER_OPTIONS = {"enableInt64": "1"}
CAPTURE_SWITCH = "PERSONAPLEX_WEBGPU_CAPTURE"


def capture_asked() -> bool:
    """Whether graph capture is asked for (PERSONAPLEX_WEBGPU_CAPTURE=1)."""
    return os.environ.get(CAPTURE_SWITCH, "0") not in ("", "0")


def adapter_options(adapter: WebGpuAdapter, threads: int | None = None):
    """SessionOptions maker for `adapter`: capture -> options (threads serve the nodes
    onnxruntime keeps on the CPU)."""
    def make(capture: bool):
        opts = session_options(threads)
        if capture:  # a refused capture is the caller's to say, not onnxruntime's error line
            opts.log_severity_level = 4
        opts.add_provider_for_devices([adapter.ep_device], {
            **PROVIDER_OPTIONS, "enableGraphCapture": "1" if capture else "0"})
        return opts
    return make


class OrtWebGpuModelGraph:
    """The shared half: the session on the adapter, its signature checked."""

    def __init__(self, model_dir: str | Path, entry: GraphEntry, adapter: WebGpuAdapter,
                 threads: int | None = None, capture: bool = False):
        import onnxruntime as ort

        self.entry = entry
        self.adapter = adapter
        self.runs_on = "onnxruntime-webgpu"
        self.options = adapter_options(adapter, threads)
        self._graph_ids = itertools.count(1)
        self.capture_refused: str | None = None  # why the provider would not capture it
        self.capture_asked = capture  # the ring write (all on the adapter) is captured anyway
        path = Path(model_dir) / entry.file
        try:
            try:
                with ADAPTER_LOCK:
                    self.session = ort.InferenceSession(str(path), self.options(capture))
            except Exception as e:
                if not capture or "graph capture" not in str(e):
                    raise
                # a node kept on the CPU (an int64 op the provider has no kernel for): the
                # graph runs, uncaptured
                self.capture_refused = "nodes of it run on the CPU"
                capture = False
                with ADAPTER_LOCK:
                    self.session = ort.InferenceSession(str(path), self.options(False))
        except Exception as e:
            raise ModelDirError(f"onnxruntime cannot load {path} on the WebGPU adapter "
                                f"{adapter.name}: {e}") from e
        self.capture = capture
        check_signature(entry, self.session)

    def graph_ids(self) -> tuple[int, int]:
        """A pair of capture ids no other conversation on the shared session uses."""
        return next(self._graph_ids), next(self._graph_ids)

    def bind(self) -> "OrtWebGpuGraph":
        with ADAPTER_LOCK:  # its buffers are made and bound on the adapter
            return OrtWebGpuGraph(self)

    def close(self) -> None:
        self.session = None


class OrtWebGpuGraph(BoundGraph):
    def __init__(self, graph: OrtWebGpuModelGraph):
        import onnxruntime as ort

        entry = self.entry = graph.entry
        self.graph = graph
        self.device = "webgpu"
        self.batch = entry.inputs[0].shape[0]
        self._session = graph.session
        self._capture = graph.capture
        self.inputs = {t.name: np.zeros(t.shape, host_dtype(t.dtype)) for t in entry.inputs}
        self.outputs = {t.name: np.zeros(t.shape, host_dtype(t.dtype)) for t in entry.outputs}
        if self._capture:  # fixed buffers on the adapter, copied to and from each call
            self._dev_in = {t.name: device_value(t.shape, t.dtype) for t in entry.inputs}
            self._dev_out = {t.name: device_value(t.shape, t.dtype) for t in entry.outputs}
        else:  # the host arrays themselves (the module docstring: bound again each call)
            self._dev_in = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in self.inputs.items()}
            self._dev_out = {n: ort.OrtValue.ortvalue_from_numpy(a)
                             for n, a in self.outputs.items()}
        self._state = [{s.name: device_value(s.shape, s.dtype, s.init) for s in entry.state}
                       for _ in range(2)]
        self._stores = [{n: WebGpuStore(v) for n, v in st.items()} for st in self._state]
        self._rings = RingWriter(entry.rings, graph.options, graph.capture_asked) \
            if entry.rings else None
        self._ring_stores = {r.input_name: WebGpuStore(self._rings.rings[i])
                             for i, r in enumerate(entry.rings)}
        self._bindings = [self._bind(read=i, write=1 - i) for i in range(2)]
        self._run_options = []
        ids = graph.graph_ids() if self._capture else (-1, -1)
        for parity in range(2):
            opts = ort.RunOptions()
            if self._capture:
                opts.add_run_config_entry("gpu_graph_id", str(ids[parity]))
            self._run_options.append(opts)
        self._turn = 0
        # the host mirror of each ring position held in a state tensor (Mimi's step counter)
        states = {s.name for s in entry.state}
        self._rows_per_call = {r.position: r.rows for r in entry.rings
                               if r.position.removeprefix(STATE_INPUT_PREFIX) in states}
        if any(r.rows != self._rows_per_call.get(r.position, r.rows) for r in entry.rings):
            raise ModelDirError(f"{entry.file}: rings sharing a position write different rows "
                                "per call")
        self._mirrors = {name: np.zeros(self.batch, np.int64) for name in self._rows_per_call}
        self._positions_changed()

    def _bind(self, read: int, write: int):
        binding = self._session.io_binding()
        self._bind_inputs(binding, read)
        for name, value in self._dev_out.items():
            binding.bind_ortvalue_output(name, value)
        for s in self.entry.state:
            binding.bind_ortvalue_output(s.output_name, self._state[write][s.name])
        for i, r in enumerate(self.entry.rings):
            binding.bind_ortvalue_output(r.output_name, self._rings.rows[i])
        return binding

    def _bind_inputs(self, binding, read: int) -> None:
        """Binding an input copies it to where the graph reads it (the adapter, or the CPU for
        a node onnxruntime keeps there) at that moment, not at each run: so without capture
        every input is bound again before each call, state and rings included (a no-op for a
        buffer already where it is read)."""
        for name, value in self._dev_in.items():
            binding.bind_ortvalue_input(name, value)
        for s in self.entry.state:
            binding.bind_ortvalue_input(s.input_name, self._state[read][s.name])
        for i, r in enumerate(self.entry.rings):
            binding.bind_ortvalue_input(r.input_name, self._rings.rings[i])

    def _positions(self) -> dict[str, np.ndarray]:
        """Each ring position's [B] values before the call: a host input as it is, a state
        tensor (Mimi's step counter) from its host mirror."""
        out = {name: self.inputs[name].reshape(-1).copy()
               for name in {r.position for r in self.entry.rings} if name in self.inputs}
        out.update({name: mirror.copy() for name, mirror in self._mirrors.items()})
        return out

    def _positions_changed(self) -> None:
        """State written from outside (reset, set_state, held rows put back): each position
        state read back into its mirror, the one read of the adapter this takes."""
        with ADAPTER_LOCK:
            for name, mirror in self._mirrors.items():
                state = name.removeprefix(STATE_INPUT_PREFIX)
                np.copyto(mirror, self._state[self._turn][state].numpy().reshape(-1))

    def _advance_positions(self, active: list[int] | None) -> None:
        """After a call: a position state moves on by its ring's rows (the ring contract: the
        next call's first row follows this call's last), so no frame reads it back."""
        for name, mirror in self._mirrors.items():
            steps = self._rows_per_call[name]
            if active is None:
                mirror += steps
            else:
                mirror[active] += steps

    def _call(self, active: list[int] | None) -> None:
        with ADAPTER_LOCK:
            self._call_locked(active)

    def _call_locked(self, active: list[int] | None) -> None:
        self._check_open(self._session)
        positions = self._positions() if self._rings is not None else {}
        binding = self._bindings[self._turn]
        if self._capture:
            for name, host in self.inputs.items():
                self._dev_in[name].update_inplace(host)
        else:
            self._bind_inputs(binding, self._turn)
        self._session.run_with_iobinding(binding, self._run_options[self._turn])
        if self._rings is not None:
            self._rings.write(positions, active)
            self._advance_positions(active)
        if self._capture:
            for name, value in self._dev_out.items():
                np.copyto(self.outputs[name], value.numpy())

    def run_frames(self, frames: dict[str, np.ndarray], active: list[int]) -> None:
        """One call over F frames (helium_step's frames axis: a persona's prefill), uncaptured;
        the F new K/V rows of each `active` row go to slots position[b]..position[b] + F - 1.
        Its buffers are made for the call: once per persona, not per frame."""
        import onnxruntime as ort

        with ADAPTER_LOCK:  # its buffers are made, bound and run on the adapter
            count = self._frames_count(frames, self._session)
            binding = self._session.io_binding()
            keep = []  # the host arrays the binding reads, alive for the call
            for name, host in self.inputs.items():
                a = np.ascontiguousarray(frames[name] if name in frames else host)
                keep.append(a)
                binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(a))
            for name, host in self.outputs.items():
                binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(host))
            new_rows = []
            for i, r in enumerate(self.entry.rings):
                shape = list(r.rows_shape)
                shape[r.axis] = count
                new_rows.append(device_value(shape, r.dtype, None))
                binding.bind_ortvalue_input(r.input_name, self._rings.rings[i])
                binding.bind_ortvalue_output(r.output_name, new_rows[-1])
            uncaptured = ort.RunOptions()
            uncaptured.add_run_config_entry("gpu_graph_id", "-1")
            positions = self._positions()
            self._session.run_with_iobinding(binding, uncaptured)
            self._rings.write_frames(new_rows, count, positions, active)

    def close(self) -> None:
        """Lets this batch's buffers go now; the graph cannot run after this (the shared
        session stays with its model)."""
        self._session = self._bindings = self._rings = None
