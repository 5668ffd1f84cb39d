"""A simulated GPU for testing the GPU backends' host logic on a CPU: a stand-in for cuda-python's
runtime module and for TensorRT whose engines are onnxruntime CPU sessions.

"Device" memory is ordinary host memory (so device and pinned pointers are real addresses and
every copy is a memmove); work queued on a stream runs at once, in order, which is what one
stream guarantees anyway. Stream capture records the queued work instead of running it, and a
graph launch replays the record - the same addresses, host arrays read at replay time - which
is what a CUDA graph does. What this cannot check is CUDA and TensorRT themselves; it checks
everything our code asks of them: buffer sizes, addresses, copy geometry, ping-pong, ring
positions, linking, capture and replay.
"""

from __future__ import annotations

import ctypes
import types
from pathlib import Path

import numpy as np

_DTYPES = {"FLOAT": np.float32, "HALF": np.float16, "INT64": np.int64, "INT32": np.int32,
           "BOOL": np.bool_}
_ORT_TO_TRT = {"tensor(float)": "FLOAT", "tensor(float16)": "HALF", "tensor(int64)": "INT64",
               "tensor(int32)": "INT32", "tensor(bool)": "BOOL"}


class _Enum:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return self.name

    def __eq__(self, other):
        return isinstance(other, _Enum) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


class _Stream:
    def __int__(self):
        return 7


class FakeCuda:
    """The subset of cuda.bindings.runtime the backends call."""

    cudaStreamNonBlocking = 1

    def __init__(self):
        self.cudaError_t = types.SimpleNamespace(cudaSuccess=0, cudaErrorInsufficientDriver=35,
                                                 cudaErrorNoDevice=100)
        self.cudaMemcpyKind = types.SimpleNamespace(
            cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2, cudaMemcpyDeviceToDevice=3)
        self.cudaStreamCaptureMode = types.SimpleNamespace(cudaStreamCaptureModeThreadLocal=1)
        self._memory: dict[int, np.ndarray] = {}
        self.recording: list | None = None
        self.launches = 0
        self.copies_2d = 0

    # queue: run now, or record while capturing
    def enqueue(self, fn) -> None:
        if self.recording is not None:
            self.recording.append(fn)
        else:
            fn()

    def _alloc(self, n):
        buf = np.full(max(int(n), 1), 0xCD, np.uint8)  # not zeros: uninitialised memory
        ptr = buf.ctypes.data
        self._memory[ptr] = buf
        return 0, ptr

    def cudaGetErrorString(self, err):
        return 0, b"simulated error"

    def cudaGetDeviceCount(self):
        return 0, 1

    def cudaGetDeviceProperties(self, index):
        return 0, types.SimpleNamespace(name=b"Simulated GPU", major=9, minor=0,
                                        totalGlobalMem=80 << 30)

    def cudaDriverGetVersion(self):
        return 0, 12040

    def cudaSetDevice(self, index):
        return (0,)

    cudaMalloc = cudaMallocHost = _alloc

    def cudaFree(self, ptr):
        self._memory.pop(ptr)
        return (0,)

    cudaFreeHost = cudaFree

    def cudaStreamCreateWithFlags(self, flags):
        return 0, _Stream()

    def cudaStreamSynchronize(self, stream):
        assert self.recording is None, "synchronize during capture is an error in CUDA"
        return (0,)

    def cudaStreamDestroy(self, stream):
        return (0,)

    def cudaMemcpyAsync(self, dst, src, n, kind, stream):
        self.enqueue(lambda: ctypes.memmove(dst, src, n))
        return (0,)

    def cudaMemcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        assert dpitch >= width and spitch >= width

        def run():
            for r in range(height):
                ctypes.memmove(dst + r * dpitch, src + r * spitch, width)
        self.copies_2d += 1
        self.enqueue(run)
        return (0,)

    def cudaMemsetAsync(self, ptr, value, n, stream):
        self.enqueue(lambda: ctypes.memset(ptr, value, n))
        return (0,)

    def cudaStreamBeginCapture(self, stream, mode):
        assert self.recording is None
        self.recording = []
        return (0,)

    def cudaStreamEndCapture(self, stream):
        graph, self.recording = self.recording, None
        return 0, graph

    def cudaGraphInstantiate(self, graph, flags):
        return 0, list(graph)

    def cudaGraphLaunch(self, graph, stream):
        self.launches += 1
        for fn in graph:
            fn()
        return (0,)

    def cudaGraphDestroy(self, graph):
        return (0,)

    cudaGraphExecDestroy = cudaGraphDestroy


