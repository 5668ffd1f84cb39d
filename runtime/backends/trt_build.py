"""TensorRT engines from a model directory's ONNX graphs: with mainline TensorRT for the GPU of
this machine, or with TensorRT for RTX for a set of GPU generations on any machine, a GPU or none.

Engine building is device-side work: it runs where the engines will run (a Jetson, a data-centre
GPU) or, with TensorRT for RTX, anywhere (a CI runner, the machine that publishes a model), where
torch is not installed, so it lives in the runtime and needs only TensorRT, cuda-python and onnx
(the `rtx`, `trt-cu12` / `trt-cu13` and `jetson` extras). What differs between the two libraries
is trt_library.py. The export calls `build_engines` on its staging directory when it is handed
it; `personaplex-edge engines --model DIR` calls `rebuild_engines`, which builds in a staging
copy of DIR (hard links, so the weights are not copied) and swaps it in only when every engine
is built: a failure part-way leaves the old engines and manifest as they were. A model directory
the runtime may not write (a hub snapshot, a read-only copy: user_cache.writable_dir) has its
engines built into the per-user cache instead (engine_cache.py), by that command or on first use
(`engines_for_this_gpu`). The graphs built are the manifest's, whatever they are.

The graphs already carry their precision (export/precision.py, backend "tensorrt"): fp16/bf16
islands, and weight-only int8/int4/fp8 as DequantizeLinear on the weights. The network is built
strongly typed - TensorRT takes every tensor's type from the graph instead of choosing per layer
- which is what TensorRT 10 recommends for such graphs and the only mode TensorRT 11 and TensorRT
for RTX have. float32 graphs are built with TF32 off, so that a float32 engine can be checked
token for token against onnxruntime on the CPU. No input may feed a shape computation (TensorRT
would make it a shape tensor: each new value a new shape, new kernels and a new CUDA graph, e.g.
a top-k fed to TopK's K); a graph that has one is refused, naming it.

Each engine is recorded with what it was built by and for (contract.EngineSpec: the library and
its version; mainline, the GPU's compute capability, name and memory size; TensorRT for RTX, its
targets) and the weight bytes its graph holds; after each build the engine's size is compared
with those bytes, which tells whether TensorRT kept quantised weights quantised or folded them
back to float16. Mainline TensorRT's builds are slow (tactic timing), so a timing cache is kept
per GPU type and TensorRT version and reused by later builds. A failed parse or build is one
EngineBuildError carrying TensorRT's own messages.

Weightless engines (`weightless`, --weightless: STRIP_PLAN and the refit each library documents)
hold no weights: the runtime refits them from the model's own ONNX graphs when it loads them
(trt.py), so a model published with its engines carries its weights once, not twice - an
engine is its weights plus a few MB (the 7B's int4 Helium: 4.0 GB beside 4.0 GB of graph
weights). The price is a read of the weights at every load, and TensorRT for RTX 1.7 builds
refittable engines only on a machine with a GPU (without one its builder fails inside): so they
are asked for, never the default; engines built without a GPU keep their weights.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from personaplex_edge.atomic import staged_dir
from personaplex_edge.contract import EngineSpec
from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.manifest import Manifest, load_model_dir, sha256_file, write_manifest
from personaplex_edge.user_cache import user_cache_dir, writable_dir

from .engine_cache import (Located, Target, add_engine, cached_engine, engine_cache_dir,
                           locate, max_frames, prune)
from .trt_library import (CHOICES, INSTALL, RTX, Library, build_targets, library_of,
                          load_library, unsupported_gpu)

Progress = Callable[[str], None]
ENGINES_COMMAND = "personaplex-edge engines --model {model_dir}"
# a verdict on quantised weights needs a difference the engine's own code cannot hide: a
# TensorRT for RTX engine carries a few to ~15 MB of kernels whatever its weights
_VERDICT_MIN_BYTES = 64 << 20


class EngineBuildError(PersonaPlexError):
    """TensorRT could not parse a graph or build its engine, or cannot be used here."""


def _onnx():
    try:
        import onnx
    except ImportError:
        raise EngineBuildError("building engines reads the graphs with onnx: "
                               + INSTALL[RTX]) from None
    return onnx


def _device():
    from .cuda_runtime import device_info

    return device_info(0)


@dataclass(frozen=True)
class BuildSetup:
    """What engines are built with and for: the library, the compute capabilities, and (mainline
    TensorRT) the GPU of this machine they are built on."""

    lib: Library
    targets: tuple[str, ...]
    device: object | None = None  # cuda_runtime.DeviceInfo, mainline only
    weightless: bool = False  # engines without their weights, refit from the graphs on load
    chosen: str = ""  # why --library auto took this library, where that is news to the user

    def describe(self) -> str:
        kind = "weightless engines, " if self.weightless else ""
        if self.device is None:
            return (f"{kind}{self.lib.title}, compute capabilities {', '.join(self.targets)}"
                    + ("" if self.weightless else " (no GPU needed to build)"))
        d = self.device
        return (f"{kind}{d.name} (sm {d.compute_capability}, {d.total_memory / 2**30:.0f} GiB), "
                f"{self.lib.title}")

    def announce(self) -> str:
        """What the engines will be built with, and why, where --library auto chose."""
        return (f"engines will be built with {self.describe()}"
                + (f" ({self.chosen})" if self.chosen else ""))


def build_setup(precisions: Iterable[str] = (), library: str | None = None,
                targets: Iterable[str] | None = None,
                weightless: bool = False) -> BuildSetup:
    """Checks that engines of `precisions` can be built here - the library (`library`: "auto",
    "tensorrt", "rtx"), onnx, for mainline TensorRT (and weightless engines) a CUDA GPU, every
    precision on every target - before an export spends an hour on the graphs. Raises
    PersonaPlexError naming the fix."""
    library = library or "auto"
    if library not in CHOICES:
        raise EngineBuildError(f"--library {library}: choose one of {', '.join(CHOICES)}")
    asked = tuple(targets) if targets else None
    lib, info, chosen = _choose_library(CHOICES[library], asked)
    _onnx()
    if lib.rtx:
        setup = BuildSetup(lib, build_targets(lib, precisions, asked), weightless=weightless,
                           chosen=chosen)
        if weightless:
            _gpu_for_weightless(lib)
        return setup
    return BuildSetup(lib, build_targets(lib, precisions, gpu_cc=info.compute_capability), info,
                      weightless, chosen)


def _choose_library(name: str | None, asked: tuple[str, ...] | None):
    """(library, this GPU for mainline TensorRT, why auto chose it) for --library `name`
    (None: auto). Mainline TensorRT builds only on the GPU it builds for; TensorRT for RTX
    builds anywhere, and alone knows --targets. So auto takes mainline TensorRT where it is
    installed and this machine has a GPU it can use, and TensorRT for RTX otherwise - where it
    is installed; where it is not, the refusal names it."""
    from .cuda_runtime import CudaError
    from .trt_library import MAINLINE, TensorRTMissing

    if name == RTX:
        return load_library(RTX), None, ""  # TensorRTMissing names its install line
    if name is None and asked:
        try:
            return load_library(RTX), None, ""
        except TensorRTMissing as e:
            raise TensorRTMissing(f"--targets are TensorRT for RTX's: {e}") from None
    try:
        mainline = load_library(MAINLINE)
    except TensorRTMissing:
        if name == MAINLINE:
            raise
        return load_library(None), None, ""  # TensorRT for RTX, or both install lines
    if asked:  # --library tensorrt --targets: refused before the GPU is looked for
        build_targets(mainline, (), asked)
    try:
        return mainline, _device(), ""
    except CudaError as e:
        no_gpu = e
    if name is None:
        try:
            rtx = load_library(RTX)
        except TensorRTMissing:
            pass
        else:
            return rtx, None, ("--library auto took TensorRT for RTX: mainline TensorRT is "
                               "installed too, but it builds only on the GPU it builds for, "
                               "and this machine has none it can use")
    raise EngineBuildError(
        f"{mainline.title} builds engines only on the GPU they are for, and this machine has "
        f"none it can use ({no_gpu}). Build portable engines for RTX GPUs here with --library "
        f"rtx ({INSTALL[RTX]}), or build on the machine of the GPU") from None


def _gpu_for_weightless(lib: Library) -> None:
    """TensorRT for RTX compiles refittable weights on a GPU even ahead of time (1.7: without
    one its builder fails inside, expecting CUDA_SUCCESS), so a weightless build without a GPU
    is refused before it starts."""
    from .cuda_runtime import CudaError

    try:
        _device()
    except CudaError as e:
        raise EngineBuildError(f"--weightless: {lib.title} builds weightless (refittable) "
                               f"engines only on a machine with an NVIDIA GPU ({e}); build "
                               "them there, or build engines with their weights here") from None


def default_timing_cache(trt_version: str, compute_capability: str) -> Path:
    """<user cache>/tensorrt/timing-sm<cc>-trt<version>.cache (user_cache.py)"""
    return user_cache_dir("tensorrt",
                          f"timing-sm{compute_capability.replace('.', '')}-trt{trt_version}.cache")


def _graph_proto(path: Path):
    """The graph of an ONNX file without its weights; a file onnx cannot read is one message."""
    onnx = _onnx()
    try:
        return onnx.load(str(path), load_external_data=False).graph
    except Exception as e:  # protobuf's DecodeError, OSError: a damaged or missing file
        raise EngineBuildError(f"cannot read {path.name} ({type(e).__name__}: {e}); export "
                               "the model again") from None


def uses_contrib_ops(path: Path) -> bool:
    """True for a graph converted for onnxruntime (MatMulNBits and other com.microsoft ops)."""
    return any(n.domain not in ("", "ai.onnx") for n in _graph_proto(path).node)


# ---- the weight bytes an engine should hold -----------------------------------------------------

@dataclass(frozen=True)
class WeightBytes:
    stored: int  # the graph's initializers as stored (quantised weights at their own width)
    as_float16: int  # the same with every quantised weight widened to float16


def graph_weight_bytes(path: Path) -> WeightBytes:
    """Counts a graph's initializer bytes from their types and shapes (no data read)."""
    onnx = _onnx()
    T = onnx.TensorProto
    bits = {T.FLOAT: 32, T.FLOAT16: 16, T.BFLOAT16: 16, T.DOUBLE: 64, T.INT64: 64, T.INT32: 32,
            T.INT16: 16, T.INT8: 8, T.UINT8: 8, T.BOOL: 8, T.FLOAT8E4M3FN: 8, T.INT4: 4,
            T.UINT4: 4}
    quantised = {T.INT8, T.FLOAT8E4M3FN, T.INT4, T.UINT4}
    stored = widened = 0
    for t in _graph_proto(path).initializer:
        count = 1
        for d in t.dims:
            count *= int(d)
        size = (count * bits.get(t.data_type, 32) + 7) // 8
        stored += size
        widened += 2 * count if t.data_type in quantised else size
    return WeightBytes(stored, widened)


