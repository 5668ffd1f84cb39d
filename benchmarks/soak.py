"""Soak: a long conversation on the built-in demo model, far past its context, watching for a
latency ramp and memory growth.

    python benchmarks/soak.py [--frames 10000] [--model DIR | --context 3000] [--json out.json]

Prints frame p50 of the first and last 1000 frames (after warm-up) and their ratio, the paired
ratio (the old session against a fresh one, stepped alternately: immune to machine drift), and
RSS at the start and end of the run. The session runs as fast as it can (no pacing): the same work per
frame as live audio, without waiting for the sound card.
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
from models import rss_mb  # noqa: E402


_MODELS: dict = {}


def _session(model_dir: Path, persona: bool):
    """A conversation on the model of `model_dir` (loaded once per process), prefilled."""
    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.sampling import SamplingParams

    model = _MODELS.get(model_dir) or _MODELS.setdefault(model_dir,
                                                          Model.load(model_dir, device="cpu"))
    conv = model.open_conversation(SamplingParams(seed=0),
                                   Persona(text_prompt="You are a patient listener.")
                                   if persona else Persona(enabled=False))
    conv.prefill()
    return conv


def soak(model_dir: Path, frames: int, window: int = 1000, warmup: int = 200) -> dict:
    session = _session(model_dir, persona=True)
    rng = np.random.default_rng(0)
    chunk = (rng.standard_normal(50 * 1920) * 0.1).astype(np.float32)

    def frame(s, i: int) -> float:
        j = i % 50
        t0 = time.perf_counter()
        s.step(chunk[j * 1920:(j + 1) * 1920])
        return 1000 * (time.perf_counter() - t0)

    frame_ms = np.empty(frames)
    rss = []
    t_start = time.perf_counter()
    for i in range(frames):
        frame_ms[i] = frame(session, i)
        if i % 500 == 0 or i == frames - 1:
            rss.append((i, rss_mb()))
    seconds = time.perf_counter() - t_start
    first = frame_ms[warmup:warmup + window]
    last = frame_ms[-window:]

    # First vs last window compares two stretches of wall time, so a neighbour on a shared
    # machine, or the VM's clock drifting, reads as a ramp. The paired measure does not: a fresh
    # session whose KV ring is still filling and the old one (far past the context) step
    # alternately, so every pair sees the same machine, and the median of per-pair ratios is
    # the cost of age alone.
    young = _session(model_dir, persona=False)
    context = young.model.context
    warm = min(warmup, context // 10)
    for i in range(warm):
        frame(young, i)
    pairs = min(window, context - young.position - 1)
    ratios = np.empty(pairs)
    for i in range(pairs):
        if i % 2:
            y = frame(young, i)
            o = frame(session, i)
        else:
            o = frame(session, i)
            y = frame(young, i)
        ratios[i] = o / y
    assert young.position < context
    return {"frames": frames, "context": session.model.context, "final_position": session.position,
            "seconds": seconds,
            "first_p50_ms": float(np.median(first)), "last_p50_ms": float(np.median(last)),
            "ramp": float(np.median(last) / np.median(first)),
            "paired_ratio": float(np.median(ratios)), "pairs": pairs,
            "young_position": young.position,
            "p50_per_window_ms": [float(np.median(frame_ms[i:i + window]))
                                  for i in range(warmup, frames - window + 1, window)],
            "rss_mb_after_warmup": next(m for i, m in rss if i >= warmup),
            "rss_mb_end": rss[-1][1], "rss_samples": rss}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=10000)
    ap.add_argument("--model", help="model directory (default: export the demo model)")
    ap.add_argument("--context", type=int,
                    help="export the demo model with this context instead of its 500 frames "
                         "(e.g. the 7B's 3000)")
    ap.add_argument("--json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else None
        if model is None:
            import dataclasses

            from personaplex_edge.config import preset
            from personaplex_edge.export.hub import resolve_checkpoint
            from personaplex_edge.export.model_export import export_model
            from personaplex_edge.export.synthetic import write_synthetic_checkpoint

            cfg = preset("demo")
            if args.context:
                cfg = dataclasses.replace(cfg, helium=dataclasses.replace(
                    cfg.temporal_config, max_position_embeddings=args.context))
            ckpt = write_synthetic_checkpoint(cfg, Path(tmp) / "ckpt")
            model = Path(tmp) / "model"
            export_model(resolve_checkpoint(str(ckpt)), model, progress=lambda s: None)
        r = soak(model, args.frames)
    print(f"{r['frames']} frames ({r['frames'] / 12.5 / 60:.1f} min of audio) in "
          f"{r['seconds']:.0f} s, context {r['context']} frames, final position "
          f"{r['final_position']}")
    print(f"frame p50: first 1000 {r['first_p50_ms']:.2f} ms, last 1000 {r['last_p50_ms']:.2f} ms,"
          f" ratio {r['ramp']:.3f}")
    print(f"paired: old session (position {r['final_position']}) vs a fresh one (ring not yet "
          f"full: position {r['young_position']} at the end), stepped alternately, median "
          f"per-pair ratio "
          f"{r['paired_ratio']:.3f} over {r['pairs']} pairs (flat: within 1.10)")
    print("frame p50 per 1000 frames: " + " ".join(f"{v:.2f}" for v in r["p50_per_window_ms"]))
    print(f"RSS: {r['rss_mb_after_warmup']:.1f} MB after warm-up, {r['rss_mb_end']:.1f} MB at the "
          f"end ({r['rss_mb_end'] - r['rss_mb_after_warmup']:+.1f} MB)")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
