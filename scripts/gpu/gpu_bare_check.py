"""The GPU check for a bare GPU machine: torch with CUDA, cupy, cuda-bindings and onnxruntime
for the CPU; no network, no TensorRT, no onnxruntime-gpu, no onnx. What a full machine checks
with the real libraries (scripts/gpu/gpu_check.py), this checks with what such a machine has:

  1. plumbing        the CUDA plumbing of runtime/backends on real device memory with a cupy
                     stand-in engine: eager == CUDA-graph replay == numpy, byte for byte, both
                     state parities; device memory freed (scripts/gpu/plumbing_check.py)
  2. tensorrt-path   TrtGraph + DeviceLinkedLM (the product path on TensorRT) and
     ort-cuda-path   OrtCudaGraph, over real device memory, every graph computed by onnxruntime
                     CPU behind a stand-in: tokens equal the CPU backend's over 60 frames
                     (scripts/gpu/backend_check.py, scripts/gpu/standin_engine.py)
  3. arith-*         the exported LM graphs' arithmetic on CUDA in fp32, fp16, bf16 and int4
                     against onnxruntime CPU float32 (scripts/gpu/arith_check.py): the first bf16
                     figure
  4. helium-7b-fp16  a 7B-shaped fp16 Helium step captured as a CUDA graph, against the
                     bandwidth floor (scripts/gpu/helium_timing.py)

The graphs travel as a bundle made here first (it needs onnx and the export):

    python scripts/gpu/gpu_bare_check.py --prepare            # -> build/gpu_bundle (~55 MB)
    python scripts/gpu/gpu_bare_check.py [--budget-s S] [--json out.json]   # on the GPU machine

Each stage runs in a child process with its own time limit, so a crash (a bad device
address) or a hang (a host function that cannot get the interpreter) fails that stage alone,
with its reason; the report says ok / FAILED / skipped for every stage, and is written as JSON
(--json, or $OUT/gpu_bare_check.json). `--simulate` runs the same stages on tests/fake_gpu's
simulated device and the CPU (the tests run it so; figures from it say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_stages import (ROOT, Budget, Skip, Stages, first_line, gpu_reason,  # noqa: E402
                          say, simulated_cuda, use_source_tree)

use_source_tree()

BUNDLE = ROOT / "build" / "gpu_bundle"
ARITH_PRECISIONS = ("fp32", "fp16", "bf16", "int4")
FRAMES = 60


# ---- the bundle (made on a machine with onnx) ---------------------------------------------------

def prepare(bundle: Path, progress=say, source: Path | None = None) -> Path:
    """The demo model (float32; `source`, else the built-in one) and its LM graphs in each
    precision as numpy-only dumps."""
    import shutil

    import onnx_dump

    from personaplex_edge.atomic import staged_dir
    from personaplex_edge.model_ref import resolve_model
    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.manifest import load_model_dir

    source = source or resolve_model("demo", progress)
    with staged_dir(bundle, progress) as stage:
        shutil.copytree(source, stage / "model")
        model = stage / "model"
        with tempfile.TemporaryDirectory() as tmp:
            for precision in ARITH_PRECISIONS:
                graphs_dir = model
                if precision != "fp32":  # the forms written for TensorRT (opset 21 for int4)
                    graphs_dir = Path(tmp) / precision
                    convert_model_dir(model, graphs_dir, precision, backend="tensorrt",
                                      progress=lambda s: None)
                manifest = load_model_dir(graphs_dir)
                for name in ("helium_step", "depformer_step"):
                    entry = manifest.graphs[name]
                    onnx_dump.dump_graph(graphs_dir / entry.file,
                                         stage / "dumps" / precision / f"{name}.npz",
                                         {"frames": 1}, entry.rings, precision)
                progress(f"dumped the {precision} LM graphs")
        (stage / "bundle.json").write_text(json.dumps(
            {"made": time.strftime("%Y-%m-%d %H:%M"), "model": "demo",
             "precisions": list(ARITH_PRECISIONS)}, indent=2))
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    progress(f"wrote {bundle} ({size / 1e6:.0f} MB); carry it to the GPU machine with the tree")
    return bundle


# ---- the stages (each runs in a child process) --------------------------------------------------

def _need_gpu(simulate: bool) -> None:
    if not simulate:
        why = gpu_reason()
        if why:
            raise Skip(why)


def stage_environment(bundle: Path, simulate: bool) -> dict:
    import importlib

    import numpy
    import onnxruntime

    parts = [f"python {sys.version.split()[0]}", f"numpy {numpy.__version__}",
             f"onnxruntime {onnxruntime.__version__}"]
    for module in ("torch", "cupy", "cuda.bindings", "tensorrt", "onnx", "sentencepiece"):
        try:
            m = importlib.import_module(module)
            parts.append(f"{module} {getattr(m, '__version__', '?')}")
        except Exception as e:  # noqa: BLE001 - ImportError, or OSError from its libraries
            parts.append(f"{module}: no ({type(e).__name__})")
    import torch

    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        parts.append(f"GPU {p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability "
                     f"{p.major}.{p.minor}, torch CUDA {torch.version.cuda}")
    else:
        parts.append("torch sees no CUDA device")
    if not (bundle / "bundle.json").is_file():
        parts.append(f"NO BUNDLE at {bundle} (make it with --prepare; stages 2-3 will skip)")
    return {"detail": "; ".join(parts)}


def stage_plumbing(bundle: Path, simulate: bool) -> dict:
    import plumbing_check as pc

    if simulate:
        cuda = simulated_cuda()
        return pc.check_plumbing(pc.NumpyKernels(cuda))
    _need_gpu(simulate)
    try:
        kernels = pc.CupyKernels()
    except ImportError as e:
        raise Skip(f"cupy does not import: {e}")
    out = pc.check_plumbing(kernels)
    memory = pc.check_memory(kernels)
    return {**out, **{k: v for k, v in memory.items() if k != "detail"},
            "detail": f"{out['detail']}; {memory['detail']}"}


def _model(bundle: Path) -> Path:
    model = bundle / "model"
    if not (model / "manifest.json").is_file():
        raise Skip(f"no bundle at {bundle}: run `python scripts/gpu/gpu_bare_check.py --prepare` "
                   "where onnx is installed, and carry build/gpu_bundle")
    return model


def stage_tensorrt_path(bundle: Path, simulate: bool) -> dict:
    import backend_check
    import standin_engine

    model = _model(bundle)
    if simulate:
        host = standin_engine.QueuedHostFunctions(simulated_cuda())
    else:
        _need_gpu(simulate)
        host, why = standin_engine.host_functions()
        if host is None:
            say(f"    {why}")
    with tempfile.TemporaryDirectory() as work:
        return backend_check.check_tensorrt_path(model, Path(work), host, frames=FRAMES)


def stage_ort_cuda_path(bundle: Path, simulate: bool) -> dict:
    import backend_check

    model = _model(bundle)
    if simulate:
        simulated_cuda()
    else:
        _need_gpu(simulate)
    return backend_check.check_ort_cuda(model, frames=FRAMES)


def stage_arith(precision: str):
    def run(bundle: Path, simulate: bool) -> dict:
        import arith_check

        model = _model(bundle)
        if not simulate:
            import torch

            if not torch.cuda.is_available():
                raise Skip("torch sees no CUDA device")
        return arith_check.compare(model, bundle / "dumps" / precision,
                                   "cpu" if simulate else "cuda", frames=FRAMES,
                                   precision=precision)
    return run


def stage_helium_7b(bundle: Path, simulate: bool) -> dict:
    import torch

    import helium_timing

    if simulate:  # the demo's shape on the CPU: the code path, not a figure
        from personaplex_edge.config import preset

        f = helium_timing.time_step(preset("demo"), "cpu", torch.bfloat16, iters=3)
        return {**f, "detail": f"simulated (demo shape, CPU bf16): {f['eager_ms']:.1f} ms"}
    if not torch.cuda.is_available():
        raise Skip("torch sees no CUDA device")
    return helium_timing.check()


# name -> (function, time limit s)
STAGE_TABLE = {
    "environment": (stage_environment, 60),
    "plumbing": (stage_plumbing, 120),
    "tensorrt-path": (stage_tensorrt_path, 150),
    "ort-cuda-path": (stage_ort_cuda_path, 120),
    **{f"arith-{p}": (stage_arith(p), 90) for p in ARITH_PRECISIONS},
    "helium-7b-fp16": (stage_helium_7b, 240),
}


def run_one(name: str, bundle: Path, simulate: bool, result: Path) -> int:
    """The child's side: one stage, its outcome as JSON in `result`."""
    fn = STAGE_TABLE[name][0]
    try:
        out = {"status": "ok", **fn(bundle, simulate)}
    except Skip as e:
        out = {"status": "skipped", "detail": str(e)}
    except Exception as e:  # noqa: BLE001 - reported to the parent, which goes on
        import traceback

        traceback.print_exc()
        out = {"status": "FAILED", "detail": first_line(e)}
    result.write_text(json.dumps(out, default=lambda v: v.tolist() if hasattr(v, "tolist")
                                 else str(v)))
    return 0


