"""A simulated GPU for testing the GPU backends' host logic on a CPU: a stand-in for cuda-python's
runtime module and for TensorRT (mainline, or TensorRT for RTX) whose engines are onnxruntime CPU
sessions.

"Device" memory is ordinary host memory (so device and pinned pointers are real addresses and
every copy is a memmove); work queued on a stream runs at once, in order, which is what one
stream guarantees anyway. Stream capture records the queued work instead of running it, and a
graph launch replays the record - the same addresses, host arrays read at replay time - which
is what a CUDA graph does. What this cannot check is CUDA and TensorRT themselves; it checks
everything our code asks of them: buffer sizes, addresses, copy geometry, ping-pong, ring
positions, linking, capture and replay.

The calls take the arguments and give the returns of the real APIs (cuda-python 12/13:
`(error, *values)` tuples; TensorRT 10/11 Python bindings), and hold to their documented
demands where a real GPU would only fail at random: cudaMalloc's 256-byte alignment, and
TensorRT's refusal of tensor addresses that are not 256-byte aligned. The builder side
(Builder, OnnxParser, builder config, timing cache) is simulated too: its "plan" names the
ONNX graph that the simulated runtime then runs.

TensorRT for RTX (`fake_tensorrt(..., rtx=True)`, module `tensorrt_rtx`) adds what its runtime
asks: build targets (ComputeCapability) and no timing cache; get_engine_validity on the
engine's header, which names the targets and version it was built for; execution contexts made
from a runtime config, whose JIT is counted (`trt.jit_compiles`) unless the runtime cache holds
the engine's kernels already.
"""

from __future__ import annotations

import ctypes
import types
from pathlib import Path

import numpy as np

SIMULATED_TRT_VERSION = "10.999.0.simulated"  # parses like a real one: major 10
SIMULATED_RTX_VERSION = "1.7.999.simulated"
RTX_HEADER = 256  # the simulated engine_header_size: the plan's first two lines fit in it
WEIGHTLESS = b"weightless\n"  # a line of a simulated plan built with STRIP_PLAN
ALIGN = 256  # cudaMalloc's alignment, and what setTensorAddress demands

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

    def __init__(self, name: str = "Simulated GPU", memory: int = 80 << 30,
                 compute_capability: str = "9.0"):
        self.name, self.memory = name, memory
        self.compute_capability = compute_capability
        self.cudaError_t = types.SimpleNamespace(cudaSuccess=0, cudaErrorInsufficientDriver=35,
                                                 cudaErrorNoDevice=100)
        self.cudaMemcpyKind = types.SimpleNamespace(
            cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2, cudaMemcpyDeviceToDevice=3)
        self.cudaStreamCaptureMode = types.SimpleNamespace(cudaStreamCaptureModeThreadLocal=1)
        self._memory: dict[int, np.ndarray] = {}
        self._pinned: set[int] = set()  # host allocations among _memory
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
        # not zeros: uninitialised memory; aligned as cudaMalloc's (numpy gives only 16/64)
        buf = np.full(max(int(n), 1) + ALIGN, 0xCD, np.uint8)
        ptr = -(-buf.ctypes.data // ALIGN) * ALIGN
        self._memory[ptr] = buf
        return 0, ptr

    def cudaGetErrorString(self, err):
        return 0, b"simulated error"

    def cudaGetDeviceCount(self):
        return 0, 1

    def cudaGetDeviceProperties(self, index):
        major, minor = (int(x) for x in self.compute_capability.split("."))
        return 0, types.SimpleNamespace(name=self.name.encode(), major=major, minor=minor,
                                        totalGlobalMem=self.memory)

    def cudaDriverGetVersion(self):
        return 0, 12040

    def cudaSetDevice(self, index):
        return (0,)

    cudaMalloc = _alloc

    def cudaMallocHost(self, n):
        err, ptr = self._alloc(n)
        self._pinned.add(ptr)
        return err, ptr

    def cudaFree(self, ptr):
        self._memory.pop(ptr)
        self._pinned.discard(ptr)
        return (0,)

    cudaFreeHost = cudaFree

    def cudaMemGetInfo(self):
        used = sum(b.size for p, b in self._memory.items() if p not in self._pinned)
        return 0, self.memory - used, self.memory

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

    def cudaGraphInstantiate(self, graph, flags):  # CUDA 12 form; 11 took a log size
        return 0, list(graph)

    def cudaGraphInstantiateWithFlags(self, graph, flags):
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
        # a dynamic dimension (-1) must be fixed with set_input_shape before a run, as in
        # TensorRT; outputs take the shapes the run gives them
        self.shapes = {n: shape for n, (mode, shape, _) in engine.tensors.items()
                       if mode.name == "INPUT"}

    def set_input_shape(self, name, shape):
        self.engine.shapes_set.append(name)
        want = self.engine.tensors[name][1]
        if len(shape) != len(want) or any(w not in (-1, d) for w, d in zip(want, shape)):
            return False
        self.shapes[name] = tuple(int(d) for d in shape)
        return True

    def set_tensor_address(self, name, ptr):
        if not isinstance(ptr, int):  # the binding takes a size_t
            raise TypeError(f"set_tensor_address(): memory must be an int, got {type(ptr)}")
        if name not in self.engine.tensors or ptr % ALIGN:
            return False
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream):
        if not isinstance(stream, int):  # the binding takes the stream's address (size_t)
            raise TypeError(f"execute_async_v3(): stream_handle must be an int, got "
                            f"{type(stream)}")
        bound = dict(self.addresses)  # the addresses at enqueue time, as TensorRT records them
        missing = set(self.engine.tensors) - set(bound)
        shapes = dict(self.shapes)
        if missing or any(-1 in shape for shape in shapes.values()) or self.engine.needs_refit:
            return False
        self.engine.launch(self, bound, shapes, stream)
        return True


