"""The transcriber at Kyutai's real 1B size (stt-1b-en_fr's layout: d 2048, 16 layers, 32
codebooks, context 750, the 4 VAD heads; random weights) beside the benchmarks' mid LM with the
real-size Mimi, on this CPU:

    python benchmarks/bench_transcriber.py --precisions int8,int4 --frames 100 [--reference]

Per precision: the mid model exported in it, and a copy (hard links) with the 1B transcriber
added in the same precision (`export --transcriber`). Both run the same speech greedily, in
interleaved rounds; reported per frame (p50): the transcriber's step, the LM's (temporal +
depformer), the whole frame with and without transcription, and the bytes each step reads
(weights and KV ring). Word latency is the model's delay (0.5 s) plus what the runtime adds: a
frame's audio arriving (80 ms), the frame after a word's last piece that tells it is done
(80 ms) and the frame's compute. --reference times moshi's own LMGen step on the same 1B
weights (float32, torch on the same threads) for the ratio.

A real-size checkpoint is ~2 GB of bf16 and each export ~1 GB: everything is written under
--work and removed afterwards unless --keep.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mid_model import mid_config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STT_1B = {  # kyutai/stt-1b-en_fr-candle's config.json, as moshi reads it
    "card": 2048, "n_q": 32, "dep_q": 0, "delays": [0] * 33, "dim": 2048, "text_card": 8000,
    "existing_text_padding_id": 3, "num_heads": 16, "num_layers": 16, "hidden_scale": 4.125,
    "causal": True, "layer_scale": None, "context": 750, "max_period": 100000.0,
    "gating": "silu", "norm": "rms_norm_f32", "positional_embedding": "rope",
    "depformer_dim": 1024, "depformer_num_heads": 16, "depformer_num_layers": 6,
    "depformer_dim_feedforward": None, "depformer_multi_linear": True,
    "depformer_pos_emb": "none", "depformer_weights_per_step": True,
    "extra_heads_num_heads": 4, "extra_heads_dim": 6, "conditioners": {},
    "cross_attention": False, "lm_gen_config": {"temp": 0.0, "temp_text": 0.0},
    "stt_config": {"audio_delay_seconds": 0.5, "audio_silence_prefix_seconds": 0.0},
    "model_type": "stt", "mimi_name": "mimi-pytorch-e351c8d8@125.safetensors",
    "tokenizer_name": "tokenizer_en_fr_audio_8000.model"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build_checkpoints(work: Path) -> tuple[Path, Path]:
    """The mid PersonaPlex checkpoint and a 1B STT checkpoint sharing its Mimi file."""
    from personaplex_edge.export.hub import MIMI_FILE
    from personaplex_edge.export.random_lm import write_random_tensors
    from personaplex_edge.export.synthetic import train_tokenizer, write_synthetic_checkpoint
    from personaplex_edge.export.transcriber import expected_transcriber_tensors
    from personaplex_edge.transcriber import TranscriberConfig

    pp, stt = work / "personaplex", work / "stt-1b"
    if not (pp / "config.json").is_file():
        log(f"writing the mid checkpoint into {pp}")
        write_synthetic_checkpoint(mid_config(), pp)
    if not (stt / "config.json").is_file():
        stt.mkdir(parents=True, exist_ok=True)
        cfg = TranscriberConfig.from_kyutai(STT_1B, "bench")
        t0 = time.perf_counter()
        size = write_random_tensors(expected_transcriber_tensors(cfg), stt / "model.safetensors")
        log(f"wrote the 1B STT checkpoint ({size / 1e9:.2f} GB, {time.perf_counter() - t0:.0f} s)")
        shutil.copyfile(pp / MIMI_FILE, stt / STT_1B["mimi_name"])
        train_tokenizer(stt / STT_1B["tokenizer_name"])
        (stt / "config.json").write_text(json.dumps(STT_1B))
    return pp, stt


def build_models(pp: Path, stt: Path, work: Path, precision: str) -> tuple[Path, Path]:
    """(the mid model in `precision`, the same with the transcriber added)."""
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.transcriber import resolve_transcriber
    from personaplex_edge.export.transcriber_export import add_transcriber

    plain, heard = work / f"mid-{precision}", work / f"mid-{precision}-stt"
    if not (plain / "manifest.json").is_file():
        t0 = time.perf_counter()
        export_model(resolve_checkpoint(str(pp)), plain, precision=precision, verify="reduced",
                     progress=lambda s: None)
        log(f"exported {plain.name} ({time.perf_counter() - t0:.0f} s)")
    if not (heard / "manifest.json").is_file():
        shutil.rmtree(heard, ignore_errors=True)
        shutil.copytree(plain, heard, copy_function=os.link)
        t0 = time.perf_counter()
        add_transcriber(heard, resolve_transcriber(str(stt), log), precision=precision,
                        verify="reduced", progress=lambda s: None)
        log(f"added the 1B transcriber in {precision} ({time.perf_counter() - t0:.0f} s)")
    return plain, heard


def step_bytes(model_dir: Path) -> dict[str, int]:
    from frame_bytes import model_bytes_per_frame

    from personaplex_edge.contract import LM_GRAPHS, TRANSCRIBER_STEP
    from personaplex_edge.manifest import load_model_dir

    manifest = load_model_dir(model_dir)
    lm = model_bytes_per_frame(model_dir, manifest, LM_GRAPHS)
    out = {"lm_weights": sum(v for k, v in lm.items() if k != "kv"), "lm_kv": lm["kv"]}
    if TRANSCRIBER_STEP in manifest.graphs:
        stt = model_bytes_per_frame(model_dir, manifest, (TRANSCRIBER_STEP,))
        out.update(stt_weights=stt[TRANSCRIBER_STEP], stt_kv=stt["kv"])
    return out


def run_frames(model, speech: np.ndarray, frames: int) -> dict[str, list[float]]:
    """Per-stage ms of `frames` greedy frames of one conversation (after 5 warm-up frames)."""
    with model.conversation(persona=False, greedy=True) as conv:
        for i in range(5 + frames):
            conv.step(speech[(i % (speech.shape[0] // 1920)) * 1920:][:1920])
        table = conv.metrics.table()[5:]
        stages = conv.metrics.stages
    out = {s: table[:, i].tolist() for i, s in enumerate(stages)}
    out["frame"] = table[:, -1].tolist()
    return out


def reference_step_ms(stt: Path, threads: int, steps: int = 12) -> float:
    """moshi's LMGen.step on the 1B weights, float32 on the CPU (p50 after 2 warm-up steps)."""
    os.environ.setdefault("NO_TORCH_COMPILE", "1")
    import torch
    from moshi.models import LMGen, loaders

    torch.set_num_threads(threads)
    info = loaders.CheckpointInfo.from_hf_repo(
        str(stt), moshi_weights=stt / "model.safetensors",
        mimi_weights=stt / STT_1B["mimi_name"], tokenizer=stt / STT_1B["tokenizer_name"],
        config_path=stt / "config.json")
    lm = info.get_moshi(device="cpu", dtype=torch.float32)
    gen = LMGen(lm, temp=0, temp_text=0)
    ms = []
    with torch.no_grad(), gen.streaming(1):
        for i in range(steps + 2):
            codes = torch.randint(0, 2048, (1, 32, 1))
            t0 = time.perf_counter()
            gen.step_with_extra_heads(codes)
            ms.append(1000 * (time.perf_counter() - t0))
    del lm, gen
    return float(np.median(ms[2:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precisions", default="int8,int4")
    ap.add_argument("--frames", type=int, default=100, help="frames per round")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds per model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reference", action="store_true", help="also time moshi's step")
    ap.add_argument("--work", default="/tmp/personaplex_bench_transcriber")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints and exports")
    ap.add_argument("--json")
    args = ap.parse_args()

    import personaplex_edge as pe
    from bench_serve import speech as bundled

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    speech = bundled(8.0)
    results = {}
    try:
        pp, stt = build_checkpoints(work)
        for precision in args.precisions.split(","):
            plain_dir, heard_dir = build_models(pp, stt, work, precision)
            models = {"without": pe.load(plain_dir, device="cpu", threads=args.threads),
                      "with": pe.load(heard_dir, device="cpu", threads=args.threads)}
            runs = {name: {} for name in models}
            for _ in range(args.rounds):
                for name, model in models.items():
                    for stage, ms in run_frames(model, speech, args.frames).items():
                        runs[name].setdefault(stage, []).extend(ms)
            for model in models.values():
                model.close()
            p50 = {name: {s: float(np.median(v)) for s, v in r.items()}
                   for name, r in runs.items()}
            results[precision] = {"p50_ms": p50, "bytes": step_bytes(heard_dir)}
            log(f"{precision}: transcribe {p50['with']['transcribe']:.1f} ms, frame "
                f"{p50['without']['frame']:.1f} -> {p50['with']['frame']:.1f} ms")
        if args.reference:
            results["reference_step_ms"] = reference_step_ms(stt, args.threads)
            log(f"moshi's step: {results['reference_step_ms']:.1f} ms")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"| precision | STT step ms | STT MB read/frame (weights + KV) | LM step ms "
          f"(mid) | frame ms without | frame ms with | word latency ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for precision, r in results.items():
        if precision == "reference_step_ms":
            continue
        w, wo, b = r["p50_ms"]["with"], r["p50_ms"]["without"], r["bytes"]
        lm = wo["temporal"] + wo["depformer"]
        latency = 500 + 80 + 80 + w["frame"]
        print(f"| {precision} | {w['transcribe']:.1f} | {b['stt_weights'] / 1e6:.0f} + "
              f"{b['stt_kv'] / 1e6:.0f} | {lm:.1f} | {wo['frame']:.1f} | {w['frame']:.1f} | "
              f"{latency:.0f} |")
    if "reference_step_ms" in results:
        print(f"\nmoshi's LMGen step, same 1B weights, float32: "
              f"{results['reference_step_ms']:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
