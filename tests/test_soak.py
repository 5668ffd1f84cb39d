"""A shorter soak than benchmarks/soak.py: past the demo model's context, no latency ramp and no
memory growth."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from soak import soak  # noqa: E402


def test_no_latency_ramp_no_memory_growth_past_the_context(demo_model_dir):
    r = soak(demo_model_dir, frames=1500, window=300, warmup=100)
    assert r["final_position"] > 2 * r["context"]  # the KV ring wrapped at least twice
    # the paired ratio, not first-vs-last window: a busy neighbour on a shared machine slows both
    # sessions of a pair alike (see soak.py)
    assert r["young_position"] < r["context"] < r["final_position"] / 2
    assert r["paired_ratio"] < 1.2, r
    # a slowdown of the whole process (allocator, thread pools) would hit both sessions of a
    # pair alike: only the wall-clock windows see it, coarsely (a shared machine drifts 2x)
    assert r["ramp"] < 3.0, r
    assert r["rss_mb_end"] - r["rss_mb_after_warmup"] < 20, r["rss_samples"]
