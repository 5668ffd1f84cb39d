"""The LM per frame: this project's Helium + depformer graphs in onnxruntime vs moshi's LMGen step,
on the same weights (random, stored bf16, run in float32), on N threads, greedy.

    python benchmarks/bench_lm.py [--frames 100] [--threads 2] [--work DIR] [--json out.json]

Default model: a mid config that is memory-bandwidth bound on a CPU: Helium d 1024, 8 layers,
16 heads, MLP 2816, the real context (3000), and the real depformer (1024, 6 layers, 8 active
steps). Prints ms/frame per stage (temporal, depformer) for both, the speed-up, and the fraction
of the memory-bandwidth floor reached: bytes of weights and KV read per frame divided by the
machine's copy bandwidth (numpy, counted as read + write, like STREAM's copy).

Ours is the runtime's own LM frame (runtime/lm_frame.HostLM over the onnxruntime backend,
driven by benchmarks/lm_probe): every graph input and output bound once to numpy buffers (the
KV ring included), the step's new K/V rows written into the ring in place, so nothing the size
of the cache is copied per frame. Both sides are greedy, so their tokens must agree; the script
checks that too. The checkpoint and model directory are kept in --work for reruns
(benchmarks/models.py).
Needs the dev extra and moshi (see .ci/run).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
os.environ.setdefault("NO_TORCH_COMPILE", "1")


def stats(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"mean": float(a.mean()), "p50": float(np.median(a)),
            "p90": float(np.percentile(a, 90))}


def load_reference(cfg, ckpt: Path):
    """moshi's LMModel holding the checkpoint's weights (built without random init)."""
    import torch
    from moshi.models.lm import LMModel
    from moshi_lm_reference import moshi_lm_kwargs
    from safetensors.torch import load_file

    with torch.device("meta"):
        model = LMModel(**moshi_lm_kwargs(cfg), dtype=torch.float32)
    state = {k: v.float() for k, v in load_file(str(ckpt)).items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def run_ours(model_dir: Path, user: np.ndarray, threads: int, warmup: int):
    """The runtime's own LM frame (lm_frame.HostLM over OrtGraphs, the KV rings written in
    place), driven greedily by lm_probe -> (temporal ms, depformer ms, tokens [frames, 9])."""
    from lm_probe import GreedyLM

    lm = GreedyLM(model_dir, device="cpu", threads=threads)
    run = lm.run(user)
    lm.close()
    return list(run.temporal_ms[warmup:]), list(run.depformer_ms[warmup:]), run.tokens


def run_reference(model, user: np.ndarray, warmup: int, active: int):
    import torch
    from moshi.models.lm import LMGen

    model.dep_q = active  # the agent-only schedule (see tests/moshi_lm_reference.py)
    gen = LMGen(model, use_sampling=False)
    temporal, depth, tokens = [], [], []
    times: dict[str, float] = {}
    rec: dict[str, object] = {}

    def timed(fn, key):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            out = fn(*a, **k)
            times[key] = 1000 * (time.perf_counter() - t0)
            return out
        return wrapper

    with torch.no_grad(), gen.streaming(1):
        state = gen._streaming_state
        state.graphed_main = timed(state.graphed_main, "temporal")
        state.graphed_depth = timed(state.graphed_depth, "depth")
        gen.on_text_hook = lambda x: rec.__setitem__("text", int(x[0]))
        gen.on_audio_hook = lambda x: rec.__setitem__("audio", x[0].tolist())
        for t, codes in enumerate(user):
            gen.step(torch.from_numpy(codes)[None, :, None])
            tokens.append([rec["text"], *rec["audio"]])
            if t >= warmup:
                temporal.append(times["temporal"])
                depth.append(times["depth"])
    return temporal, depth, np.array(tokens)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/personaplex_bench_lm")
    ap.add_argument("--config", choices=("mid", "tiny"), default="mid",
                    help="tiny: the test preset, a quick smoke run of this script")
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import torch

    torch.set_num_threads(args.threads)
    from models import checkpoint, exported

    from personaplex_edge.export.hub import LM_FILE
    from personaplex_edge.manifest import load_model_dir

    work = Path(args.work)
    model_dir = exported(args.config, work)
    ckpt = checkpoint(args.config, work) / LM_FILE
    manifest = load_model_dir(model_dir)
    cfg = manifest.config
    gc.collect()
    n = args.frames + args.warmup
    user = np.random.default_rng(0).integers(0, cfg.audio_vocab_size, (n, 8)).astype(np.int64)

    from frame_bytes import copy_bandwidth

    bandwidth = copy_bandwidth(args.threads)
    o_tmp, o_dep, o_tok = run_ours(model_dir, user, args.threads, args.warmup)
    gc.collect()
    model = load_reference(cfg, ckpt)
    r_tmp, r_dep, r_tok = run_reference(model, user, args.warmup,
                                        cfg.depformer_config.num_active_codebooks)
    del model
    gc.collect()

    # every weight read once, embedding tables excepted (a few rows), plus the whole KV ring
    from frame_bytes import model_bytes_per_frame

    counted = model_bytes_per_frame(model_dir, manifest)
    h_bytes = counted["helium_step"] + counted["kv"]
    d_bytes = counted["depformer_step"]
    rows = {"temporal": (o_tmp, r_tmp, h_bytes), "depformer": (o_dep, r_dep, d_bytes),
            "total": ([a + b for a, b in zip(o_tmp, o_dep)],
                      [a + b for a, b in zip(r_tmp, r_dep)], h_bytes + d_bytes)}
    h = cfg.temporal_config
    print(f"\nLM per 80 ms frame, {args.frames} frames after {args.warmup} warm-up, "
          f"{args.threads} threads, float32 (weights stored bf16)")
    print(f"model: Helium d {h.hidden_size}, {h.num_hidden_layers} layers, context "
          f"{h.max_position_embeddings}; depformer d {cfg.depformer_config.hidden_size}, "
          f"{cfg.depformer_config.num_hidden_layers} layers, "
          f"{cfg.depformer_config.num_active_codebooks} steps")
    print(f"copy bandwidth (numpy, read+write, {args.threads} threads): {bandwidth / 1e9:.1f} GB/s")
    print(f"{'stage':<10} {'MB/frame':>9} {'floor ms':>9} {'ours ms':>9} {'p90':>7} "
          f"{'ref ms':>9} {'p90':>7} {'speed-up':>9} {'of floor':>9}")
    result = {"bandwidth_GBps": bandwidth / 1e9, "stages": {}}
    for name, (ours, ref, nbytes) in rows.items():
        so, sr = stats(ours), stats(ref)
        floor = 1000 * nbytes / bandwidth
        print(f"{name:<10} {nbytes / 1e6:>9.0f} {floor:>9.1f} {so['mean']:>9.1f} {so['p90']:>7.1f} "
              f"{sr['mean']:>9.1f} {sr['p90']:>7.1f} {sr['mean'] / so['mean']:>8.2f}x "
              f"{floor / so['mean']:>8.0%}")
        result["stages"][name] = {"ours_ms": so, "reference_ms": sr, "bytes": nbytes,
                                  "floor_ms": floor, "speedup": sr["mean"] / so["mean"],
                                  "fraction_of_floor": floor / so["mean"]}
    same = np.array_equal(o_tok, r_tok)
    first_diff = None if same else int(np.argmax((o_tok != r_tok).any(axis=1)))
    print(f"greedy tokens identical to the reference over {n} frames: {same}"
          + ("" if same else f" (first difference at frame {first_diff})"))
    result["tokens_identical"] = same
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
