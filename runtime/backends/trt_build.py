"""TensorRT engines from a model directory's ONNX graphs, built for the GPU of this machine.

Engine building is device-side work: it runs where the engines will run (a Jetson, an RTX box),
where torch is not installed, so it lives in the runtime and needs only TensorRT, cuda-python and
onnx (the `trt-cu12` / `trt-cu13` / `jetson` extras). The export calls `build_engines` on its
staging directory when it is handed it; `personaplex-edge engines --model DIR` calls
`rebuild_engines`, which builds in a staging copy of DIR (hard links, so the weights are not
copied) and swaps it in only when every engine is built: a failure part-way leaves the old
engines and manifest as they were. A model directory the runtime may not write (a hub snapshot,
a read-only copy: user_cache.writable_dir) has its engines built into the per-user cache
instead (engine_cache.py), by that command or on first use (`engines_for_this_gpu`).

The graphs already carry their precision (export/precision.py, backend "tensorrt"): fp16/bf16
islands, and weight-only int8/int4/fp8 as DequantizeLinear on the weights. The network is built
strongly typed - TensorRT takes every tensor's type from the graph instead of choosing per layer
- which is what TensorRT 10 recommends for such graphs and the only mode TensorRT 11 has.
float32 graphs are built with TF32 off, so that a float32 engine can be checked token for token
against onnxruntime on the CPU.

Each engine is recorded with what it was built by and for (contract.EngineSpec: TensorRT
version, compute capability, GPU name and memory size) and the weight bytes its graph holds;
after each build the engine's size is compared with those bytes, which tells whether TensorRT
kept quantised weights quantised or folded them back to float16 (TensorRT documents weight-only
quantisation for INT4 only). Building is slow (tactic timing), so a timing cache is kept per GPU
type and TensorRT version and reused by later builds.
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

from .engine_cache import Located, Target, add_record, engine_cache_dir, locate

Progress = Callable[[str], None]
# fp8 tensor cores: Ada (8.9) and Hopper (9.0) and newer; Orin (8.7) has none
FP8_MIN_CC = (8, 9)
ENGINES_COMMAND = "personaplex-edge engines --model {model_dir}"
_INSTALL_TRT = ("pip install 'personaplex-edge[trt-cu12]' (or [trt-cu13] for a CUDA 13 driver; "
                "on a Jetson, JetPack's TensorRT in a venv made with --system-site-packages and "
                "'personaplex-edge[jetson]')")
# a verdict on quantised weights needs a difference the engine's own overhead (kernels,
# tactics: a few MB) cannot hide
_VERDICT_MIN_BYTES = 16 << 20


class EngineBuildError(PersonaPlexError):
    """TensorRT could not parse a graph or build its engine, or cannot be used here."""


def _tensorrt():
    try:
        import tensorrt
    except (ImportError, OSError) as e:  # OSError: the wheel is there, its libraries do not load
        raise EngineBuildError(f"building engines needs TensorRT's Python bindings ({e}): "
                               + _INSTALL_TRT) from None
    major = int(tensorrt.__version__.split(".")[0])
    if major < 10:
        # before 10 a network without EXPLICIT_BATCH is implicit-batch (the ONNX parser
        # refuses it), int64 inputs do not exist, and fp16 layers need builder flags
        raise EngineBuildError(f"TensorRT {tensorrt.__version__} is too old: the engines need "
                               f"TensorRT 10 or newer ({_INSTALL_TRT}; JetPack 6.2)")
    return tensorrt


def _onnx():
    try:
        import onnx
    except ImportError:
        raise EngineBuildError("building engines reads the graphs with onnx: "
                               + _INSTALL_TRT) from None
    return onnx


def _device():
    from .cuda_runtime import device_info

    return device_info(0)


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


def weights_verdict(engine_bytes: int, weights: WeightBytes) -> str:
    """What the engine's size says about its weights (a phrase for the build's output)."""
    mb = 1e6
    sizes = (f"engine {engine_bytes / mb:.1f} MB, graph weights {weights.stored / mb:.1f} MB")
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

def preflight(precisions: Iterable[str] = ()) -> str:
    """Checks that engines can be built here at all - TensorRT 10+, onnx, a CUDA GPU, fp8
    support where asked - before an export spends an hour on the graphs. Returns the GPU's
    description; raises EngineBuildError (or the CUDA error) naming the fix."""
    trt = _tensorrt()
    _onnx()
    info = _device()
    _check_fp8(precisions, info)
    return (f"{info.name} (sm {info.compute_capability}, {info.total_memory / 2**30:.0f} GiB), "
            f"TensorRT {trt.__version__}")


def _check_fp8(precisions: Iterable[str], info) -> None:
    major, minor = (int(x) for x in info.compute_capability.split("."))
    if "fp8" in set(precisions) and (major, minor) < FP8_MIN_CC:
        raise EngineBuildError(f"fp8 needs compute capability >= 8.9 (Ada, Hopper); "
                               f"{info.name} is {info.compute_capability}. Use int8 or int4.")


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


def _serialize(trt, onnx_path: Path, precision: str, cache_path: Path,
               workspace_bytes: int | None, progress: Progress, max_frames: int = 1):
    """Parses the graph and builds its plan; returns (plan, config, seconds)."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if strongly_typed is not None:  # needed in 10; deprecated (always on) from 11
        flags |= 1 << int(strongly_typed)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    # parse_from_file resolves external weight files relative to the graph
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EngineBuildError(f"TensorRT cannot parse {onnx_path.name}:\n  "
                               + "\n  ".join(errors[:10]))
    config = builder.create_builder_config()
    if workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if precision == "fp32" and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    profile = _profile(trt, builder, network, max_frames)
    if profile is not None:
        config.add_optimization_profile(profile)
    _timing_cache(trt, config, cache_path, progress)
    t0 = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - t0
    if plan is None:
        raise EngineBuildError(f"TensorRT could not build an engine for {onnx_path.name} (see "
                               "its log above)")
    return plan, config, seconds


