"""Stand-ins for TensorRT and for onnxruntime-gpu over REAL device memory: a GPU machine that
has neither can still run the GPU backends' host logic (TrtGraph, DeviceLinkedLM with its CUDA
graph, OrtCudaGraph) on real buffers, streams and copies, with every graph computed by
onnxruntime on the CPU - so the tokens must equal the CPU backend's exactly.

TensorRT (`tensorrt_module`): tests/fake_gpu.py's stand-in module (its engine table and
execution context, which hold to TensorRT's API), with an engine whose run is three steps
queued on the backend's stream:

    device -> pinned staging   the inputs at the addresses bound at enqueue (cudaMemcpyAsync)
    host function              onnxruntime CPU on the staging arrays (cuLaunchHostFunc)
    pinned staging -> device   the outputs to their bound addresses

Queued this way, a run is ordered on the stream exactly like an engine's kernels (the copies
before and after wait for it) and a CUDA graph can capture it: the capture holds the copies at
the addresses of its state parity and a host node that calls onnxruntime again at every
replay. A run that synchronised inside execute_async_v3 would be simpler but could never be
captured, and the captured frame is the product path (runtime/lm_frame.DeviceLinkedLM). Where
host functions cannot be launched (no libcuda to call), runs fall back to that synchronous
form, and the capture is then refused and reported as such.

onnxruntime (`cuda_sessions`): InferenceSession replaced, for sessions asked to run on
CUDAExecutionProvider, by one that records the IO binding's device pointers and runs
synchronously on the provider's user stream: wait for the stream, copy the bound inputs to
the host, run on the CPU, copy the outputs to their bound buffers - what onnxruntime-gpu does
between its own stream's copies and kernels.
"""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path

import numpy as np

from check_stages import ROOT

_TESTS = ROOT / "tests"


def _fake_gpu():
    import sys

    if str(_TESTS) not in sys.path:
        sys.path.insert(0, str(_TESTS))
    import fake_gpu

    return fake_gpu


class _StreamRef:
    """A stream given by its handle, where cuda_runtime's copies want a Stream."""

    def __init__(self, handle: int):
        self.raw = handle

    def synchronize(self) -> None:
        from personaplex_edge.runtime.backends.cuda_runtime import call

        call("cudaStreamSynchronize", self.raw)


# ---- host functions on a stream -----------------------------------------------------------------

_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DriverHostFunctions:
    """Python callables queued on a CUDA stream with the driver's cuLaunchHostFunc.

    Not cuda-python's cudaLaunchHostFunc: its wrapper frees its per-launch record after the
    first call, so a CUDA graph that captured it would read freed memory at the second replay.
    Here the callback is one ctypes trampoline kept for the process and userData a key into
    `_calls`; a callable stays registered as long as this object lives (captured graphs may
    replay it any time). A callback must not call CUDA; its exceptions are kept in `errors`
    (a host function cannot fail the stream)."""

    def __init__(self):
        self._lib = ctypes.CDLL("libcuda.so.1")
        self._launch = self._lib.cuLaunchHostFunc
        self._launch.argtypes = [ctypes.c_void_p, _HOST_FN, ctypes.c_void_p]
        self._launch.restype = ctypes.c_int
        self._trampoline = _HOST_FN(self._dispatch)
        self._calls: dict[int, object] = {}
        self._keys: dict[int, int] = {}
        self.errors: list[str] = []

    def _dispatch(self, key) -> None:
        try:
            self._calls[int(key)]()
        except BaseException as e:  # noqa: BLE001 - reported by the check, never raised here
            self.errors.append(f"{type(e).__name__}: {e}")

    def launch(self, stream: int, fn) -> None:
        key = self._keys.setdefault(id(fn), len(self._keys) + 1)
        self._calls[key] = fn
        err = self._launch(ctypes.c_void_p(stream), self._trampoline, ctypes.c_void_p(key))
        if err:
            from personaplex_edge.runtime.backends.cuda_runtime import CudaError

            raise CudaError(f"cuLaunchHostFunc failed: CUresult {err}")


class QueuedHostFunctions:
    """The same on tests/fake_gpu.py's simulated stream (work queued or captured there)."""

    def __init__(self, cuda):
        self.cuda, self.errors = cuda, []

    def launch(self, stream: int, fn) -> None:
        self.cuda.enqueue(fn)


