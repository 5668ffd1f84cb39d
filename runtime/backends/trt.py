"""One graph as a native TensorRT engine, with every buffer on the device: the deserialised
engine, shared read-only by every conversation on the model (`TrtEngine`), and one
conversation batch's execution context and buffers (`TrtGraph`, from `bind()`).

The same surface as `OrtGraph`: `inputs` / `outputs` are host arrays (write the former, call
`run()`, read the latter; run() also writes the new K/V rows into the rings), `reset()`,
`state()` / `set_state()` (rings included), `set_input()`. Inside:

- inputs and outputs have a pinned host array and a device buffer each; per run only those are
  copied (tokens, 1920 samples, a hidden vector, a few tokens back);
- state ping-pongs between two device buffer sets, exactly as in OrtGraph (call n reads set A
  and writes set B, call n + 1 the reverse), so no state is copied per frame;
- the KV rings and their new rows are `DeviceRings`: after each run, one strided device copy
  per row writes every ring's new rows in place, at the position the ring's spec names (an
  input, or a state tensor whose value is mirrored to the host after each run);
- everything is queued on one CUDA stream: `enqueue()` queues a run without waiting, `run()`
  waits for it. `link_input` feeds an input straight from another graph's device output
  (helium's hidden state into the depformer) so a frame's graphs chain on the device, and
  `cuda_graphs.CapturedSequence` can capture such a chain and replay it with one launch.

The engine may be mainline TensorRT's or TensorRT for RTX's: what differs on loading (the
validity check of the engine's header, the runtime cache of the JIT's kernels) is
trt_library.py. Torch-free: TensorRT's Python bindings and cuda-python only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from personaplex_edge.errors import ModelDirError, StateError
from personaplex_edge.manifest import GraphEntry, Manifest

from .cuda_runtime import (CudaError, DeviceBuffer, Stream, call, copy_to_device, copy_to_host,
                           device_info)
from .device_graph import DeviceGraph, nbytes
from .device_rings import ALIGN
from .state import dims_agree, host_dtype
from .trt_engine import check_compatible, check_engine_file, engine_spec, rebuild_sentence
from .trt_library import RuntimeCache, load_library, rtx_refusal, unsupported_gpu

# TensorRT DataType names -> manifest dtypes
_TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT64": "int64",
               "INT32": "int32", "BOOL": "bool", "INT8": "int8", "UINT8": "uint8"}


class TrtEngine:
    """A graph of a model directory as a deserialised TensorRT engine (mainline TensorRT or
    TensorRT for RTX, the library its record names), refused before loading where it was built
    for another library version or GPU (trt_engine.py) or, for TensorRT for RTX, where the
    engine's header says it cannot run here (trt_library.py)."""

    def __init__(self, model_dir: str | Path, manifest: Manifest, entry: GraphEntry,
                 device: int = 0, engine_dir: str | Path | None = None):
        """`engine_dir`: where the engine file is, when not beside its graph (the per-user
        cache's engines, engine_cache.py)."""
        self.entry = entry
        self.device_index = device
        model_dir = Path(model_dir)
        spec = engine_spec(model_dir, entry)
        self.lib = load_library(spec.library)
        self.runs_on = self.lib.name
        trt = self.lib.trt
        info = device_info(device)
        unsupported_gpu(self.lib, info.compute_capability, info.name)
        check_compatible(spec, self.lib.version, info.compute_capability, info.name, model_dir,
                         device_memory=info.total_memory, library=self.lib.name)
        # its sha256 checked before: by load_model_dir, or engine_cache for the cache's
        path = check_engine_file(engine_dir or model_dir, spec)
        call("cudaSetDevice", device)
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        refused = rtx_refusal(self.lib, self._runtime, path)
        if refused:
            raise ModelDirError(f"{path} cannot run on this {info.name}: {refused}. "
                                + rebuild_sentence(model_dir))
        self.engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise ModelDirError(f"{self.lib.title} could not load {path} (see its log above); "
                                "rebuild the engines on this machine")
        if spec.weightless:  # its weights are the graph's, read back in now
            failed = self.lib.refit(self.engine, model_dir / entry.file, self._logger)
            if failed:
                raise ModelDirError(f"{path} is weightless and could not be refit: {failed}. "
                                    + rebuild_sentence(model_dir))
        self._check_signature()
        self._jit = RuntimeCache(self.lib, spec.sha256, info.name)

    def context(self):
        """A new execution context (TensorRT for RTX compiles the engine's kernels for this GPU
        here, or takes them from the runtime cache, which is then kept)."""
        context = self._jit.context(self.engine)
        self._jit.save()
        return context

    def _check_signature(self) -> None:
        """The engine's tensors must be exactly what the manifest promises: the same names,
        each an input or an output as promised, with the same shape and dtype."""
        trt = self.lib.trt
        e = self.entry
        want: dict[str, tuple] = {}
        for t in e.inputs:
            want[t.name] = ("input", tuple(t.shape), t.dtype)
        for t in e.outputs:
            want[t.name] = ("output", tuple(t.shape), t.dtype)
        for s in e.state:
            want[s.input_name] = ("input", tuple(s.shape), s.dtype)
            want[s.output_name] = ("output", tuple(s.shape), s.dtype)
        for r in e.rings:
            want[r.input_name] = ("input", tuple(r.shape), r.dtype)
            want[r.output_name] = ("output", tuple(r.rows_shape), r.dtype)
        have: dict[str, tuple] = {}
        on_host = []
        for i in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(i)
            mode = self.engine.get_tensor_mode(name)
            dtype = self.engine.get_tensor_dtype(name)
            have[name] = ("input" if mode == trt.TensorIOMode.INPUT else "output",
                          tuple(self.engine.get_tensor_shape(name)),
                          _TRT_DTYPES.get(dtype.name, dtype.name))
            # an input that feeds a shape computation becomes a host tensor: TensorRT would
            # then read our device address as a host pointer
            if self.engine.get_tensor_location(name) != trt.TensorLocation.DEVICE:
                on_host.append(name)
        problems = [f"{n}: manifest {want.get(n)}, engine {have.get(n)}"
                    for n in sorted(set(want) | set(have)) if not _agrees(want.get(n), have.get(n))]
        problems += [f"{n}: TensorRT keeps it in host memory (a shape input); every tensor of "
                     "these graphs must be on the device" for n in on_host]
        if problems:
            raise ModelDirError(f"the engine of {e.file} disagrees with the manifest; rebuild "
                                "the engines:\n  " + "\n  ".join(problems[:10]))

    def bind(self, stream: Stream | None = None) -> "TrtGraph":
        return TrtGraph(self, stream)

    def close(self) -> None:
        if self.engine is not None:  # kernels compiled while it ran (a shape's first run)
            self._jit.save()
        self.engine = None


