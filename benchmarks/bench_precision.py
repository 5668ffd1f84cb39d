"""Each LM precision on onnxruntime (CPU): size on disk, bytes read per frame, ms/frame and greedy
token agreement with float32, on a random mid-size model; plus the bandwidth floor of the full
7B at each precision on a few devices.

    python benchmarks/bench_precision.py [--frames 200] [--threads 2] [--config mid|tiny]
                                         [--precisions fp32,fp16,bf16,int8,int4,int4+int8]
                                         [--rounds 3]
                                         [--timing-frames 30] [--json out.json]

The model: random weights in the published layout (export/synthetic.py) for Helium d 1024,
8 layers, the real context (3000) and the real depformer (1024, 6 layers, 8 active steps); the
codec is the tiny one (it is not converted and not timed here). float32 is exported once into
--work; each precision is a converted copy (export/precision.convert_model_dir), kept for reruns.

Agreement, two ways, both greedy over the same fixed random user codes:
  forced  the precision is fed float32's own tokens every frame and its choices compared
          (text token, audio tokens, frames equal in all 9): how often it decides the same
  free    both run on their own tokens; the first frame where they differ (after that the two
          histories differ and nothing more is comparable)
  hidden  median relative error of helium's output state (forced run): how far the precision
          moves the transformer, whatever the logits after it look like
A random model has flat logits (tiny top-1 margins over 2048 / 32000 entries), so token
agreement is pessimistic for a trained one: measured on the mid model, int8 Helium with a
float16 depformer still changes 15% of the audio tokens, only through its hidden state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from mid_model import mid_config

CPU_NOTE = {"bf16": "onnxruntime CPU has no bf16 MatMul (GPU only)"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def config(name: str):
    from personaplex_edge.config import preset

    if name == "tiny":
        return preset("tiny")
    return mid_config(tiny_codec=True)


def build_fp32(cfg, work: Path) -> Path:
    """The float32 model directory (random weights), unless `work` has it already."""
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    out = work / "fp32"
    if not (out / "manifest.json").is_file():
        t0 = time.perf_counter()
        ckpt = write_synthetic_checkpoint(cfg, work / "checkpoint")
        export_model(resolve_checkpoint(str(ckpt)), out, progress=log)
        shutil.rmtree(work / "checkpoint", ignore_errors=True)
        log(f"float32 export: {time.perf_counter() - t0:.0f} s")
    return out


def split(name: str) -> tuple[str, str | None]:
    """"int4+int8" -> Helium int4 with an int8 depformer; "int8" -> both int8."""
    helium, _, depformer = name.partition("+")
    return helium, depformer or None


def build_precision(fp32: Path, work: Path, precision: str) -> Path:
    from personaplex_edge.export.precision import convert_model_dir

    out = work / precision
    if not (out / "manifest.json").is_file():
        t0 = time.perf_counter()
        helium, depformer = split(precision)
        convert_model_dir(fp32, out, helium, progress=log, depformer_precision=depformer)
        log(f"{precision}: converted in {time.perf_counter() - t0:.0f} s")
    return out


def lm_disk_bytes(model_dir: Path, manifest) -> int:
    return sum((model_dir / f).stat().st_size for name in ("helium_step", "depformer_step")
               for f in (manifest.graphs[name].file, *manifest.graphs[name].data_files))


def agreement_runs(model_dir: Path, user: np.ndarray, reference, threads: int,
                   warmup: int) -> dict:
    """Greedy runs over all frames: the reference's own tokens, or a precision's agreement
    with them (forced and free)."""
    from lm_probe import GreedyLM, agreement, hidden_error

    lm = GreedyLM(model_dir, threads=threads)
    free = lm.run(user)
    if reference is None:
        return {"tokens": free.tokens, "hidden": free.hidden}
    forced = lm.run(user, reference["tokens"])
    return {"forced": agreement(forced.tokens, reference["tokens"]),
            "hidden_error": hidden_error(forced.hidden[warmup:], reference["hidden"][warmup:]),
            "first_difference": agreement(free.tokens, reference["tokens"])["first_difference"]}


def timing_rounds(dirs: dict[str, Path], user: np.ndarray, threads: int, rounds: int,
                  warmup: int) -> dict[str, dict[str, float]]:
    """ms/frame per stage: `rounds` rounds, each running every precision in turn for the
    same frames, and the median over rounds of each round's median. Interleaving spreads
    whatever else the machine does over all precisions alike; medians drop the spikes."""
    import gc

    from lm_probe import GreedyLM

    per: dict[str, list[tuple[float, float]]] = {p: [] for p in dirs}
    for r in range(rounds):
        for p, model_dir in dirs.items():
            run = GreedyLM(model_dir, threads=threads).run(user)
            per[p].append((float(np.median(run.temporal_ms[warmup:])),
                           float(np.median(run.depformer_ms[warmup:]))))
            del run
            gc.collect()
        log(f"timing round {r + 1}/{rounds} done")
    out = {}
    for p, values in per.items():
        a = np.array(values)  # [rounds, 2]
        temporal, depformer = float(np.median(a[:, 0])), float(np.median(a[:, 1]))
        out[p] = {"temporal_ms": temporal, "depformer_ms": depformer,
                  "total_ms": temporal + depformer}
    return out


def seven_b_table() -> list[str]:
    """Bandwidth floor of PersonaPlex-7B per precision (weights + KV at full context)."""
    from personaplex_edge.config import PersonaPlexConfig
    from frame_bytes import (DEVICES, estimate_bytes_per_frame,
                                                     floor_ms, layout_for)
    from personaplex_edge.export.precision import plan_for

    cfg = PersonaPlexConfig()
    int4_trt = plan_for("int4", "tensorrt")
    rows = [("fp32", plan_for("fp32"), None), ("fp16", plan_for("fp16"), None),
            ("bf16", plan_for("bf16"), None),
            ("int8, KV fp32 (CPU)", plan_for("int8"), None),
            ("int8, KV fp16", plan_for("int8", kv_dtype="float16"), None),
            ("int4, KV fp32 (CPU)", plan_for("int4"), None),
            ("int4, KV fp16", plan_for("int4", kv_dtype="float16"), None),
            ("int4 (TensorRT, block 128), KV fp16", int4_trt, None),
            ("int4 (TensorRT) + int8 depformer, KV fp16", int4_trt,
             plan_for("int8", "tensorrt")),
            ("int4 (TensorRT) + fp16 depformer, KV fp16", int4_trt,
             plan_for("fp16", "tensorrt"))]
    head = "| 7B precision | weights GB | KV GB | GB/frame | " + " | ".join(
        f"{d} ms" for d in DEVICES) + " |"
    out = [head, "|" + " --- |" * (4 + len(DEVICES))]
    for label, plan, depformer in rows:
        b = estimate_bytes_per_frame(cfg, layout_for(plan),
                                     layout_for(depformer) if depformer else None)
        out.append(f"| {label} | {b['weights'] / 1e9:.2f} | {b['kv'] / 1e9:.2f} | "
                   f"{b['total'] / 1e9:.2f} | "
                   + " | ".join(f"{floor_ms(b['total'], bw):.1f}" for bw in DEVICES.values())
                   + " |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--timing-frames", type=int, default=30, help="frames per timing round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--config", choices=("mid", "tiny"), default="mid")
    ap.add_argument("--precisions", default="fp32,fp16,bf16,int8,int4")
    ap.add_argument("--work", default="/tmp/personaplex_bench_precision")
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    from frame_bytes import (estimate_bytes_per_frame,
                                                     model_bytes_per_frame, layout_for)
    from personaplex_edge.export.precision import plan_for
    from personaplex_edge.manifest import load_model_dir

    cfg = config(args.config)
    work = Path(args.work) / args.config
    work.mkdir(parents=True, exist_ok=True)
    fp32 = build_fp32(cfg, work)
    precisions = [p for p in args.precisions.split(",") if p]
    dirs = {p: fp32 if p == "fp32" else build_precision(fp32, work, p) for p in precisions}

    n = args.frames + args.warmup
    user = np.random.default_rng(0).integers(0, cfg.audio_vocab_size, (n, 8)).astype(np.int64)
    log(f"fp32: {n} greedy frames")
    base = agreement_runs(fp32, user, None, args.threads, args.warmup)
    results = {}
    for p in precisions:
        manifest = load_model_dir(dirs[p])
        counted = model_bytes_per_frame(dirs[p], manifest)
        row = {"disk_bytes": lm_disk_bytes(dirs[p], manifest),
               "frame_bytes": counted["helium_step"] + counted["depformer_step"] + counted["kv"],
               "estimated_frame_bytes": estimate_bytes_per_frame(
                   cfg, layout_for(plan_for(split(p)[0])),
                   layout_for(plan_for(split(p)[1])) if split(p)[1] else None)["total"]}
        if p in CPU_NOTE:
            row["note"] = CPU_NOTE[p]
        elif p != "fp32":
            log(f"{p}: {n} greedy frames, free and forced")
            row.update(agreement_runs(dirs[p], user, base, args.threads, args.warmup))
        results[p] = row
    runnable = {p: d for p, d in dirs.items() if p not in CPU_NOTE}
    timing_user = user[:args.timing_frames + args.warmup]
    for p, t in timing_rounds(runnable, timing_user, args.threads, args.rounds,
                              args.warmup).items():
        results[p].update(t)

    h = cfg.temporal_config
    print(f"\nLM precisions on onnxruntime CPU, {args.threads} threads; agreement over "
          f"{args.frames} greedy frames, ms/frame the median of {args.rounds} interleaved rounds "
          f"of {args.timing_frames} frames; random weights, Helium d {h.hidden_size} x "
          f"{h.num_hidden_layers} layers, context {h.max_position_embeddings}; depformer d "
          f"{cfg.depformer_config.hidden_size} x {cfg.depformer_config.num_hidden_layers} layers, "
          f"{cfg.depformer_config.num_active_codebooks} steps\n")
    print("| precision | LM on disk MB | read/frame MB | temporal ms | depformer ms | "
          "total ms | hidden rel. error | text agree | audio agree | frames agree | "
          "first free diff |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for p, r in results.items():
        lead = f"| {p} | {r['disk_bytes'] / 1e6:.0f} | {r['frame_bytes'] / 1e6:.0f} | "
        if "note" in r:
            print(lead + f"n/a | n/a | n/a | n/a | {r['note']} | | | |")
            continue
        times = f"{r['temporal_ms']:.1f} | {r['depformer_ms']:.1f} | {r['total_ms']:.1f} | "
        if p == "fp32":
            print(lead + times + "(reference) | | | | |")
        else:
            a = r["forced"]
            print(lead + times + f"{r['hidden_error']:.2e} | {a['text']:.1%} | "
                  f"{a['audio']:.1%} | {a['frames']:.1%} | {r['first_difference']} |")
    print("\nKV ring: float32 for fp32/int8/int4 (onnxruntime's CPU has no fp16 MatMul), "
          "float16 for fp16 (what a GPU wants; on this CPU it costs a cast of the ring per step).")
    print("read/frame: weights counted in the graphs + the whole KV ring; the estimate from the "
          "config agrees within "
          + f"{max(abs(r['frame_bytes'] / r['estimated_frame_bytes'] - 1) for r in results.values()):.1%}"
          + " (it leaves out norm gains and constants).\n")
    print("Bandwidth floor of the full PersonaPlex-7B (weights read once per frame + the whole "
          "KV ring at context 3000; estimate, not measured):\n")
    print("\n".join(seven_b_table()))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {p: {k: v for k, v in r.items() if k not in ("tokens", "hidden")}
             for p, r in results.items()},
            indent=2))


if __name__ == "__main__":
    main()
