"""Lockstep batching, side by side in one run: one tick of a batch-B model (B conversations in
one call of each graph) against B ticks of the batch-1 model (one call per conversation), on
the mid-size LM, which like the 7B on a GPU is bound by reading its weights.

    python benchmarks/bench_lockstep.py [--batches 4,8] [--rounds 40] [--threads 2]

Per round every configuration answers one frame of each of its conversations, in turn (the
order alternates), so every configuration sees the same machine. Reported per tick: the LM's
time (temporal + depformer) and the whole tick, p50; the ratio of a batch-B tick to a batch-1
tick (target for B = 4: at most 1.6), and per conversation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="4,8")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="mid", choices=("mid", "demo"))
    ap.add_argument("--work", default="/tmp/personaplex_bench_models")
    ap.add_argument("--json")
    args = ap.parse_args()
    from models import exported

    from personaplex_edge.runtime.conversation import step_many
    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.sampling import SamplingParams

    batches = [1] + [int(b) for b in args.batches.split(",")]
    runs = {}
    for b in batches:
        model = Model.load(exported(args.model, Path(args.work), b), device="cpu",
                           threads=args.threads)
        # batch 1: as many conversations as the largest batch, one group each
        n = max(batches) if b == 1 else b
        convs = [model.open_conversation(SamplingParams(seed=k), Persona(enabled=False))
                 for k in range(n)]
        runs[b] = {"model": model, "convs": convs, "lm": [], "tick": []}
    pcm = (np.random.default_rng(0).standard_normal(1920 * 64) * 0.1).astype(np.float32)
    lm_stage = ("temporal", "depformer")
    for r in range(args.warmup + args.rounds):
        order = batches if r % 2 == 0 else batches[::-1]
        for b in order:
            run = runs[b]
            frame = pcm[(r % 63) * 1920:(r % 63 + 1) * 1920]
            groups = {id(c.group): c.group for c in run["convs"]}
            seen = {k: g.metrics.frames for k, g in groups.items()}
            step_many({c: frame for c in run["convs"]})
            if r < args.warmup:
                continue
            for k, g in groups.items():
                table = g.metrics.table(last=g.metrics.frames - seen[k])
                idx = [g.metrics.stages.index(s) for s in lm_stage]
                run["lm"].extend(table[:, idx].sum(axis=1).tolist())
                run["tick"].extend(table[:, -1].tolist())
    base_lm = float(np.median(runs[1]["lm"]))
    base_tick = float(np.median(runs[1]["tick"]))
    rows = []
    print(f"{args.model} model, {args.threads} threads, {args.rounds} rounds, ticks p50 (ms):")
    print(f"{'batch':>6}{'LM/tick':>10}{'tick':>9}{'LM ratio':>10}{'tick ratio':>11}"
          f"{'LM/conv':>9}{'vs B ticks of 1':>17}")
    for b in batches:
        lm, tick = float(np.median(runs[b]["lm"])), float(np.median(runs[b]["tick"]))
        row = {"batch": b, "lm_ms": lm, "tick_ms": tick, "lm_ratio": lm / base_lm,
               "tick_ratio": tick / base_tick, "lm_ms_per_conversation": lm / b,
               "speedup_vs_batch1_ticks": b * base_lm / lm}
        rows.append(row)
        print(f"{b:6d}{lm:10.1f}{tick:9.1f}{row['lm_ratio']:10.2f}{row['tick_ratio']:11.2f}"
              f"{lm / b:9.1f}{row['speedup_vs_batch1_ticks']:16.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    for run in runs.values():
        for c in run["convs"]:
            c.close()


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