def build_engine(onnx_path: Path, engine_path: Path, precision: str,
                 timing_cache: Path | None = None, workspace_bytes: int | None = None,
                 progress: Progress = print, max_frames: int = 1) -> EngineSpec:
    """Parses `onnx_path`, builds its engine into `engine_path` and returns its EngineSpec.
    Every failure is an EngineBuildError (or a CUDA error) with one message."""
    trt = _tensorrt()
    info = _device()
    _check_fp8([precision], info)
    if uses_contrib_ops(onnx_path):
        raise EngineBuildError(f"{onnx_path.name} uses onnxruntime-only ops (MatMulNBits): it "
                               "was converted for the onnx backend; export with --backend "
                               "tensorrt for TensorRT's weight-only form")
    cache_path = timing_cache or default_timing_cache(trt.__version__, info.compute_capability)
    try:
        plan, config, seconds = _serialize(trt, onnx_path, precision, cache_path,
                                           workspace_bytes, progress, max_frames)
        tmp = engine_path.parent / f".{engine_path.name}.partial"
        with open(tmp, "wb") as f:
            f.write(memoryview(plan))
        os.replace(tmp, engine_path)  # replaces (never rewrites) a hard-linked old engine
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_tmp = cache_path.parent / f".{cache_path.name}.partial"
        cache_tmp.write_bytes(memoryview(config.get_timing_cache().serialize()))
        os.replace(cache_tmp, cache_path)
    except PersonaPlexError:
        raise
    except (RuntimeError, TypeError, ValueError, AttributeError, OSError) as e:
        # TensorRT's bindings raise plain Python errors; the user gets one line, not a trace
        raise EngineBuildError(f"building {engine_path.name} failed: {type(e).__name__}: "
                               f"{e}") from e
    weights = graph_weight_bytes(onnx_path)
    size = engine_path.stat().st_size
    progress(f"  {engine_path.name}: built in {seconds:.0f} s for {info.name} "
             f"(sm {info.compute_capability}, TensorRT {trt.__version__}); "
             + weights_verdict(size, weights))
    return EngineSpec(engine_path.name, sha256_file(engine_path), trt.__version__,
                      info.compute_capability, info.name, precision, round(seconds, 1),
                      device_memory=info.total_memory, weight_bytes=weights.stored)


def _build_each(model_dir: Path, manifest: Manifest, names: list[str], into: Path,
                timing_cache: Path | None, workspace_bytes: int | None,
                progress: Progress) -> Iterator[tuple[str, EngineSpec]]:
    """Builds the engine of each graph of `names` into directory `into` (`<graph>.engine`),
    yielding it as it is built; refuses unknown graphs and what this GPU cannot build first."""
    unknown = [n for n in names if n not in manifest.graphs]
    if unknown:
        raise EngineBuildError(f"{model_dir} has no graph {', '.join(unknown)}; its graphs: "
                               + ", ".join(manifest.graphs))
    preflight(manifest.graphs[n].precision for n in names)
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        entry = manifest.graphs[name]
        # each graph's own precision: the codec stays fp32 (TF32 off) inside an fp16 model,
        # and the depformer may differ from Helium
        yield name, build_engine(model_dir / entry.file, into / (Path(entry.file).stem
                                                                   + ".engine"),
                                 entry.precision, timing_cache, workspace_bytes, progress,
                                 max_frames=_max_frames(manifest))


