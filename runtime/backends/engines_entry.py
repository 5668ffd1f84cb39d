"""From the command line to the engine build: the `engines` command, and the flags it shares
with `export --backend tensorrt` (which library builds, for which GPUs).

    personaplex-edge engines --model DIR [--library auto|tensorrt|rtx] [--targets 8.9,12.0]

Mainline TensorRT builds for the GPU of the machine it runs on; TensorRT for RTX builds portable
engines for compute capabilities (default 8.6, 8.9 and 12.0: RTX 30, 40 and 50) on any machine,
with or without a GPU (runtime/backends/trt_library.py).
"""

from __future__ import annotations

import time
from pathlib import Path

from .trt_library import CHOICES, RTX, RTX_TARGETS


def add_build_flags(p) -> None:
    """--library and --targets, on `engines` and on `export`."""
    p.add_argument("--library", choices=[c for c in CHOICES if c != RTX],
                   default="auto",
                   help="which TensorRT builds the engines: tensorrt (mainline: for this "
                        "machine's GPU), rtx (TensorRT for RTX: portable RTX engines, no GPU "
                        "needed to build), auto (mainline where installed and this machine "
                        "has a GPU, else rtx; rtx with --targets)")
    p.add_argument("--targets", metavar="CC,CC",
                   help="with TensorRT for RTX: the compute capabilities to build for, of "
                        f"{', '.join(RTX_TARGETS)} (default: 8.6, 8.9 and 12.0 - RTX 30, 40, "
                        "50 - less those the precision needs newer for: fp8 8.9+; not 7.5: "
                        "Turing has no float32 matrix products there)")
    p.add_argument("--weightless", action="store_true",
                   help="engines without their weights, refit from the model's ONNX graphs "
                        "when loaded: a published model then carries its weights once, not "
                        "twice (needs a GPU where they are built)")


def targets(args) -> list[str] | None:
    return [t.strip() for t in args.targets.split(",") if t.strip()] if args.targets else None


def add_parser(sub) -> None:
    """`personaplex-edge engines` on the CLI's subparsers (personaplex_edge/cli.py)."""
    g = sub.add_parser("engines", help="build (or rebuild) the TensorRT engines of a model "
                                       "directory: for this machine's GPU, or portable RTX "
                                       "engines (TensorRT for RTX, no GPU needed)")
    g.add_argument("--model", required=True,
                   help="a model exported with --backend tensorrt: a directory or a hub id "
                        "(OWNER/NAME[@REVISION]); engines go into the directory, or into "
                        "~/.cache/personaplex-edge where it is read-only")
    g.add_argument("--graphs", help="comma-separated graph names (default: all)")
    add_build_flags(g)
    g.add_argument("--timing-cache", type=Path, help="mainline TensorRT's timing cache file "
                   "(default: ~/.cache/personaplex-edge/tensorrt/, one per GPU type and "
                   "TensorRT version)")
    g.add_argument("--workspace-gb", type=float, help="TensorRT's workspace limit")
    g.set_defaults(func=run)


def run(args) -> int:
    """Builds (or rebuilds) the engines of a model directory through a staging copy: a failure
    leaves the old engines and manifest as they were. A directory that may not be written (a
    hub snapshot, a read-only copy) gets them in the per-user cache instead."""
    from personaplex_edge.model_ref import resolve_model

    from .trt_build import rebuild_engines

    t0 = time.perf_counter()
    graphs = [g.strip() for g in args.graphs.split(",") if g.strip()] if args.graphs else None
    model_dir = resolve_model(args.model, print)
    manifest = rebuild_engines(model_dir, graphs=graphs, timing_cache=args.timing_cache,
                               workspace_bytes=int(args.workspace_gb * 2**30)
                               if args.workspace_gb else None, library=args.library,
                               targets=targets(args), weightless=args.weightless)
    built = [n for n, g in manifest.graphs.items() if g.engine and (not graphs or n in graphs)]
    print(f"{args.model}: engines for {', '.join(built)} in {time.perf_counter() - t0:.1f} s")
    return 0


def export_builder(args, precisions: list[str]):
    """The engine builder `export --backend tensorrt` hands its staging directory to, set up
    (library, targets, a GPU where mainline TensorRT builds) before the export starts; None
    with --no-engines."""
    if args.backend != "tensorrt" or args.no_engines:
        return None
    import functools

    from .trt_build import build_engines, build_setup

    setup = build_setup(precisions, args.library, targets(args), args.weightless)
    print(setup.announce())
    return functools.partial(build_engines, setup=setup)
