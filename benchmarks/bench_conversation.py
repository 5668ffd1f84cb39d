"""A whole conversation frame, side by side: this project's runtime `Conversation.step` (the
four ONNX graphs in onnxruntime, torch-free) vs moshi's own streaming pipeline (Mimi encode ->
LMGen step -> Mimi decode, torch), on the same random weights and the same audio, greedy, on
N threads.

    python benchmarks/bench_conversation.py [--frames 100] [--threads 2] [--config mid|tiny]
                                            [--work DIR] [--json out.json]

Model: the real-size Mimi and, by default, the mid LM of bench_lm.py (Helium d 1024 x 8 layers,
context 3000, the real depformer). The checkpoint is written from the seeded reference models in
the published layout and exported with `export_model`, exactly as a user's export; the model
directory is kept in --work for reruns. The two pipelines step alternately, frame by frame, so
whatever else the machine does falls on both alike. Prints p50 ms per stage (encode, LM, decode,
frame), the speed-up of each, and how many emitted frames (text + 8 agent codes) are identical.
Needs the dev extra and moshi (see .ci/run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
os.environ.setdefault("NO_TORCH_COMPILE", "1")



def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def config(name: str):
    from mid_model import mid_config

    from personaplex_edge.config import preset

    return preset("tiny") if name == "tiny" else mid_config()


def build(cfg, work: Path, mimi, lm) -> Path:
    """The exported model directory for the reference models' weights, unless `work` has it."""
    from moshi_lm_reference import save_published_lm
    from moshi_reference import save_published

    from personaplex_edge.export.hub import (CONFIG_FILE, LM_FILE, MIMI_FILE, TOKENIZER_FILE,
                                             resolve_checkpoint)
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import train_tokenizer

    out = work / "model"
    if (out / "manifest.json").is_file():
        return out
    t0 = time.perf_counter()
    ckpt = work / "checkpoint"
    ckpt.mkdir(parents=True, exist_ok=True)
    save_published(mimi, ckpt / MIMI_FILE)
    save_published_lm(lm, ckpt / LM_FILE)
    train_tokenizer(ckpt / TOKENIZER_FILE)
    (ckpt / CONFIG_FILE).write_text(json.dumps({"model_type": "personaplex", **cfg.to_dict()}))
    export_model(resolve_checkpoint(str(ckpt)), out, progress=log)
    log(f"checkpoint written and exported ({time.perf_counter() - t0:.0f} s)")
    return out


def speech(frames: int, frame: int, seed: int = 0) -> np.ndarray:
    """Noise with a slow loudness envelope: the encoder's codes vary as with speech."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames * frame) / 24000
    return (rng.standard_normal(t.shape) * (0.05 + 0.25 * np.abs(np.sin(2.1 * t)))).astype(
        np.float32)


def p50(values) -> float:
    return float(np.median(np.asarray(values)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--config", choices=("mid", "tiny"), default="mid")
    ap.add_argument("--work", default="/tmp/personaplex_bench_conversation")
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import torch
    from moshi_lm_reference import reference_lm
    from moshi_pipeline import ReferencePipeline
    from moshi_reference import reference_mimi

    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.sampling import SamplingParams

    torch.set_num_threads(args.threads)
    cfg = config(args.config)
    work = Path(args.work) / args.config
    t0 = time.perf_counter()
    mimi, lm = reference_mimi(cfg.mimi_config, seed=0), reference_lm(cfg, seed=0)
    log(f"reference models built ({time.perf_counter() - t0:.0f} s)")
    model_dir = build(cfg, work, mimi, lm)

    frame = cfg.mimi_config.samples_per_frame
    n = args.frames + args.warmup
    pcm = speech(n, frame)
    session = Model.load(model_dir, device="cpu", threads=args.threads).open_conversation(
        SamplingParams(greedy=True), Persona(enabled=False))
    ours_frame, ref_frame, same, emitted = [], [], 0, 0
    with ReferencePipeline(mimi, lm, timed=True) as ref:
        for i in range(n):
            chunk = pcm[i * frame:(i + 1) * frame]
            for who in ((0, 1) if i % 2 else (1, 0)):  # alternate who goes first
                t = time.perf_counter()
                if who == 0:
                    tokens, _ = ref.step(chunk)
                    ref_frame.append(1000 * (time.perf_counter() - t))
                else:
                    session.step(chunk)
                    ours_frame.append(1000 * (time.perf_counter() - t))
            if tokens is not None and i >= args.warmup:
                emitted += 1
                mine = session.last_frame
                same += mine is not None and bool(np.array_equal(mine, tokens))
    w = args.warmup
    table = session.metrics.table()[w:]  # [frames, stages + frame] ms
    col = {s: table[:, k] for k, s in enumerate(session.metrics.stages)}
    ours = {"encode": p50(col["encode"]),
            "lm": p50(col["temporal"] + col["depformer"] + col["host"]),
            "decode": p50(col["decode"]),
            "frame": p50(ours_frame[w:])}
    r = ref.times  # decode has one entry fewer: the first frame emits nothing
    reference = {"encode": p50(r["encode"][w:]), "lm": p50(r["lm"][w:]),
                 "decode": p50(r["decode"][max(w - 1, 0):]), "frame": p50(ref_frame[w:])}
    h = cfg.temporal_config
    print(f"\nconversation frame, {args.frames} frames after {w} warm-up, {args.threads} "
          f"threads, greedy; Mimi d {cfg.mimi_config.hidden_size}, Helium d {h.hidden_size} x "
          f"{h.num_hidden_layers} layers (context {h.max_position_embeddings}), depformer d "
          f"{cfg.depformer_config.hidden_size} x {cfg.depformer_config.num_hidden_layers}")
    print(f"{'ms p50':10}{'ours':>9}{'reference':>11}{'speed-up':>10}")
    for stage in ("encode", "lm", "decode", "frame"):
        print(f"{stage:10}{ours[stage]:9.1f}{reference[stage]:11.1f}"
              f"{reference[stage] / ours[stage]:9.2f}x")
    print(f"emitted frames identical to the reference: {same} / {emitted}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"ours": ours, "reference": reference, "identical": same, "emitted": emitted,
             "frames": args.frames, "threads": args.threads, "config": args.config}, indent=2))


if __name__ == "__main__":
    main()