def host_functions():
    """DriverHostFunctions, or None (with why) where libcuda cannot be called."""
    try:
        return DriverHostFunctions(), ""
    except (OSError, AttributeError) as e:
        return None, f"no cuLaunchHostFunc ({e}): runs synchronise, capture is refused"


# ---- TensorRT -------------------------------------------------------------------------------------

class _Plan:
    """One execution context's staging: a pinned array per tensor, and the host function."""

    def __init__(self, engine, shapes: dict[str, tuple]):
        from personaplex_edge.runtime.backends.cuda_runtime import PinnedArray

        fake_gpu = _fake_gpu()
        tensors = engine.tensors
        self.inputs = [n for n, (mode, _, _) in tensors.items() if mode.name == "INPUT"]
        self.outputs = [n for n, (mode, _, _) in tensors.items() if mode.name == "OUTPUT"]
        dtypes = {n: np.dtype(fake_gpu._DTYPES[dt]) for n, (_, _, dt) in tensors.items()}
        # output shapes from one run on zeros (dynamic dimensions follow the inputs)
        zeros = {n: np.zeros(shapes[n], dtypes[n]) for n in self.inputs}
        out_shapes = {n: v.shape for n, v in zip(self.outputs,
                                                 engine.session.run(self.outputs, zeros))}
        self.staging = {n: PinnedArray(shapes[n] if n in shapes else out_shapes[n], dtypes[n])
                        for n in self.inputs + self.outputs}
        self.session = engine.session

    def run(self) -> None:
        """The host function: the graph on the staged inputs, into the staged outputs."""
        feeds = {n: self.staging[n].array for n in self.inputs}
        for name, value in zip(self.outputs, self.session.run(self.outputs, feeds)):
            np.copyto(self.staging[name].array, value)


def _engine_class():
    fake_gpu = _fake_gpu()

    class DeviceEngine(fake_gpu._Engine):
        """An onnxruntime CPU session run over real device memory (module docstring)."""

        host: object = None  # DriverHostFunctions / QueuedHostFunctions, or None: synchronous
        threads: int = 1

        def open_session(self, onnx_path: Path):
            from personaplex_edge.runtime.backends.ort import session_options
            import onnxruntime as ort

            return ort.InferenceSession(str(onnx_path), session_options(self.threads),
                                        providers=["CPUExecutionProvider"])

        def launch(self, context, bound, shapes, stream):
            from personaplex_edge.runtime.backends.cuda_runtime import (copy_to_device,
                                                                        copy_to_host)

            plan = getattr(context, "standin_plan", None)
            if plan is None:  # the first run is always eager (CapturedSequence warms up)
                plan = context.standin_plan = _Plan(self, shapes)
            s = _StreamRef(stream)
            for n in plan.inputs:
                p = plan.staging[n]
                copy_to_host(p.array, bound[n], s, p.ptr)
            if self.host is not None:
                self.host.launch(stream, plan.run)
            else:
                s.synchronize()  # refused inside a capture: the capture then fails
                plan.run()
            for n in plan.outputs:
                p = plan.staging[n]
                copy_to_device(bound[n], p.array, s, p.ptr)
            if self.host is None:
                s.synchronize()

    return DeviceEngine


def tensorrt_module(model_dir: Path, host, threads: int = 1):
    """A `tensorrt` module whose engines run the model directory's ONNX graphs on the CPU over
    the device buffers the backend binds (`host`: how host functions are queued, or None)."""
    engine = type("DeviceEngine", (_engine_class(),), {"host": host, "threads": threads})
    return _fake_gpu().tensorrt_runtime(Path(model_dir), lambda path: engine(path, None))


def record_engines(model_dir: Path) -> None:
    """Stand-in engines for every graph of `model_dir`, recorded as built on this GPU (so that
    TrtEngine's compatibility check passes), backend tensorrt."""
    import dataclasses

    from personaplex_edge.manifest import load_model_dir, write_manifest
    from personaplex_edge.runtime.backends.cuda_runtime import device_info

    info = device_info(0)
    _fake_gpu().record_engines(model_dir, info.name, info.compute_capability,
                               info.total_memory)
    write_manifest(model_dir, dataclasses.replace(load_model_dir(model_dir),
                                                  backend="tensorrt"))