def _view(ptr: int, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = (ctypes.c_byte * max(n, 1)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape))).reshape(shape)


class _Context:
    def __init__(self, engine):
        self.engine, self.addresses = engine, {}

    def set_tensor_address(self, name, ptr):
        if name not in self.engine.tensors:
            return False
        self.addresses[name] = int(ptr)
        return True

    def execute_async_v3(self, stream):
        tensors, sess = self.engine.tensors, self.engine.session
        bound = dict(self.addresses)  # the addresses at enqueue time, as TensorRT records them
        missing = set(tensors) - set(bound)
        if missing:
            return False

        def run():
            feeds = {n: _view(bound[n], shape, _DTYPES[dt]).copy()
                     for n, (mode, shape, dt) in tensors.items() if mode.name == "INPUT"}
            names = [n for n, (mode, _, _) in tensors.items() if mode.name == "OUTPUT"]
            for name, value in zip(names, sess.run(names, feeds)):
                _, shape, dt = tensors[name]
                np.copyto(_view(bound[name], shape, _DTYPES[dt]), value)
        self.engine.cuda.enqueue(run)
        return True


class _Engine:
    def __init__(self, onnx_path: Path, cuda: FakeCuda):
        import onnxruntime as ort

        self.cuda = cuda
        self.session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        self.tensors = {}
        for kind, values in (("INPUT", self.session.get_inputs()),
                             ("OUTPUT", self.session.get_outputs())):
            for v in values:
                self.tensors[v.name] = (_Enum(kind), tuple(v.shape), _ORT_TO_TRT[v.type])
        self.names = list(self.tensors)

    @property
    def num_io_tensors(self):
        return len(self.names)

    def get_tensor_name(self, i):
        return self.names[i]

    def get_tensor_mode(self, name):
        return self.tensors[name][0]

    def get_tensor_shape(self, name):
        return self.tensors[name][1]

    def get_tensor_dtype(self, name):
        return _Enum(self.tensors[name][2])

    def create_execution_context(self):
        return _Context(self)


def fake_tensorrt(cuda: FakeCuda, model_dir: Path) -> types.ModuleType:
    """A `tensorrt` module whose serialized engines are the name of the ONNX graph to run."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "0.0-simulated"
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level=2: None})
    trt.TensorIOMode = types.SimpleNamespace(INPUT=_Enum("INPUT"), OUTPUT=_Enum("OUTPUT"))

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, data: bytes):
            return _Engine(model_dir / data.decode(), cuda)

    trt.Runtime = Runtime
    return trt


def install(monkeypatch, model_dir: Path) -> FakeCuda:
    """Patches cuda-python and TensorRT for the backends; writes a simulated engine for every
    graph of `model_dir` and records it in the manifest (the backend named there is kept)."""
    import dataclasses
    import sys

    from personaplex_edge.manifest import load_model_dir, sha256_file, write_manifest
    from personaplex_edge.runtime import cuda_runtime
    from personaplex_edge.runtime.trt_engine import EngineSpec

    cuda = FakeCuda()
    monkeypatch.setattr(cuda_runtime, "cudart", lambda: cuda)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(cuda, model_dir))
    manifest = load_model_dir(model_dir)
    graphs = {}
    for name, entry in manifest.graphs.items():
        engine = model_dir / (Path(entry.file).stem + ".engine")
        engine.write_text(entry.file)
        spec = EngineSpec(engine.name, sha256_file(engine), "0.0-simulated", "9.0",
                          "Simulated GPU", manifest.precision)
        graphs[name] = dataclasses.replace(entry, engine=spec.to_dict())
    write_manifest(model_dir, dataclasses.replace(manifest, graphs=graphs))
    return cuda