class _Engine:
    """An engine that is an onnxruntime CPU session; `launch` queues one run of it on the
    simulated stream (a subclass over real device memory replaces launch)."""

    needs_refit = False  # a weightless engine's, until refit

    def __init__(self, onnx_path: Path, cuda: FakeCuda | None):
        self.cuda = cuda
        self.shapes_set: list[str] = []  # every set_input_shape, by input name
        self.contexts = []  # every execution context made, with its runtime config (or None)
        self.session = self.open_session(onnx_path)
        self.tensors = {}
        for kind, values in (("INPUT", self.session.get_inputs()),
                             ("OUTPUT", self.session.get_outputs())):
            for v in values:
                shape = tuple(d if isinstance(d, int) else -1 for d in v.shape)  # dynamic: -1
                self.tensors[v.name] = (_Enum(kind), shape, _ORT_TO_TRT[v.type])
        self.names = list(self.tensors)

    def open_session(self, onnx_path: Path):
        import onnxruntime as ort

        return ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])

    def launch(self, context, bound: dict, shapes: dict, stream: int) -> None:
        """Queues one run: inputs read from and outputs written to the `bound` addresses."""
        tensors, sess = self.tensors, self.session

        def run():
            feeds = {n: _view(bound[n], shapes[n], _DTYPES[dt]).copy()
                     for n, (mode, _, dt) in tensors.items() if mode.name == "INPUT"}
            names = [n for n, (mode, _, _) in tensors.items() if mode.name == "OUTPUT"]
            for name, value in zip(names, sess.run(names, feeds)):
                _, _, dt = tensors[name]
                np.copyto(_view(bound[name], value.shape, _DTYPES[dt]), value)
        self.cuda.enqueue(run)

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

    def get_tensor_location(self, name):
        return _Enum("DEVICE")

    def create_execution_context(self, runtime_config=None):
        self.contexts.append(runtime_config)
        if runtime_config is not None:
            runtime_config.jit(self)
        return _Context(self)


class _IntEnum(_Enum):
    """A member of a TensorRT enum whose value goes into a bit mask (int() works on it)."""

    def __init__(self, name: str, value: int):
        super().__init__(name)
        self.value = value

    def __int__(self):
        return self.value


class _TimingCache:
    MAGIC = b"simulated timing cache of "

    def __init__(self, device: str):
        self.device = device

    def serialize(self):
        return memoryview(self.MAGIC + self.device.encode())  # IHostMemory is a buffer


