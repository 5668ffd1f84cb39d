"""How long a new conversation takes to answer, with a cold and a warm persona cache: from the
moment it is opened on a loaded model (a client connected, --mic started) to its first answer
frame: the persona's prefill (or its restore from the cache), then the first 80 ms frame.

    python benchmarks/bench_startup.py [--models demo,mid] [--repeats 5] [--threads 2]

cold: an empty cache (the persona is prefilled and stored); warm: the same persona again (its
KV ring slots restored); disk: a new cache over the same --persona-cache-dir, as a new process
would have it. Target on the demo model (issue 13): under 50 ms warm.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="demo,mid")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/personaplex_bench_models")
    ap.add_argument("--json")
    args = ap.parse_args()
    from models import exported

    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.persona_cache import PersonaCache
    from personaplex_edge.runtime.sampling import SamplingParams

    frame = (np.random.default_rng(0).standard_normal(1920) * 0.1).astype(np.float32)
    rows = []
    for name in args.models.split(","):
        model_dir = exported(name, Path(args.work))
        results: dict[str, list[float]] = {"cold": [], "warm": [], "disk": []}
        for r in range(args.repeats + 1):  # the first round warms onnxruntime up
            with tempfile.TemporaryDirectory() as cache_dir:
                model = Model.load(model_dir, "cpu", args.threads,
                                   persona_cache=PersonaCache(directory=cache_dir))
                for way in ("cold", "warm", "disk"):
                    if way == "disk":
                        model.persona_cache = PersonaCache(directory=cache_dir)
                    t0 = time.perf_counter()
                    conv = model.open_conversation(SamplingParams(seed=r), Persona())
                    conv.prefill()
                    conv.step(frame)
                    ms = 1000 * (time.perf_counter() - t0)
                    assert conv.persona_cached == (way != "cold")
                    conv.close()
                    if r:
                        results[way].append(ms)
                model.close()
        row = {"model": name, **{k: float(np.median(v)) for k, v in results.items()}}
        rows.append(row)
        print(f"{name}: open -> first answer frame, median of {args.repeats}: cold "
              f"{row['cold']:.1f} ms, warm {row['warm']:.1f} ms, from disk {row['disk']:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
