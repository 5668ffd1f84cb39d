"""TensorRT engines from a model directory's ONNX graphs, for the GPU of this machine.

The graphs already carry their precision (export/precision.py, backend "tensorrt"): fp16/bf16
islands, and weight-only int8/int4/fp8 as DequantizeLinear on the weights. The network is
therefore built strongly typed - TensorRT takes every tensor's type from the graph instead of
choosing per layer - which is what TensorRT 10 recommends for such graphs and the only mode
TensorRT 11 has. float32 graphs are built with TF32 off, so that a float32 engine can be checked
token for token against onnxruntime on the CPU.

Engines are specific to the TensorRT version and the GPU's compute capability; each one is
recorded with both (runtime/trt_engine.EngineSpec) and the runtime refuses a mismatch with the
command to rebuild. Building is slow (tactic timing), so a timing cache is kept per GPU type and
TensorRT version and reused by later builds.

    python -m personaplex_edge.export.tensorrt_build --model DIR [--graphs helium_step,...]
        builds (or rebuilds, e.g. on a Jetson) the engines of DIR in place
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path
from typing import Callable

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.manifest import Manifest, load_model_dir, sha256_file, write_manifest
from personaplex_edge.contract import EngineSpec

Progress = Callable[[str], None]
# fp8 tensor cores: Ada (8.9) and Hopper (9.0) and newer; Orin (8.7) has none
FP8_MIN_CC = (8, 9)


class EngineBuildError(PersonaPlexError):
    """TensorRT could not parse a graph or build its engine."""


def _tensorrt():
    from personaplex_edge.runtime.backends.trt import import_tensorrt

    return import_tensorrt()


def default_timing_cache(trt_version: str, compute_capability: str) -> Path:
    """~/.cache/personaplex-edge/tensorrt/timing-sm<cc>-trt<version>.cache"""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return (root / "personaplex-edge" / "tensorrt"
            / f"timing-sm{compute_capability.replace('.', '')}-trt{trt_version}.cache")


def _uses_contrib_ops(path: Path) -> bool:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return any(n.domain not in ("", "ai.onnx") for n in model.graph.node)


def build_engine(onnx_path: Path, engine_path: Path, precision: str,
                 timing_cache: Path | None = None, workspace_bytes: int | None = None,
                 progress: Progress = print) -> EngineSpec:
    """Parses `onnx_path`, builds its engine into `engine_path` and returns its EngineSpec."""
    from personaplex_edge.runtime.backends.cuda_runtime import device_info

    trt = _tensorrt()
    info = device_info(0)
    major, minor = (int(x) for x in info.compute_capability.split("."))
    if precision == "fp8" and (major, minor) < FP8_MIN_CC:
        raise EngineBuildError(f"fp8 needs compute capability >= 8.9 (Ada, Hopper); "
                               f"{info.name} is {info.compute_capability}. Use int8 or int4.")
    if _uses_contrib_ops(onnx_path):
        raise EngineBuildError(f"{onnx_path.name} uses onnxruntime-only ops (MatMulNBits): it "
                               "was converted for the onnx backend; export with --backend "
                               "tensorrt for TensorRT's weight-only form")
    trt_major = int(trt.__version__.split(".")[0])
    strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if trt_major < 10:
        # before 10 a network without EXPLICIT_BATCH is implicit-batch (the ONNX parser
        # refuses it), int64 inputs do not exist, and fp16 layers need builder flags
        raise EngineBuildError(f"TensorRT {trt.__version__} is too old: the engines need "
                               "TensorRT 10 or newer (pip install tensorrt-cu12; JetPack 6.2)")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
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
    cache_path = timing_cache or default_timing_cache(trt.__version__, info.compute_capability)
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

    t0 = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - t0
    if plan is None:
        raise EngineBuildError(f"TensorRT could not build an engine for {onnx_path.name} (see "
                               "its log above)")
    tmp = engine_path.parent / f".{engine_path.name}.partial"
    with open(tmp, "wb") as f:
        f.write(memoryview(plan))
    os.replace(tmp, engine_path)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    cache_tmp = cache_path.parent / f".{cache_path.name}.partial"
    cache_tmp.write_bytes(memoryview(config.get_timing_cache().serialize()))
    os.replace(cache_tmp, cache_path)
    progress(f"  {engine_path.name}: {engine_path.stat().st_size / 1e6:.0f} MB, built in "
             f"{seconds:.0f} s for {info.name} (sm {info.compute_capability}, TensorRT "
             f"{trt.__version__})")
    return EngineSpec(engine_path.name, sha256_file(engine_path), trt.__version__,
                      info.compute_capability, info.name, precision, round(seconds, 1))


def build_engines(model_dir: str | Path, manifest: Manifest | None = None,
                  graphs: list[str] | None = None, timing_cache: Path | None = None,
                  workspace_bytes: int | None = None, progress: Progress = print) -> Manifest:
    """Builds an engine next to each graph (`<graph>.engine`) and returns the manifest with
    backend "tensorrt" and the engines recorded. The caller writes the manifest (the export
    does so in its staging directory; `main` below does it in place)."""
    model_dir = Path(model_dir)
    manifest = manifest or load_model_dir(model_dir)
    names = graphs or list(manifest.graphs)
    entries = dict(manifest.graphs)
    for name in names:
        entry = entries[name]
        engine = model_dir / (Path(entry.file).stem + ".engine")
        # each graph's own precision: the codec stays fp32 (TF32 off) inside an fp16 model,
        # and the depformer may differ from Helium
        spec = build_engine(model_dir / entry.file, engine, entry.precision, timing_cache,
                            workspace_bytes, progress)
        entries[name] = dataclasses.replace(entry, engine=spec.to_dict())
    return dataclasses.replace(manifest, graphs=entries, backend="tensorrt")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build (or rebuild) the TensorRT engines of an "
                                 "exported model directory for this machine's GPU.")
    ap.add_argument("--model", required=True)
    ap.add_argument("--graphs", help="comma-separated graph names (default: all)")
    ap.add_argument("--timing-cache", type=Path)
    ap.add_argument("--workspace-gb", type=float)
    args = ap.parse_args(argv)
    manifest = build_engines(args.model, graphs=args.graphs.split(",") if args.graphs else None,
                             timing_cache=args.timing_cache,
                             workspace_bytes=int(args.workspace_gb * 2**30)
                             if args.workspace_gb else None)
    write_manifest(Path(args.model), manifest)


if __name__ == "__main__":
    main()