def _agrees(want, have) -> bool:
    """(mode, shape, dtype) of the manifest against the engine's (see dims_agree)."""
    if want is None or have is None:
        return want == have
    return want[0] == have[0] and want[2] == have[2] and dims_agree(want[1], have[1])


class TrtGraph(DeviceGraph):
    """One conversation batch on an engine (see the module docstring)."""

    def __init__(self, graph: TrtEngine, stream: Stream | None = None):
        self.graph = graph
        call("cudaSetDevice", graph.device_index)
        self._own_stream = stream is None
        self._allocate(graph.entry, stream or Stream())
        self.context = graph.context()
        for t in self.entry.inputs:  # fixes any dynamic dimension at the manifest's size
            if -1 in tuple(graph.engine.get_tensor_shape(t.name)):
                self.context.set_input_shape(t.name, tuple(t.shape))
        self._linked: dict[str, int] = {}  # input -> device address of another graph's output
        self._frames_context = None  # run_frames' own context, made on first use
        for name, buf in (*self._dev_in.items(), *self._dev_out.items()):
            self._set_address(name, buf.ptr)
        for name, ptr in (*self.rings.ring_ptr.items(), *self.rings.row_ptr.items()):
            self._set_address(name, ptr)
        self.reset()

    def _set_address(self, name: str, ptr: int) -> None:
        if ptr % ALIGN:  # setTensorAddress requires it; a misaligned one may fault in a kernel
            raise CudaError(f"{self.entry.file}: the address of {name} is not {ALIGN}-byte "
                            "aligned")
        if not self.context.set_tensor_address(name, ptr):
            raise CudaError(f"TensorRT refused the address of {name} in {self.entry.file}")

    def link_input(self, name: str, source: "TrtGraph", output: str) -> None:
        """Reads input `name` from `source`'s device output `output` instead of from the host:
        the graphs of a frame then chain on the device (no copy through the host, and a CUDA
        graph can capture them together). Both must use the same stream."""
        if source.stream is not self.stream:
            raise ValueError("linked graphs must share one stream")
        if name not in self._dev_in or output not in source._dev_out:
            raise StateError(f"cannot link {self.entry.file} input {name!r} to "
                             f"{source.entry.file} output {output!r}")
        self._linked[name] = source._dev_out[output].ptr
        self._set_address(name, self._linked[name])

    def put_output(self, name: str) -> None:
        """Queues the host's copy of output `name` back to its device buffer: a graph linked to
        that output then reads what the host made of it (a say() replaces the text token)."""
        pinned = self._pinned_out[name]
        copy_to_device(self._dev_out[name].ptr, pinned.array, self.stream, pinned.ptr)

    # -- per call -------------------------------------------------------------------------------
    def enqueue(self, rings: bool = True, active: list[int] | None = None) -> None:
        """Queues one run on the stream: inputs to the device, the engine, the new K/V rows into
        the rings (of the `active` rows; None: all), outputs back. Returns at once;
        `stream.synchronize()` waits. Does not flip the state parity (run() and
        CapturedSequence do). A CUDA graph capture passes rings=False: the slot moves every
        frame, so the ring write is queued after each replay instead (CapturedSequence)."""
        positions = self._positions.now()  # before the call, as the spec says
        for name, pinned in self._pinned_in.items():
            if name not in self._linked:
                copy_to_device(self._dev_in[name].ptr, pinned.array, self.stream, pinned.ptr)
        read, write = self._state[self._turn], self._state[1 - self._turn]
        for s in self.entry.state:
            self._set_address(s.input_name, read[s.name].ptr)
            self._set_address(s.output_name, write[s.name].ptr)
        if not self.context.execute_async_v3(self.stream.handle):
            raise CudaError(f"TensorRT could not run {self.entry.file} (see its log above)")
        if rings:
            self.rings.write(positions, self.stream, active)
        for name, pinned in self._pinned_out.items():
            copy_to_host(pinned.array, self._dev_out[name].ptr, self.stream, pinned.ptr)
        self._positions.after_run(self._state_ptrs(1 - self._turn), self.stream)

    def run_frames(self, frames: dict[str, np.ndarray], active: list[int]) -> None:
        """One call over F frames (helium_step's frames axis, within the engine's optimization
        profile): `frames` holds the framed inputs [B, F, ...]; the other inputs are `inputs`
        as they are. The F new K/V rows of each `active` row go to its slots position[b]..;
        the other rows are not written. It runs on an execution context of its own, so the
        live step's context (and a CUDA graph captured on it) keeps its shapes and addresses;
        the per-call buffers are made for the call (once per persona, not per frame)."""
        count = self._frames_count(frames, self.context)
        if self._frames_context is None:
            self._frames_context = self.graph.context()
        ctx, temps = self._frames_context, []

        def address(name: str, ptr: int) -> None:
            if ptr % ALIGN or not ctx.set_tensor_address(name, ptr):
                raise CudaError(f"TensorRT refused the address of {name} in {self.entry.file}")

        try:
            for t in self.entry.inputs:
                if t.name in frames:
                    a = np.ascontiguousarray(frames[t.name], host_dtype(t.dtype))
                    buf = DeviceBuffer(a.nbytes)
                    temps.append(buf)
                    copy_to_device(buf.ptr, a, self.stream)
                    ptr, shape = buf.ptr, a.shape
                else:
                    ptr, shape = self._linked.get(t.name, self._dev_in[t.name].ptr), t.shape
                    if t.name not in self._linked:
                        pinned = self._pinned_in[t.name]
                        copy_to_device(ptr, pinned.array, self.stream, pinned.ptr)
                if not ctx.set_input_shape(t.name, tuple(shape)):
                    raise CudaError(f"{self.entry.file}: {count} frames are outside the "
                                    "engine's optimization profile; rebuild the engines")
                address(t.name, ptr)
            for t in self.entry.outputs:
                address(t.name, self._dev_out[t.name].ptr)
            new_rows = {}
            for r in self.entry.rings:
                address(r.input_name, self.rings.ring_ptr[r.input_name])
                shape = list(r.rows_shape)
                shape[r.axis] = count
                buf = DeviceBuffer(nbytes(shape, r.dtype))
                temps.append(buf)
                new_rows[r.output_name] = buf.ptr
                address(r.output_name, buf.ptr)
            positions = self._positions.now()
            if not ctx.execute_async_v3(self.stream.handle):
                raise CudaError(f"TensorRT could not run {self.entry.file} (see its log above)")
            self.rings.write_frames(new_rows, count, positions, self.stream, active)
            for name, pinned in self._pinned_out.items():
                copy_to_host(pinned.array, self._dev_out[name].ptr, self.stream, pinned.ptr)
            self.stream.synchronize()  # the pageable sources and the temporaries outlive it
        finally:
            for buf in temps:
                buf.close()

    def _call(self, active: list[int] | None) -> None:
        self._check_open(self.context)
        self.enqueue(active=active)
        self.stream.synchronize()

    def close(self) -> None:
        super().close()
        self.context = self._frames_context = None