def build_engines(model_dir: str | Path, manifest: Manifest | None = None,
                  graphs: list[str] | None = None, timing_cache: Path | None = None,
                  workspace_bytes: int | None = None, progress: Progress = print) -> Manifest:
    """Builds an engine next to each graph (`<graph>.engine`) and returns the manifest with
    backend "tensorrt" and the engines recorded. The caller writes the manifest (the export
    in its staging directory, rebuild_engines in its own)."""
    model_dir = Path(model_dir)
    manifest = manifest or load_model_dir(model_dir)
    entries = dict(manifest.graphs)
    for name, spec in _build_each(model_dir, manifest, list(graphs or manifest.graphs),
                                  model_dir, timing_cache, workspace_bytes, progress):
        entries[name] = dataclasses.replace(entries[name], engine=spec.to_dict())
    return dataclasses.replace(manifest, graphs=entries, backend="tensorrt")


def this_gpu() -> Target:
    """What an engine built here is built by and for."""
    trt, info = _tensorrt(), _device()
    return Target(trt.__version__, info.compute_capability, info.name, info.total_memory)


def build_cached_engines(model_dir: str | Path, manifest: Manifest, names: list[str],
                         timing_cache: Path | None = None, workspace_bytes: int | None = None,
                         progress: Progress = print) -> dict[str, Located]:
    """Builds the engines of `names` for this GPU into the per-user cache (engine_cache.py),
    each file in place before its record: the model directory is not touched."""
    model_dir = Path(model_dir)
    cache = engine_cache_dir(model_dir, this_gpu())
    out = {}
    for name, spec in _build_each(model_dir, manifest, names, cache, timing_cache,
                                  workspace_bytes, progress):
        add_record(cache, name, spec)
        out[name] = Located(cache, dataclasses.replace(manifest.graphs[name],
                                                       engine=spec.to_dict()))
    return out


def engines_for_this_gpu(model_dir: str | Path, manifest: Manifest, names: list[str],
                         progress: Progress = print) -> dict[str, Located]:
    """The engine of each of `names` that runs on this GPU: the model directory's own, or the
    cache's; those that have none are built into the cache now (once: later starts find
    them)."""
    gpu = this_gpu()
    found, missing = locate(model_dir, manifest, names, gpu)
    if missing:
        progress(f"no TensorRT engine of {', '.join(missing)} for this {gpu.device_name} "
                 f"(TensorRT {gpu.tensorrt_version}) in {model_dir}: building it into "
                 f"{engine_cache_dir(model_dir, gpu)} (once; TensorRT times its kernels, which "
                 "takes minutes for the 7B)")
        found.update(build_cached_engines(model_dir, manifest, missing, progress=progress))
    return found


def _max_frames(manifest: Manifest) -> int:
    """The longest call of helium_step: a persona prefill runs up to context - 1 frames."""
    return manifest.config.temporal_config.max_position_embeddings - 1


def rebuild_engines(model_dir: str | Path, graphs: list[str] | None = None,
                    timing_cache: Path | None = None, workspace_bytes: int | None = None,
                    progress: Progress = print) -> Manifest:
    """Builds (or rebuilds) the engines of an exported model directory for this machine's GPU,
    through a staging copy of it: the directory changes in one rename when every engine is
    built, and a failure part-way leaves its old engines and manifest as they were. A directory
    the runtime may not write keeps its files: the engines go to the per-user cache, and the
    manifest returned records them there."""
    model_dir = Path(model_dir)
    # checked first, so that its errors name this directory
    manifest = load_model_dir(model_dir, progress=progress)
    if not writable_dir(model_dir):
        names = list(graphs or manifest.graphs)
        progress(f"{model_dir} is read-only here (or a Hugging Face snapshot): the engines go "
                 f"to {engine_cache_dir(model_dir, this_gpu())}")
        built = build_cached_engines(model_dir, manifest, names, timing_cache, workspace_bytes,
                                     progress)
        return dataclasses.replace(manifest, backend="tensorrt", graphs={
            **manifest.graphs, **{n: located.entry for n, located in built.items()}})
    with staged_dir(model_dir, progress=progress, seed_from=model_dir) as stage:
        manifest = build_engines(stage, manifest, graphs, timing_cache, workspace_bytes,
                                 progress)
        write_manifest(stage, manifest)
        load_model_dir(stage)  # stamps the new engines' hashes for the first run
    return manifest