class _BuilderConfig:
    def __init__(self, trt, device: str):
        self._trt, self._device = trt, device
        self.flags = {trt.BuilderFlag.TF32}  # on by default, as in TensorRT
        self.pools: dict = {}
        self.timing_cache: _TimingCache | None = None
        self.targets: list = []  # TensorRT for RTX: the ComputeCapability of each index

    @property
    def num_compute_capabilities(self):
        return len(self.targets)

    @num_compute_capabilities.setter
    def num_compute_capabilities(self, n):
        assert self._trt.__name__ == "tensorrt_rtx", "compute capabilities are TensorRT for RTX's"
        self.targets = [None] * n

    def set_compute_capability(self, cc, index):
        assert cc in vars(self._trt.ComputeCapability).values(), cc
        self.targets[index] = cc

    def set_memory_pool_limit(self, pool, pool_size):
        assert pool in vars(self._trt.MemoryPoolType).values() and isinstance(pool_size, int)
        self.pools[pool] = pool_size

    def set_flag(self, flag):
        if flag not in vars(self._trt.BuilderFlag).values():
            raise TypeError(f"not a BuilderFlag: {flag!r}")
        self.flags.add(flag)

    def clear_flag(self, flag):
        if flag not in vars(self._trt.BuilderFlag).values():
            raise TypeError(f"not a BuilderFlag: {flag!r}")
        self.flags.discard(flag)

    def create_timing_cache(self, serialized_timing_cache):
        # TensorRT for RTX: a timing cache does nothing and asks for a GPU; never used there
        assert self._trt.__name__ != "tensorrt_rtx", "a timing cache with TensorRT for RTX"
        data = bytes(memoryview(serialized_timing_cache))
        if not data:
            return _TimingCache(self._device)
        if not data.startswith(_TimingCache.MAGIC):
            return None  # unreadable: TensorRT logs an error and returns no cache
        return _TimingCache(data[len(_TimingCache.MAGIC):].decode())

    def set_timing_cache(self, cache, ignore_mismatch):
        if not isinstance(cache, _TimingCache) or not isinstance(ignore_mismatch, bool):
            raise TypeError("set_timing_cache(cache: ITimingCache, ignore_mismatch: bool)")
        if cache.device != self._device and not ignore_mismatch:
            return False  # recorded on another device
        self.timing_cache = cache
        return True

    def get_timing_cache(self):
        return self.timing_cache

    def add_optimization_profile(self, profile):
        self.profiles = getattr(self, "profiles", []) + [profile]
        return len(self.profiles) - 1


class _Profile:
    """An optimization profile: (min, opt, max) per input with a dynamic dimension."""

    def __init__(self):
        self.shapes: dict = {}

    def set_shape(self, name, min, opt, max):
        for shape in (min, opt, max):
            if not all(isinstance(d, int) and d > 0 for d in shape):
                raise TypeError(f"set_shape({name}): every dimension must be a positive int")
        if not all(a <= b <= c for a, b, c in zip(min, opt, max)):
            raise ValueError(f"set_shape({name}): min <= opt <= max")
        self.shapes[name] = (tuple(min), tuple(opt), tuple(max))


class _Input:
    def __init__(self, name, shape):
        self.name, self.shape = name, shape
        self.is_shape_tensor = False  # the tests' graphs feed no shape computation


class _Network:
    def __init__(self, flags: int):
        self.flags = flags
        self.onnx_path: str | None = None
        self.inputs: list[_Input] = []

    @property
    def num_inputs(self):
        return len(self.inputs)

    def get_input(self, index):
        return self.inputs[index]


