"""Resident memory of one loaded model with 1, 2 and 4 open conversations: what each extra
conversation costs against the bytes of its state (KV rings + Mimi state).

    python benchmarks/bench_memory.py [--models demo,mid] [--work DIR] [--json out.json]

Each model is measured in a process of its own. A conversation is opened, prefilled with the
default persona and stepped 10 frames before the reading (onnxruntime sizes its arenas on the
first runs). Target (issue 9): each extra conversation within 1.2 x its state bytes + 5 MB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "bool": 1}


def state_bytes(manifest) -> int:
    """One conversation's KV rings and state tensors (batch 1), as the manifest declares them."""
    total = 0
    for g in manifest.graphs.values():
        total += sum(int(np.prod(r.shape)) * ITEM[r.dtype] for r in g.rings)
        total += sum(int(np.prod(s.shape)) * ITEM[s.dtype] for s in g.state)
    return total


def measure(model_dir: Path) -> dict:
    from models import rss_mb

    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.sampling import SamplingParams

    before = rss_mb()
    model = Model.load(model_dir, device="cpu", threads=2)
    loaded = rss_mb()
    pcm = (np.random.default_rng(0).standard_normal(10 * 1920) * 0.1).astype(np.float32)
    convs, rss = [], {}
    for n in (1, 2, 4):
        while len(convs) < n:
            conv = model.open_conversation(SamplingParams(seed=len(convs)), Persona())
            conv.prefill()
            for i in range(10):
                conv.step(pcm[i * 1920:(i + 1) * 1920])
            convs.append(conv)
        rss[n] = rss_mb()
    per_extra = (rss[4] - rss[1]) / 3
    state = state_bytes(model.manifest) / 2**20
    return {"model": str(model_dir), "rss_mb_before_load": before, "rss_mb_loaded": loaded,
            "rss_mb": rss, "per_extra_conversation_mb": per_extra, "state_mb": state,
            "target_mb": 1.2 * state + 5, "within_target": per_extra <= 1.2 * state + 5}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="demo,mid")
    ap.add_argument("--work", default="/tmp/personaplex_bench_models")
    ap.add_argument("--json")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure))))
        return
    from models import exported

    rows = []
    for name in args.models.split(","):
        model_dir = exported(name, Path(args.work))
        done = subprocess.run([sys.executable, __file__, "--measure", str(model_dir)],
                              capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["name"] = name
        rows.append(row)
    print(f"{'model':6}{'loaded':>9}{'1 conv':>9}{'2 conv':>9}{'4 conv':>9}{'per extra':>11}"
          f"{'state':>9}{'target':>9}  (MB RSS)")
    for r in rows:
        m = r["rss_mb"]
        print(f"{r['name']:6}{r['rss_mb_loaded']:9.1f}{m['1']:9.1f}{m['2']:9.1f}{m['4']:9.1f}"
              f"{r['per_extra_conversation_mb']:11.1f}{r['state_mb']:9.1f}{r['target_mb']:9.1f}"
              f"  {'ok' if r['within_target'] else 'OVER'}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