def in_child(name: str, bundle: Path, simulate: bool, limit: float):
    """A Stages function that runs stage `name` in a child process within `limit` seconds."""
    def run():
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "result.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", name,
                   "--bundle", str(bundle), "--result", str(result)]
            if simulate:
                cmd.append("--simulate")
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"no result within {limit:.0f} s (hung; killed)") from None
            if not result.is_file():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                raise RuntimeError(f"the stage's process died (exit {proc.returncode}): "
                                   + " | ".join(tail))
            out = json.loads(result.read_text())
        status = out.pop("status")
        if status == "skipped":
            raise Skip(out["detail"])
        if status == "FAILED":
            raise RuntimeError(out["detail"])
        return out
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prepare", action="store_true", help="make the bundle (needs onnx)")
    ap.add_argument("--bundle", default=str(BUNDLE))
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip the stages that would not finish within S seconds (default: "
                         "no limit)")
    ap.add_argument("--only", help="comma-separated stage names (default: all)")
    ap.add_argument("--simulate", action="store_true",
                    help="tests/fake_gpu's simulated device and the CPU instead of a GPU")
    ap.add_argument("--json")
    ap.add_argument("--stage", help=argparse.SUPPRESS)  # the child's side
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    bundle = Path(args.bundle)
    if args.prepare:
        prepare(bundle)
        return 0
    if args.stage:
        return run_one(args.stage, bundle, args.simulate, Path(args.result))
    names = args.only.split(",") if args.only else list(STAGE_TABLE)
    unknown = [n for n in names if n not in STAGE_TABLE]
    if unknown:
        say(f"unknown stage(s) {', '.join(unknown)}; known: {', '.join(STAGE_TABLE)}")
        return 2
    stages = Stages(Budget(args.budget_s))
    say(f"# personaplex-edge bare GPU check ({time.strftime('%Y-%m-%d %H:%M')})"
        + (" - SIMULATED" if args.simulate else ""))
    for name in names:
        limit = STAGE_TABLE[name][1]
        stages.run(name, in_child(name, bundle, args.simulate,
                                  min(limit, max(stages.budget.left(), 1))),
                   need_s=min(limit, 20))
    stages.summary()
    path = args.json or (Path(os.environ["OUT"]) / "gpu_bare_check.json"
                         if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps({"simulated": args.simulate,
                                          "stages": stages.results}, indent=2))
        say(f"\nwrote {path}")
    return 1 if any(r["status"] == "FAILED" for r in stages.results) else 0


if __name__ == "__main__":
    sys.exit(main())