def _builder_api(trt, cuda: FakeCuda) -> None:
    """TensorRT's build API on `trt`: a network is strongly typed or not, the builder config
    has TensorRT's flags and pools, and the plan is the parsed graph's file name (the engine
    sits beside its graph), then a newline and `trt.plan_padding(graph name)` zero bytes - a
    test sets that to give engines the size of kept or folded weights. A graph whose file name
    is in `trt.fail_builds` fails to build (the plan is None, as TensorRT returns)."""
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(
        EXPLICIT_BATCH=_IntEnum("EXPLICIT_BATCH", 0), STRONGLY_TYPED=_IntEnum("STRONGLY_TYPED", 1))
    trt.BuilderFlag = types.SimpleNamespace(**{n: _IntEnum(n, i) for i, n in enumerate(
        ("FP16", "BF16", "INT8", "FP8", "INT4", "TF32", "REFIT", "REFIT_IDENTICAL",
         "STRIP_PLAN"))})
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE=_IntEnum("WORKSPACE", 0))
    device = cuda.cudaGetDeviceProperties(0)[1].name.decode()
    trt.builds = []  # (network, config) of each build, for the tests to inspect
    trt.fail_builds = set()
    trt.plan_padding = lambda graph: 0

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags=0):
            if not isinstance(flags, int):
                raise TypeError("create_network(flags: int)")
            return _Network(flags)

        def create_builder_config(self):
            return _BuilderConfig(trt, device)

        def create_optimization_profile(self):
            return _Profile()

        def build_serialized_network(self, network, config):
            trt.builds.append((network, config))
            if network.onnx_path is None:
                return None
            profiled = {n for p in getattr(config, "profiles", []) for n in p.shapes}
            if any(-1 in i.shape and i.name not in profiled for i in network.inputs):
                return None  # TensorRT: a dynamic input needs an optimization profile
            graph = Path(network.onnx_path).name
            if graph in trt.fail_builds:
                return None
            header = graph.encode() + b"\n"
            if trt.__name__ == "tensorrt_rtx":
                assert None not in config.targets and config.targets, "no build targets"
                header += rtx_header(trt.__version__, [c.name for c in config.targets])
            if trt.BuilderFlag.STRIP_PLAN in config.flags:
                refit = "REFIT" if trt.__name__ == "tensorrt_rtx" else "REFIT_IDENTICAL"
                assert getattr(trt.BuilderFlag, refit) in config.flags, "STRIP_PLAN alone"
                header += WEIGHTLESS
            return memoryview(header + bytes(trt.plan_padding(graph)))

    class OnnxParser:
        def __init__(self, network, logger):
            self.network, self.errors = network, []

        def parse_from_file(self, model):
            if not Path(model).is_file():
                self.errors.append(f"cannot open {model}")
                return False
            import onnx

            self.network.onnx_path = str(model)
            graph = onnx.load(str(model), load_external_data=False).graph
            inits = {i.name for i in graph.initializer}
            self.network.inputs = [
                _Input(v.name, tuple(d.dim_value if d.HasField("dim_value") else -1
                                     for d in v.type.tensor_type.shape.dim))
                for v in graph.input if v.name not in inits]
            return True

        @property
        def num_errors(self):
            return len(self.errors)

        def get_error(self, index):
            return self.errors[index]

    trt.Builder, trt.OnnxParser = Builder, OnnxParser


def rtx_header(version: str, targets: list[str]) -> bytes:
    """The simulated TensorRT for RTX engine's second line: what get_engine_validity reads."""
    return f"rtx {version} {','.join(targets)}\n".encode()


def fake_tensorrt(cuda: FakeCuda, model_dir: Path, rtx: bool = False) -> types.ModuleType:
    """A `tensorrt` module (`tensorrt_rtx` with rtx=True) whose serialized engines name the ONNX
    graph to run, relative to `model_dir` (up to a newline: the simulated builder pads its plans
    after one)."""
    trt = tensorrt_runtime(model_dir, lambda path: _Engine(path, cuda), rtx, cuda)
    _builder_api(trt, cuda)
    return trt


class _RuntimeCache:
    """TensorRT for RTX's runtime cache: the engines whose kernels it holds."""

    MAGIC = b"simulated runtime cache:"

    def __init__(self):
        self.engines: set[str] = set()

    def serialize(self):
        return memoryview(self.MAGIC + ",".join(sorted(self.engines)).encode())

    def deserialize(self, data):
        data = bytes(memoryview(data))
        if not data.startswith(self.MAGIC):
            raise RuntimeError("not a runtime cache")
        self.engines = {e for e in data[len(self.MAGIC):].decode().split(",") if e}
        return True


