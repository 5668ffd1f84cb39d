"""The levers on the CPU frame's bytes, measured: each layout of the CPU recipe (Helium int4,
depformer int8, onnxruntime) against the recipe as exported, on the mid model (random weights,
the 7B's context and depformer), with the drift each causes; and the 7B's bytes per frame with
each, on paper, on this machine and two others.

    python benchmarks/cpu_levers.py [--variants int4+int8,int4+int8/b128,...] [--frames 100]
                                    [--rounds 3] [--timing-frames 30] [--threads 2] [--json out]

A variant is PRECISION[+DEPFORMER][/OPTION...], options:
    bN     MatMulNBits block of N weights along K for Helium's int4 (32 as exported): fewer
           float32 scales per weight, coarser steps
    accN   MatMulNBits accuracy_level N for both graphs (4 as exported: int8 activations on
           the CPU's VNNI dot products; 1: float32 activations)
    kv16   the KV ring in float16 (onnxruntime's x86 CPU has no float16 MatMul: the step casts
           the ring to float32 every frame; ARM's has one)

Per variant: the LM's bytes per frame (weights counted in the graphs + the whole KV ring),
temporal and depformer ms (the median of --rounds interleaved rounds, so whatever else the
machine does falls on every variant alike), the copy floor those bytes give at this machine's
measured copy bandwidth (benchmarks/frame_bytes.copy_bandwidth) and the fraction of it reached;
the drift, teacher-forced against float32 over --frames greedy frames (bench_precision.py's
agreement: text and audio tokens the same, the hidden state's median relative error). The 7B's
table uses the same layouts (frame_bytes.estimate_bytes_per_frame).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT = ("int4+int8,int4+int8/b64,int4+int8/b128,int4+int8/acc1,int4+int8/kv16,"
           "int4+int8/b128/kv16,int4+int4,int4+int4/b128")
# GB/s: a laptop with dual-channel LPDDR5X-7500 (120 GB/s); an AGX Orin's whole LPDDR5
# (204.8 GB/s, shared with its GPU; its CPU cluster alone reaches less, unmeasured here)
PAPER = {"laptop 120 GB/s": 120.0, "AGX Orin 204.8 GB/s": 204.8}


def variant_plans(name: str) -> dict:
    """The plans (graph -> PrecisionPlan) a variant name stands for."""
    from bench_precision import split

    from personaplex_edge.contract import DEPFORMER_STEP, HELIUM_STEP
    from personaplex_edge.export.precision_plan import lm_plans

    base, *options = name.split("/")
    helium, depformer = split(base)
    kv = "float16" if "kv16" in options else None
    plans = lm_plans(helium, "onnx", kv, None, depformer)
    for option in options:
        if option == "kv16":
            continue
        if option.startswith("acc"):
            plans = {g: dataclasses.replace(p, accuracy_level=int(option[3:]))
                     for g, p in plans.items()}
        elif option.startswith("b"):
            plans[HELIUM_STEP] = dataclasses.replace(plans[HELIUM_STEP],
                                                     block_size=int(option[1:]))
        else:
            raise SystemExit(f"unknown option {option!r} in {name!r}")
    return {HELIUM_STEP: plans[HELIUM_STEP], DEPFORMER_STEP: plans[DEPFORMER_STEP]}


def build(fp32: Path, work: Path, name: str) -> Path:
    from bench_precision import log, split

    from personaplex_edge.export.precision import convert_model_dir

    out = work / name.replace("/", "_")
    if not (out / "manifest.json").is_file():
        helium, _ = split(name.split("/")[0])
        convert_model_dir(fp32, out, helium, plans=variant_plans(name), progress=log)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=DEFAULT)
    ap.add_argument("--frames", type=int, default=100, help="greedy frames of the drift")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--timing-frames", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/personaplex_cpu_levers")
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from bench_precision import agreement_runs, build_fp32, config, log, timing_rounds
    from frame_bytes import (copy_bandwidth, estimate_bytes_per_frame, layout_for,
                             model_bytes_per_frame)

    from personaplex_edge.config import PersonaPlexConfig
    from personaplex_edge.contract import DEPFORMER_STEP, HELIUM_STEP
    from personaplex_edge.manifest import load_model_dir

    cfg = config("mid")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    fp32 = build_fp32(cfg, work)
    variants = [v for v in args.variants.split(",") if v]
    dirs = {v: build(fp32, work, v) for v in variants}
    n = args.frames + args.warmup
    user = np.random.default_rng(0).integers(0, cfg.audio_vocab_size, (n, 8)).astype(np.int64)
    log(f"fp32: {n} greedy frames")
    base = agreement_runs(fp32, user, None, args.threads, args.warmup)
    rows = {}
    for v, d in dirs.items():
        counted = model_bytes_per_frame(d, load_model_dir(d))
        log(f"{v}: {n} greedy frames, free and forced")
        rows[v] = {"bytes": counted["helium_step"] + counted["depformer_step"] + counted["kv"],
                   **agreement_runs(d, user, base, args.threads, args.warmup)}
    bandwidth = copy_bandwidth(args.threads)
    times = timing_rounds(dirs, user[:args.timing_frames + args.warmup], args.threads,
                          args.rounds, args.warmup)
    bandwidth = max(bandwidth, copy_bandwidth(args.threads))  # the better of before and after
    seven_b = PersonaPlexConfig()
    for v, r in rows.items():
        r.update(times[v])
        r["floor_ms"] = 1000 * r["bytes"] / bandwidth
        plans = variant_plans(v)
        r["7b_bytes"] = estimate_bytes_per_frame(seven_b, layout_for(plans[HELIUM_STEP]),
                                                 layout_for(plans[DEPFORMER_STEP]))
    report(rows, bandwidth, args, cfg)
    if args.json:
        Path(args.json).write_text(json.dumps({"bandwidth": bandwidth, "variants": rows},
                                              indent=2, default=float))


def report(rows: dict, bandwidth: float, args, cfg) -> None:
    h = cfg.temporal_config
    print(f"\nmid model (Helium d {h.hidden_size} x {h.num_hidden_layers}, context "
          f"{h.max_position_embeddings}, the real depformer), onnxruntime CPU, {args.threads} "
          f"threads; copy bandwidth {bandwidth / 1e9:.1f} GB/s; ms the median of {args.rounds} "
          f"interleaved rounds of {args.timing_frames} frames; drift teacher-forced against "
          f"float32 over {args.frames} greedy frames (load {os.getloadavg()[0]:.2f})\n")
    print("| variant | MB/frame | temporal ms | depformer ms | LM ms | floor ms | of floor | "
          "hidden rel. error | text agree | audio agree |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for v, r in rows.items():
        a = r["forced"]
        print(f"| {v} | {r['bytes'] / 1e6:.0f} | {r['temporal_ms']:.1f} | "
              f"{r['depformer_ms']:.1f} | {r['total_ms']:.1f} | {r['floor_ms']:.1f} | "
              f"{r['floor_ms'] / r['total_ms']:.0%} | {r['hidden_error']:.2e} | "
              f"{a['text']:.1%} | {a['audio']:.1%} |")
    here = bandwidth / 1e9
    print(f"\nthe 7B with each (on paper: weights + the whole KV ring; floor = bytes / "
          "bandwidth; the fraction of it this machine reached on the mid model is the "
          "column before)\n")
    print(f"| variant | weights GB | KV GB | GB/frame | this machine ({here:.0f} GB/s) ms | "
          + " | ".join(f"{k} ms" for k in PAPER) + " |")
    print("| --- |" + " ---: |" * (4 + len(PAPER)))
    for v, r in rows.items():
        b = r["7b_bytes"]
        print(f"| {v} | {b['weights'] / 1e9:.2f} | {b['kv'] / 1e9:.2f} | "
              f"{b['total'] / 1e9:.2f} | {1000 * b['total'] / bandwidth:.0f} | "
              + " | ".join(f"{b['total'] / bw / 1e6:.0f}" for bw in PAPER.values()) + " |")


if __name__ == "__main__":
    main()