@contextlib.contextmanager
def tensorrt_installed(model_dir: Path, host, threads: int = 1):
    """`import tensorrt` gives the stand-in while inside."""
    import sys

    saved = sys.modules.get("tensorrt")
    sys.modules["tensorrt"] = tensorrt_module(model_dir, host, threads)
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop("tensorrt", None)
        else:
            sys.modules["tensorrt"] = saved


# ---- onnxruntime-gpu ------------------------------------------------------------------------------

class _Binding:
    """An IO binding that keeps what OrtCudaGraph binds: name -> (dtype, shape, device ptr)."""

    def __init__(self):
        self.inputs: dict[str, tuple] = {}
        self.outputs: dict[str, tuple] = {}

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        self._check(name, device_type, buffer_ptr)
        self.inputs[name] = (np.dtype(element_type), tuple(shape), int(buffer_ptr))

    def bind_output(self, name, device_type="cuda", device_id=0, element_type=None, shape=None,
                    buffer_ptr=None):
        self._check(name, device_type, buffer_ptr)
        self.outputs[name] = (np.dtype(element_type), tuple(shape), int(buffer_ptr))

    @staticmethod
    def _check(name, device_type, ptr):
        if device_type != "cuda" or not ptr:
            raise ValueError(f"{name}: bound to {device_type} at {ptr}; OrtCudaGraph binds "
                             "device buffers only")


RUNS = {"eager": 0, "graph": 0}  # the stand-in sessions' runs: eager, or as a CUDA graph


def _graph_id(run_options) -> str:
    """The captured graph a run asks onnxruntime to replay ("": none)."""
    try:
        return run_options.get_run_config_entry("gpu_graph_id") if run_options else ""
    except RuntimeError:  # the key is not set
        return ""


class _CudaSession:
    """What OrtCudaModelGraph sees of a CUDA session (module docstring)."""

    def __init__(self, real, path, sess_options, providers, threads: int):
        from personaplex_edge.runtime.backends.ort import session_options

        options = dict(next(p[1] for p in providers if isinstance(p, tuple)
                            and p[0] == "CUDAExecutionProvider"))
        self.stream = int(options["user_compute_stream"])
        self.cuda_graph = options.get("enable_cuda_graph") == "1"
        self._session = real(str(path), session_options(threads),
                             providers=["CPUExecutionProvider"])
        self.runs = 0

    def get_providers(self):
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def get_inputs(self):
        return self._session.get_inputs()

    def get_outputs(self):
        return self._session.get_outputs()

    def io_binding(self):
        return _Binding()

    def run_with_iobinding(self, binding: _Binding, run_options=None) -> None:
        from personaplex_edge.runtime.backends.cuda_runtime import copy_to_device, copy_to_host

        s = _StreamRef(self.stream)
        s.synchronize()  # the inputs were copied to the device on this stream
        feeds = {}
        for name, (dtype, shape, ptr) in binding.inputs.items():
            feeds[name] = np.empty(shape, dtype)
            copy_to_host(feeds[name], ptr, s)
        s.synchronize()
        names = list(binding.outputs)
        for name, value in zip(names, self._session.run(names, feeds)):
            dtype, shape, ptr = binding.outputs[name]
            if value.shape != shape or value.dtype != dtype:
                raise ValueError(f"{name}: bound as {dtype} {list(shape)}, the graph gives "
                                 f"{value.dtype} {list(value.shape)}")
            copy_to_device(ptr, np.ascontiguousarray(value), s)
        s.synchronize()  # before `value` goes; onnxruntime too returns after its stream
        self.runs += 1
        # what onnxruntime would have done: replayed a captured graph, or run eagerly
        RUNS["graph" if self.cuda_graph and _graph_id(run_options) else "eager"] += 1


@contextlib.contextmanager
def cuda_sessions(threads: int = 1):
    """onnxruntime.InferenceSession, while inside, gives the stand-in for sessions on
    CUDAExecutionProvider and a real session otherwise."""
    import onnxruntime as ort

    real = ort.InferenceSession

    def session(path, sess_options=None, providers=None, **kwargs):
        names = [p[0] if isinstance(p, tuple) else p for p in providers or []]
        if "CUDAExecutionProvider" in names:
            return _CudaSession(real, path, sess_options, providers, threads)
        return real(path, sess_options, providers=providers, **kwargs)

    ort.InferenceSession = session
    try:
        yield
    finally:
        ort.InferenceSession = real