def _rtx_runtime_api(trt, cuda: FakeCuda | None) -> None:
    """TensorRT for RTX's runtime calls on `trt` (module docstring)."""
    trt.ComputeCapability = types.SimpleNamespace(**{
        n: _Enum(n) for n in ("NONE", "CURRENT", "SM75", "SM80", "SM86", "SM89", "SM120",
                              "SM121")})
    trt.EngineValidity = types.SimpleNamespace(VALID=_Enum("VALID"),
                                               SUBOPTIMAL=_Enum("SUBOPTIMAL"),
                                               INVALID=_Enum("INVALID"))
    trt.EngineInvalidityDiagnostics = types.SimpleNamespace(**{
        n: _IntEnum(n, 1 << i) for i, n in enumerate(
            ("VERSION_MISMATCH", "UNSUPPORTED_CC", "OLD_CUDA_DRIVER", "OLD_CUDA_RUNTIME",
             "INSUFFICIENT_GPU_MEMORY", "MALFORMED_ENGINE", "CUDA_ERROR"))})
    trt.CudaGraphStrategy = types.SimpleNamespace(DISABLED=_Enum("DISABLED"),
                                                  WHOLE_GRAPH_CAPTURE=_Enum("WHOLE_GRAPH_CAPTURE"))
    trt.DynamicShapesKernelSpecializationStrategy = types.SimpleNamespace(
        LAZY=_Enum("LAZY"), EAGER=_Enum("EAGER"), NONE=_Enum("NONE"))
    trt.validity_checks = []  # the header of each get_engine_validity call
    trt.jit_compiles = []  # the engine (graph file) of each compilation the cache did not hold

    def get_engine_validity(self, buffer):
        header = bytes(memoryview(buffer))
        trt.validity_checks.append(header)
        flags = trt.EngineInvalidityDiagnostics
        lines = header.split(b"\n")
        if len(header) > RTX_HEADER or len(lines) < 3 or not lines[1].startswith(b"rtx "):
            return trt.EngineValidity.INVALID, int(flags.MALFORMED_ENGINE)
        _, version, targets = lines[1].decode().split(" ")
        here = "SM" + cuda.compute_capability.replace(".", "")
        bad = 0
        if version != trt.__version__:
            bad |= int(flags.VERSION_MISMATCH)
        if here not in targets.split(","):
            bad |= int(flags.UNSUPPORTED_CC)
        return (trt.EngineValidity.INVALID if bad else trt.EngineValidity.VALID), bad

    trt.Runtime.engine_header_size = RTX_HEADER
    trt.Runtime.get_engine_validity = get_engine_validity

    class RuntimeConfig:
        def __init__(self):
            self.cuda_graph_strategy = trt.CudaGraphStrategy.DISABLED
            self.dynamic_shapes_kernel_specialization_strategy = (
                trt.DynamicShapesKernelSpecializationStrategy.LAZY)
            self.cache = None

        def create_runtime_cache(self):
            return _RuntimeCache()

        def set_runtime_cache(self, cache):
            assert isinstance(cache, _RuntimeCache)
            self.cache = cache
            return True

        def jit(self, engine):
            key = Path(engine.path).name
            if self.cache is None or key not in self.cache.engines:
                trt.jit_compiles.append(key)
            if self.cache is not None:
                self.cache.engines.add(key)

    trt.RuntimeConfig = RuntimeConfig


def tensorrt_runtime(model_dir: Path, open_engine, rtx: bool = False,
                     cuda: FakeCuda | None = None) -> types.ModuleType:
    """The runtime half of a stand-in `tensorrt` module (no builder): deserialising a plan
    opens `open_engine(model_dir / the graph file it names)`; with rtx=True the module is
    `tensorrt_rtx`, with TensorRT for RTX's runtime calls (for `cuda`'s GPU)."""
    trt = types.ModuleType("tensorrt_rtx" if rtx else "tensorrt")
    trt.__version__ = SIMULATED_RTX_VERSION if rtx else SIMULATED_TRT_VERSION
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level=2: None})
    trt.ILogger = type("ILogger", (), {"__init__": lambda self: None, "Severity": types.
                                       SimpleNamespace(ERROR=_Enum("ERROR"),
                                                       WARNING=_Enum("WARNING"))})
    trt.TensorIOMode = types.SimpleNamespace(INPUT=_Enum("INPUT"), OUTPUT=_Enum("OUTPUT"))
    trt.TensorLocation = types.SimpleNamespace(DEVICE=_Enum("DEVICE"), HOST=_Enum("HOST"))

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, serialized_engine):
            name = bytes(memoryview(serialized_engine)).split(b"\n", 1)[0].decode()
            trt.deserialized.append(name)
            engine = open_engine(model_dir / name)
            engine.path = name
            engine.needs_refit = WEIGHTLESS in bytes(memoryview(serialized_engine))
            if rtx:
                engine.create_runtime_config = trt.RuntimeConfig
            return engine

    class Refitter:
        def __init__(self, engine, logger):
            self.engine, self.weights_from = engine, None

        def refit_cuda_engine(self):
            if self.weights_from != self.engine.path:
                return False
            trt.refits.append(self.weights_from)
            self.engine.needs_refit = False
            return True

    class OnnxParserRefitter:
        def __init__(self, refitter, logger):
            self.refitter = refitter

        def refit_from_file(self, model):
            if not Path(model).is_file():
                return False
            self.refitter.weights_from = Path(model).name
            return True

    trt.Runtime, trt.Refitter, trt.OnnxParserRefitter = Runtime, Refitter, OnnxParserRefitter
    trt.refits = []  # the graph each weightless engine was refit from
    trt.deserialized = []  # the graph of every engine deserialised
    if rtx:
        _rtx_runtime_api(trt, cuda)
    return trt


