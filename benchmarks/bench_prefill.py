"""The persona prefill, side by side in one run: the forced frames in one Helium call over a
frames axis (the weights read once) against one Helium step per frame (the reference's way),
and a restore from the persona cache; with the projection for the 7B on a Jetson AGX Orin from
the bytes each path reads.

    python benchmarks/bench_prefill.py [--model mid|demo] [--repeats 3] [--threads 2]

Reported: ms for the forced frames each way (the conversation's last prompt column, sampled
like a live step, is the same one step in every path), the speed-up (target on this CPU: 5x),
whether the conversation after is the same (greedy tokens over 100 frames), and the warm path
(ring slots restored from the cache).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def orin_projection(forced: int) -> dict:
    """ms for `forced` prompt frames of the 7B (fp16 weights and KV) on a Jetson AGX Orin, from
    the bytes read: frame by frame, every frame reads Helium's weights and its KV ring; one
    call reads them once (the KV ring it reads is as empty; the new rows are written once)."""
    from personaplex_edge.config import PersonaPlexConfig
    from frame_bytes import (DEVICES, Layout, floor_ms,
                                                     linear_shapes)

    cfg = PersonaPlexConfig()
    shapes = linear_shapes(cfg)["helium_step"]
    weights = sum(k * n * 2 for k, n in shapes)  # fp16
    h = cfg.temporal_config
    kv = 2 * h.num_hidden_layers * h.max_position_embeddings * h.hidden_size * Layout(2, 2).kv_bytes
    bw = DEVICES["Jetson AGX Orin"]
    per_frame = floor_ms(forced * (weights + kv), bw)
    batched = floor_ms(weights + kv, bw)
    flop = 2 * sum(k * n for k, n in shapes) * forced
    return {"frames": forced, "weights_gb": weights / 1e9, "kv_gb": kv / 1e9,
            "frame_by_frame_ms": per_frame, "one_call_ms": batched, "one_call_gflop": flop / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mid", choices=("mid", "demo"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/personaplex_bench_models")
    ap.add_argument("--json")
    args = ap.parse_args()
    from models import exported

    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.persona import Persona, build_persona
    from personaplex_edge.runtime.sampling import SamplingParams

    model = Model.load(exported(args.model, Path(args.work)), device="cpu", threads=args.threads)
    persona = Persona()  # the default text prompt and voice (NATF2)
    conv = model.open_conversation(SamplingParams(greedy=True), persona)
    plan = build_persona(model.loaded, persona)
    forced = len(plan) - 1
    times = {"one call": [], "frame by frame": [], "from the cache": []}
    pcm = (np.random.default_rng(1).standard_normal(101 * 1920) * 0.1).astype(np.float32)
    tokens = {}
    for r in range(args.repeats + 1):  # the first round warms up
        for way in (["one call", "frame by frame"] if r % 2 else ["frame by frame", "one call"]):
            conv.restart()
            t0 = time.perf_counter()
            conv.group.prefill_forced(conv.row, plan, frame_by_frame=way == "frame by frame")
            ms = 1000 * (time.perf_counter() - t0)
            if r:
                times[way].append(ms)
            if r == 1:
                conv.group.prefill_last(conv.row, plan)
                got = []
                for i in range(101):
                    conv.step(pcm[i * 1920:(i + 1) * 1920])
                    got.append(conv.last_frame.copy())
                tokens[way] = np.array(got[1:])
        snapshot_rings = conv.group.helium.ring_prefix([conv.row], forced)
        conv.restart()
        t0 = time.perf_counter()
        conv.group.helium.set_ring_prefix(snapshot_rings, [conv.row])
        if r:
            times["from the cache"].append(1000 * (time.perf_counter() - t0))
    p50 = {k: float(np.median(v)) for k, v in times.items()}
    same = bool(np.array_equal(tokens["one call"], tokens["frame by frame"]))
    print(f"{args.model} model, {args.threads} threads: the default persona is {len(plan)} "
          f"prompt frames ({forced} forced), median of {args.repeats}:")
    for way, ms in p50.items():
        print(f"  {way:15} {ms:9.1f} ms")
    print(f"  one call is {p50['frame by frame'] / p50['one call']:.1f}x faster; the "
          f"conversation after is {'the same' if same else 'DIFFERENT'} (greedy, 100 frames)")
    orin = orin_projection(forced)
    print(f"7B on a Jetson AGX Orin, fp16, {forced} forced frames, from the bytes read: frame "
          f"by frame {orin['frame_by_frame_ms']:.0f} ms ({forced} x "
          f"{orin['weights_gb']:.1f} GB of Helium weights + {orin['kv_gb']:.2f} GB KV), one "
          f"call {orin['one_call_ms']:.0f} ms (read once; its {orin['one_call_gflop']:.0f} "
          "GFLOP are not in this floor)")
    if args.json:
        Path(args.json).write_text(json.dumps({"ms": p50, "same": same, "frames": len(plan),
                                               "orin": orin}, indent=2))


if __name__ == "__main__":
    main()