def weights_verdict(engine_bytes: int, weights: WeightBytes, weightless: bool = False) -> str:
    """What the engine's size says about its weights (a phrase for the build's output)."""
    mb = 1e6
    sizes = (f"engine {engine_bytes / mb:.1f} MB, graph weights {weights.stored / mb:.1f} MB")
    if weightless:
        return sizes + ": weightless, refit from the graph when loaded"
    if weights.as_float16 == weights.stored:
        return sizes
    sizes += f" quantised / {weights.as_float16 / mb:.1f} MB as float16"
    if weights.as_float16 - weights.stored < _VERDICT_MIN_BYTES:
        return sizes + ": too small to tell whether TensorRT kept them quantised"
    if engine_bytes < (weights.stored + weights.as_float16) / 2:
        return sizes + ": weights kept quantised"
    return (sizes + ": weights FOLDED BACK TO FLOAT16 by TensorRT (no memory saved; int4 is "
            "the weight-only format TensorRT documents)")


# ---- building -----------------------------------------------------------------------------------

def _captured_log(trt):
    """A TensorRT logger that keeps the errors and warnings of one parse and build for the
    failure's message; a build that succeeds says nothing (its warnings are the parser's notes
    on int64 inputs)."""

    class CapturedLog(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []
            self.warnings: list[str] = []

        def log(self, severity, msg):
            name = getattr(severity, "name", str(severity))
            if name in ("INTERNAL_ERROR", "ERROR"):
                self.errors.append(msg)
            elif name == "WARNING" and "Int64 binding" not in msg:
                self.warnings.append(msg)

        def message(self) -> str:
            lines = self.errors + self.warnings
            return "\n  ".join(lines[:10]) if lines else "(TensorRT said nothing more)"

    return CapturedLog()


def _timing_cache(trt, config, cache_path: Path, progress: Progress):
    cache_bytes = cache_path.read_bytes() if cache_path.is_file() else b""
    cache = config.create_timing_cache(cache_bytes)
    # ignore_mismatch=False: TensorRT refuses (returns False) a cache recorded on a GPU with
    # other device properties - another model of the same compute capability (H100 and
    # H200) maps to the same file name - and one it cannot read; the build then starts from
    # an empty cache instead of trusting timings that do not hold here.
    if cache is None or not config.set_timing_cache(cache, False):
        if cache_bytes:
            progress(f"  {cache_path.name}: recorded on another GPU or unreadable; not used")
            cache = config.create_timing_cache(b"")
        if cache is None or not config.set_timing_cache(cache, False):
            raise EngineBuildError("TensorRT could not set up a timing cache (see its log)")


def _profile(trt, builder, network, max_frames: int):
    """An optimization profile for a graph with a dynamic dimension (helium_step's frames axis):
    min and opt at 1 (the live step, which the kernels are chosen for), max at `max_frames`
    (the longest persona prefill, one call). None for a graph with fixed shapes."""
    dynamic = [network.get_input(i) for i in range(network.num_inputs)
               if -1 in tuple(network.get_input(i).shape)]
    if not dynamic:
        return None
    profile = builder.create_optimization_profile()
    for tensor in dynamic:
        shape = tuple(tensor.shape)
        low = tuple(1 if d == -1 else d for d in shape)
        high = tuple(max_frames if d == -1 else d for d in shape)
        profile.set_shape(tensor.name, low, low, high)
    return profile


def shape_inputs(network) -> list[str]:
    """The network's inputs that feed a shape computation (TensorRT's shape tensors)."""
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    return [t.name for t in inputs if t.is_shape_tensor]


def _write_plan(trt, builder, network, config, out: Path) -> bool:
    """Builds the plan into the file `out`. Where the library can (TensorRT for RTX, mainline
    TensorRT 10.x's later releases), straight to the file through a stream writer, so the plan
    is never whole in host memory: measured at the 7B's width (one layer, fp16 Helium of 1.2
    GB), the build's anonymous memory peaks at 1.6 GB instead of 2.6 GB; for the 7B's fp16
    Helium (14.5 GB) that is ~16 GB instead of ~30 GB."""
    with open(out, "wb") as f:
        if hasattr(builder, "build_serialized_network_to_stream"):
            class FileWriter(trt.IStreamWriter):
                def __init__(self):
                    trt.IStreamWriter.__init__(self)

                def write(self, data) -> int:
                    view = memoryview(data)
                    f.write(view)
                    return view.nbytes

            return bool(builder.build_serialized_network_to_stream(network, config,
                                                                   FileWriter()))
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            return False
        f.write(memoryview(plan))
        return True


def _serialize(setup: BuildSetup, onnx_path: Path, precision: str, cache_path: Path | None,
               workspace_bytes: int | None, progress: Progress, out: Path, max_frames: int = 1):
    """Parses the graph and builds its plan into the file `out`; returns (config, seconds)."""
    trt = setup.lib.trt
    log = _captured_log(trt)
    builder = trt.Builder(log)
    network = builder.create_network(setup.lib.network_flags())
    parser = trt.OnnxParser(network, log)
    # parse_from_file resolves external weight files relative to the graph
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EngineBuildError(f"{setup.lib.title} cannot parse {onnx_path.name}:\n  "
                               + "\n  ".join((errors or log.errors)[:10]))
    shaped = shape_inputs(network)
    if shaped:
        raise EngineBuildError(
            f"{onnx_path.name}: {', '.join(shaped)} feed{'s' if len(shaped) == 1 else ''} a "
            "shape computation (a TopK's K, a Reshape's shape), which TensorRT makes a shape "
            "input: every new value would be a new engine shape, new kernels and a new CUDA "
            "graph. This version exports fixed shapes (top-k over a fixed K_max with a mask): "
            "export the model again")
    config = builder.create_builder_config()
    if workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if precision == "fp32" and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    if setup.weightless:
        for flag in setup.lib.weightless_flags():
            config.set_flag(flag)
    setup.lib.set_targets(config, setup.targets)
    profile = _profile(trt, builder, network, max_frames)
    if profile is not None:
        config.add_optimization_profile(profile)
    if cache_path is not None:
        _timing_cache(trt, config, cache_path, progress)
    t0 = time.perf_counter()
    built = _write_plan(trt, builder, network, config, out)
    seconds = time.perf_counter() - t0
    if not built:
        out.unlink(missing_ok=True)
        raise EngineBuildError(f"{setup.lib.title} could not build an engine for "
                               f"{onnx_path.name}:\n  {log.message()}")
    return config, seconds


def build_engine(onnx_path: Path, engine_path: Path, precision: str,
                 setup: BuildSetup | None = None, timing_cache: Path | None = None,
                 workspace_bytes: int | None = None, progress: Progress = print,
                 max_frames: int = 1) -> EngineSpec:
    """Parses `onnx_path`, builds its engine into `engine_path` and returns its EngineSpec.
    `setup`: the library and targets (default: build_setup for this precision). Every failure
    is an EngineBuildError (or a CUDA error) with one message."""
    setup = setup or build_setup([precision])
    lib = setup.lib
    if uses_contrib_ops(onnx_path):
        raise EngineBuildError(f"{onnx_path.name} uses onnxruntime-only ops (MatMulNBits): it "
                               "was converted for the onnx backend; export with --backend "
                               "tensorrt for TensorRT's weight-only form")
    cache_path = None
    if lib.timing_cache:
        cache_path = timing_cache or default_timing_cache(lib.version,
                                                          setup.device.compute_capability)
    # one per process: two starts building the same cached engine write their own
    tmp = engine_path.parent / f".{engine_path.name}.{os.getpid()}.partial"
    try:
        config, seconds = _serialize(setup, onnx_path, precision, cache_path, workspace_bytes,
                                     progress, tmp, max_frames)
        os.replace(tmp, engine_path)  # replaces (never rewrites) a hard-linked old engine
        if cache_path is not None:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            cache_tmp = cache_path.parent / f".{cache_path.name}.{os.getpid()}.partial"
            cache_tmp.write_bytes(memoryview(config.get_timing_cache().serialize()))
            os.replace(cache_tmp, cache_path)
    except PersonaPlexError:
        tmp.unlink(missing_ok=True)
        raise
    except (RuntimeError, TypeError, ValueError, AttributeError, OSError) as e:
        tmp.unlink(missing_ok=True)
        # TensorRT's bindings raise plain Python errors; the user gets one line, not a trace
        raise EngineBuildError(f"building {engine_path.name} failed: {type(e).__name__}: "
                               f"{e}") from e
    weights = graph_weight_bytes(onnx_path)
    size = engine_path.stat().st_size
    progress(f"  {engine_path.name}: built in {seconds:.0f} s for {setup.describe()}; "
             + weights_verdict(size, weights, setup.weightless))
    d = setup.device
    return EngineSpec(engine_path.name, sha256_file(engine_path), lib.version,
                      d.compute_capability if d else "", d.name if d else "", precision,
                      round(seconds, 1), device_memory=d.total_memory if d else 0,
                      weight_bytes=weights.stored, library=lib.name, targets=setup.targets,
                      weightless=setup.weightless)


def _check_names(model_dir: Path, manifest: Manifest, names: list[str]) -> None:
    unknown = [n for n in names if n not in manifest.graphs]
    if unknown:
        raise EngineBuildError(f"{model_dir} has no graph {', '.join(unknown)}; its graphs: "
                               + ", ".join(manifest.graphs))


def _build_each(model_dir: Path, manifest: Manifest, names: list[str],
                engine_path: Callable[[str], Path], setup: BuildSetup | None,
                timing_cache: Path | None, workspace_bytes: int | None,
                progress: Progress) -> Iterator[tuple[str, EngineSpec]]:
    """Builds the engine of each graph of `names` into the file `engine_path(name)`, yielding
    it as it is built; refuses unknown graphs and what cannot be built first."""
    _check_names(model_dir, manifest, names)
    setup = setup or build_setup(manifest.graphs[n].precision for n in names)
    for name in names:
        entry = manifest.graphs[name]
        path = engine_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        # each graph's own precision: the codec stays fp32 (TF32 off) inside an fp16 model,
        # and the depformer may differ from Helium
        yield name, build_engine(model_dir / entry.file, path, entry.precision, setup,
                                 timing_cache, workspace_bytes, progress,
                                 max_frames=max_frames(manifest))


def build_engines(model_dir: str | Path, manifest: Manifest | None = None,
                  graphs: list[str] | None = None, timing_cache: Path | None = None,
                  workspace_bytes: int | None = None, progress: Progress = print,
                  setup: BuildSetup | None = None) -> Manifest:
    """Builds an engine next to each graph (`<graph>.engine`) and returns the manifest with
    backend "tensorrt" and the engines recorded. The caller writes the manifest (the export
    in its staging directory, rebuild_engines in its own). `setup`: the library and targets
    (default: build_setup for the graphs' precisions)."""
    model_dir = Path(model_dir)
    manifest = manifest or load_model_dir(model_dir)
    entries = dict(manifest.graphs)
    def beside(name: str) -> Path:
        return model_dir / (Path(manifest.graphs[name].file).stem + ".engine")

    for name, spec in _build_each(model_dir, manifest, list(graphs or manifest.graphs), beside,
                                  setup, timing_cache, workspace_bytes, progress):
        entries[name] = dataclasses.replace(entries[name], engine=spec.to_dict())
    return dataclasses.replace(manifest, graphs=entries, backend="tensorrt")


# ---- engines for the GPU of this machine (first use, read-only models) ---------------------------

def runtime_library(manifest: Manifest, names: list[str]) -> Library:
    """The library that runs `names` on this GPU: the one that built the model's own engines
    where it is installed and runs on this GPU, else the first that does (load_library's
    order). TensorRTMissing or ModelDirError naming the fix where none does."""
    from .trt_library import RTX_TARGETS, TensorRTMissing

    info = _device()
    built_by = [library_of(manifest.graphs[n].engine) for n in names
                if manifest.graphs[n].engine]
    for name in dict.fromkeys([*built_by, None]):
        try:
            lib = load_library(name)
        except TensorRTMissing:
            continue
        if not lib.rtx or info.compute_capability in RTX_TARGETS:
            return lib
    lib = load_library(None)  # what is installed, or the message naming both install lines
    unsupported_gpu(lib, info.compute_capability, info.name)
    return lib


def this_gpu(lib: Library) -> Target:
    """What an engine built here by `lib` is built by and for."""
    info = _device()
    return Target(lib.version, info.compute_capability, info.name, info.total_memory, lib.name)


def _gpu_setup(lib: Library, precisions) -> BuildSetup:
    """Engines for this GPU only: mainline TensorRT builds on it; TensorRT for RTX builds for
    its compute capability alone (one target: the shortest build). A precision this GPU
    cannot hold is refused here."""
    info = _device()
    unsupported_gpu(lib, info.compute_capability, info.name)
    targets = build_targets(lib, precisions, gpu_cc=info.compute_capability)
    return BuildSetup(lib, targets, None if lib.rtx else info)


def build_cached_engines(model_dir: str | Path, manifest: Manifest, names: list[str],
                         lib: Library, timing_cache: Path | None = None,
                         workspace_bytes: int | None = None,
                         progress: Progress = print) -> dict[str, Located]:
    """Builds the engines of `names` for this GPU with `lib` into the per-user cache
    (engine_cache.py), each file in place before its record, then prunes what no model uses
    there any more (said): the model directory is not touched."""
    model_dir = Path(model_dir)
    gpu = this_gpu(lib)
    setup = _gpu_setup(lib, [manifest.graphs[n].precision for n in names])
    out = {}
    for name, spec in _build_each(model_dir, manifest, names,
                                  lambda name: cached_engine(gpu, manifest, name), setup,
                                  timing_cache, workspace_bytes, progress):
        engine = cached_engine(gpu, manifest, name)
        add_engine(engine, name, spec, model_dir)
        out[name] = Located(engine.parent, dataclasses.replace(manifest.graphs[name],
                                                               engine=spec.to_dict()))
    try:
        prune(progress)
    except OSError as e:  # the engines are built: a cache that cannot be tidied is no failure
        progress(f"the engine cache could not be pruned ({e})")
    return out


def engines_for_this_gpu(model_dir: str | Path, manifest: Manifest, names: list[str],
                         progress: Progress = print) -> dict[str, Located]:
    """The engine of each of `names` that runs on this GPU: the model directory's own, or the
    cache's; those that have none are built into the cache now (once: later starts find
    them)."""
    lib = runtime_library(manifest, names)
    gpu = this_gpu(lib)
    found, missing = locate(model_dir, manifest, names, gpu)
    if missing:
        how = ("TensorRT for RTX compiles it for this GPU: seconds to a minute for the 7B"
               if lib.rtx else "TensorRT times its kernels, which takes minutes for the 7B")
        progress(f"no engine of {', '.join(missing)} for this {gpu.device_name} "
                 f"({lib.title}) in {model_dir}: building it into "
                 f"{engine_cache_dir(gpu)} (once; {how})")
        found.update(build_cached_engines(model_dir, manifest, missing, lib, progress=progress))
    return found


def rebuild_engines(model_dir: str | Path, graphs: list[str] | None = None,
                    timing_cache: Path | None = None, workspace_bytes: int | None = None,
                    progress: Progress = print, library: str | None = None,
                    targets: Iterable[str] | None = None, weightless: bool = False) -> Manifest:
    """Builds (or rebuilds) the engines of an exported model directory - with mainline TensorRT
    for this machine's GPU, or with TensorRT for RTX for its targets (`library`, `targets`:
    build_setup) - through a staging copy of it: the directory changes in one rename when every
    engine is built, and a failure part-way leaves its old engines and manifest as they were. A
    directory the runtime may not write keeps its files: the engines go to the per-user cache
    for this GPU, and the manifest returned records them there."""
    model_dir = Path(model_dir)
    # checked first, so that its errors name this directory
    manifest = load_model_dir(model_dir, progress=progress)
    names = list(graphs or manifest.graphs)
    _check_names(model_dir, manifest, names)
    read_only = not writable_dir(model_dir)
    if read_only and (targets or weightless):
        # the per-user cache holds engines for this machine's GPU only, with their weights
        asked = " and ".join(f for f, on in (("--targets", targets),
                                             ("--weightless", weightless)) if on)
        raise EngineBuildError(
            f"{model_dir} is read-only here (or a Hugging Face snapshot), and {asked} "
            "build engines for the model directory itself; copy the model to a directory "
            "of your own to build them there, or leave out "
            f"{asked} to build engines for this machine's GPU into the per-user cache")
    setup = build_setup([manifest.graphs[n].precision for n in names], library, targets,
                        weightless)
    if setup.chosen:
        progress(setup.announce())
    if read_only:
        from .cuda_runtime import CudaError

        try:
            gpu = this_gpu(setup.lib)
        except CudaError as e:
            raise EngineBuildError(
                f"{model_dir} is read-only here (or a Hugging Face snapshot), so its engines "
                f"would go to the per-user cache for this machine's GPU, and there is none "
                f"({e}); copy the model to a directory of your own to build its portable "
                "engines there") from None
        progress(f"{model_dir} is read-only here (or a Hugging Face snapshot): the engines go "
                 f"to {engine_cache_dir(gpu)}")
        built = build_cached_engines(model_dir, manifest, names, setup.lib, timing_cache,
                                     workspace_bytes, progress)
        return dataclasses.replace(manifest, backend="tensorrt", graphs={
            **manifest.graphs, **{n: located.entry for n, located in built.items()}})
    with staged_dir(model_dir, progress=progress, seed_from=model_dir) as stage:
        manifest = build_engines(stage, manifest, names, timing_cache, workspace_bytes,
                                 progress, setup)
        write_manifest(stage, manifest)
        load_model_dir(stage)  # stamps the new engines' hashes for the first run
    return manifest