RTX_LIBRARY = "tensorrt-rtx"
RTX_GPU = ("Simulated RTX 4090", 24 << 30, "8.9")  # FakeCuda(*RTX_GPU): a GPU it runs on


def patch(monkeypatch, model_dir: Path, cuda: FakeCuda | None = None,
          library: str = "tensorrt") -> FakeCuda:
    """Patches cuda-python and one TensorRT for the backends - mainline (the other not
    installed), or TensorRT for RTX with library="tensorrt-rtx" (mainline then not installed)
    - on `cuda`'s GPU (default: a "Simulated GPU" of 80 GiB, compute capability 9.0; for
    TensorRT for RTX a simulated RTX 4090, 8.9), whose engines run the graphs of `model_dir`."""
    import sys

    from personaplex_edge.runtime.backends import cuda_runtime

    rtx = library == RTX_LIBRARY
    cuda = cuda or (FakeCuda(*RTX_GPU) if rtx else FakeCuda())
    monkeypatch.setattr(cuda_runtime, "cudart", lambda: cuda)
    trt = fake_tensorrt(cuda, model_dir, rtx)
    monkeypatch.setitem(sys.modules, "tensorrt_rtx" if rtx else "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "tensorrt" if rtx else "tensorrt_rtx", None)
    return cuda


def install(monkeypatch, model_dir: Path, cuda: FakeCuda | None = None,
            library: str = "tensorrt") -> FakeCuda:
    """`patch`, and a simulated engine written for every graph of `model_dir` and recorded in
    its manifest (the backend named there is kept): built on that GPU (mainline), or for the
    default RTX targets (TensorRT for RTX)."""
    cuda = patch(monkeypatch, model_dir, cuda, library)
    if library == RTX_LIBRARY:
        record_engines(model_dir, "", "", 0, SIMULATED_RTX_VERSION, RTX_LIBRARY,
                       ("8.6", "8.9", "12.0"))
    else:
        record_engines(model_dir, cuda.name, cuda.compute_capability, cuda.memory)
    return cuda


def record_engines(model_dir: Path, device_name: str, compute_capability: str,
                   memory: int, tensorrt_version: str = SIMULATED_TRT_VERSION,
                   library: str = "tensorrt", targets: tuple[str, ...] = ()) -> None:
    """Writes a stand-in engine for every graph of `model_dir` (its plan: the graph's file
    name; for TensorRT for RTX, then its header line of version and targets) and records it in
    the manifest as built on that GPU or for those targets (the backend named there is
    kept)."""
    import dataclasses

    from personaplex_edge.contract import EngineSpec
    from personaplex_edge.manifest import load_model_dir, sha256_file, write_manifest

    manifest = load_model_dir(model_dir)
    graphs = {}
    for name, entry in manifest.graphs.items():
        engine = model_dir / (Path(entry.file).stem + ".engine")
        plan = entry.file.encode() + b"\n"
        if library == RTX_LIBRARY:
            plan += rtx_header(tensorrt_version, ["SM" + cc.replace(".", "") for cc in targets])
        engine.write_bytes(plan)
        spec = EngineSpec(engine.name, sha256_file(engine), tensorrt_version,
                          compute_capability, device_name, manifest.precision,
                          device_memory=memory, library=library, targets=targets)
        graphs[name] = dataclasses.replace(entry, engine=spec.to_dict())
    write_manifest(model_dir, dataclasses.replace(manifest, graphs=graphs))


def export_tiny(root: Path) -> Path:
    """The built-in tiny model (random weights) exported in float32 to root/fp32 (its checkpoint
    in root/ckpt): what the simulated-GPU tests run."""
    from personaplex_edge.config import preset
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    ckpt = write_synthetic_checkpoint(preset("tiny"), root / "ckpt")
    export_model(resolve_checkpoint(str(ckpt)), root / "fp32", progress=lambda s: None)
    return root / "fp32"


def simulated_copy(model_dir: Path, dst: Path, monkeypatch,
                   library: str = "tensorrt") -> tuple[Path, FakeCuda]:
    """A copy of `model_dir` at `dst` with simulated engines of `library`, cuda-python and
    TensorRT patched."""
    import shutil

    shutil.copytree(model_dir, dst)
    return dst, install(monkeypatch, dst, library=library)
