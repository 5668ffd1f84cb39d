"""Real-size Mimi codec: this project's ONNX graphs in onnxruntime vs the reference's streaming
Mimi (moshi, torch), on the same random weights and the same audio, on N threads.

    python benchmarks/bench_codec.py [--frames 200] [--threads 2] [--json out.json]

Prints median / p99 ms per 80 ms frame for encode and decode, and the speed-up ratio.
Needs the dev extra and moshi (see .ci/run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def stats(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"p50": float(np.median(a)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import torch

    torch.set_num_threads(args.threads)
    from moshi_reference import reference_mimi, save_published

    from personaplex_edge.config import PersonaPlexConfig
    from personaplex_edge.export.hub import MIMI_FILE, resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.runtime.codec import Codec

    cfg = PersonaPlexConfig()
    n = args.frames + args.warmup
    rng = np.random.default_rng(0)
    pcm = (rng.standard_normal(n * cfg.mimi_config.samples_per_frame) * 0.1).astype(np.float32)
    frame = cfg.mimi_config.samples_per_frame
    with tempfile.TemporaryDirectory() as tmp:
        ref = reference_mimi(cfg.mimi_config)
        ckpt = Path(tmp) / "ckpt"
        ckpt.mkdir()
        save_published(ref, ckpt / MIMI_FILE)
        export_model(resolve_checkpoint(str(ckpt), with_lm=False), Path(tmp) / "model",
                     progress=lambda s: None)

        # reference: moshi streaming encode, then decode of its codes
        ref_enc, ref_dec, ref_codes = [], [], []
        with torch.no_grad(), ref.streaming(1):
            for i in range(n):
                x = torch.from_numpy(pcm[i * frame:(i + 1) * frame])[None, None]
                t0 = time.perf_counter()
                ref_codes.append(ref.encode(x))
                ref_enc.append(1000 * (time.perf_counter() - t0))
        with torch.no_grad(), ref.streaming(1):
            for i in range(n):
                t0 = time.perf_counter()
                ref.decode(ref_codes[i])
                ref_dec.append(1000 * (time.perf_counter() - t0))

        codec = Codec.load(Path(tmp) / "model", device="cpu", threads=args.threads)
        enc, dec, codes = [], [], []
        for i in range(n):  # interleaved, as in a conversation
            t0 = time.perf_counter()
            codes.append(codec.encode_frame(pcm[i * frame:(i + 1) * frame]).copy())
            t1 = time.perf_counter()
            codec.decode_frame(ref_codes[i][0, :, 0].numpy())
            enc.append(1000 * (t1 - t0))
            dec.append(1000 * (time.perf_counter() - t1))
        same = all(np.array_equal(c, r[0, :, 0].numpy()) for c, r in zip(codes, ref_codes))

    w = args.warmup
    result = {"frames": args.frames, "threads": args.threads, "codes_match_reference": same,
              "ours": {"encode": stats(enc[w:]), "decode": stats(dec[w:])},
              "reference": {"encode": stats(ref_enc[w:]), "decode": stats(ref_dec[w:])}}
    o, r = result["ours"], result["reference"]
    print(f"real-size Mimi, {args.frames} frames, {args.threads} threads "
          f"(codes identical to the reference: {same})")
    print(f"{'':10}{'ours p50':>10}{'p99':>8}{'ref p50':>10}{'p99':>8}{'ratio':>8}")
    for stage in ("encode", "decode"):
        print(f"{stage:10}{o[stage]['p50']:10.1f}{o[stage]['p99']:8.1f}"
              f"{r[stage]['p50']:10.1f}{r[stage]['p99']:8.1f}"
              f"{r[stage]['p50'] / o[stage]['p50']:7.2f}x")
    total_o = o["encode"]["p50"] + o["decode"]["p50"]
    total_r = r["encode"]["p50"] + r["decode"]["p50"]
    print(f"{'total':10}{total_o:10.1f}{'':8}{total_r:10.1f}{'':8}{total_r / total_o:7.2f}x"
          f"   (budget 80 ms per frame)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
