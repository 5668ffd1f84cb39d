"""What `batch` buys over `run` one file at a time, in one run on this machine:

    python benchmarks/bench_batch.py --model mid --items 16 --batch 8      # the issue's run
    python benchmarks/bench_batch.py --model demo --items 16 --batch 4
    python benchmarks/bench_batch.py --paper                                # the 7B, on paper
    python benchmarks/bench_batch.py --model demo --batch1-ways             # batch-1: how

Items: `--items` recordings of 10-30 s (the bundled speech, looped from different offsets;
lengths drawn from a seeded generator), written once under --work. Two passes over them,
each timed: `run`'s path (the API's `respond`, one item after another, on the batch-1
export) and `batch` (runtime/batch's runner on the batch-B export of the same weights, B
items in lockstep). Each reports hours of audio answered per hour, and the ratio. The mid
model is the benchmarks' Helium d 1024 x 8 layers at the 7B's context with the real depformer
(and the tests' tiny Mimi: the LM is what batching changes).

--paper: one pass of Full-Duplex-Bench v1.5 (about 1,000 sessions) for PersonaPlex-7B, from
the bytes each lockstep tick reads (weights once, every row's KV ring) over a device's memory
bandwidth: on one H200 (fp16, at the 1939 GB/s a CUDA-graph 7B step reached on an H200 in this
project's GPU check) and on a Jetson AGX Orin (int4 weights, fp16 KV, at 70% of its 204.8
GB/s). A floor: Mimi and the host are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

FDB_V15_SESSIONS = 1000
SESSION_SECONDS = 30.0  # an assumed mean length of a v1.5 session (its clips are short)


def make_items(work: Path, count: int, low: float, high: float) -> list[Path]:
    from personaplex_edge.audio import read_audio, write_audio
    from personaplex_edge.runtime.bench import bundled_speech

    speech = read_audio(bundled_speech())
    rng = np.random.default_rng(0)
    folder = work / f"items-{count}-{low:g}-{high:g}"
    paths = []
    for k in range(count):
        path = folder / f"item{k:02d}.wav"
        paths.append(path)
        if path.is_file():
            continue
        samples = int(rng.uniform(low, high) * 24000)
        start = int(rng.integers(0, speech.shape[0]))
        looped = np.tile(speech, -(-(start + samples) // speech.shape[0]) + 1)
        write_audio(path, looped[start:start + samples])
    return paths


def run_path(model_dir: Path, paths: list[Path], threads: int) -> float:
    """`run` on each item in turn (its path: a conversation per file, respond): seconds."""
    import personaplex_edge as pe

    with pe.load(model_dir, device="cpu", threads=threads) as model:
        t0 = time.perf_counter()
        for k, path in enumerate(paths):
            with model.conversation(seed=k) as conv:
                conv.respond(pe.read_audio(path))
        return time.perf_counter() - t0


def batch_path(model_dir: Path, paths: list[Path], out: Path, threads: int) -> float:
    """`batch` over the items, B at a time in lockstep: seconds."""
    import io

    from personaplex_edge.runtime.api import load
    from personaplex_edge.runtime.batch import BatchProgress, find_items, run_batch
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.sampling import SamplingParams

    layout = find_items(paths[0].parent, out)
    with load(model_dir, device="cpu", threads=threads) as model:
        t0 = time.perf_counter()
        summary = run_batch(model, layout.items, SamplingParams(seed=0), Persona(),
                            overwrite=True, progress=BatchProgress(len(paths), 0.0,
                                                                   io.StringIO()))
        seconds = time.perf_counter() - t0
    report = summary.to_json()
    assert report["counts"]["done"] == len(paths), report["counts"]
    print(f"  batch: {report['ticks']} ticks, rows busy {100 * report['rows_busy']:.1f}%")
    return seconds


def batch1_ways(model_dir: Path, paths: list[Path], threads: int) -> dict[str, float]:
    """On a batch-1 model, two ways to answer the items (seconds): one at a time with
    onnxruntime on `threads` cores, or `threads` at a time, a Python thread each with
    onnxruntime on one core (its sessions are shared; each conversation has its buffers)."""
    from concurrent.futures import ThreadPoolExecutor

    import personaplex_edge as pe

    def answer(model, k, path):
        with model.conversation(seed=k) as conv:
            conv.respond(pe.read_audio(path))

    out = {}
    with pe.load(model_dir, device="cpu", threads=threads) as model:
        t0 = time.perf_counter()
        for k, path in enumerate(paths):
            answer(model, k, path)
        out["one at a time"] = time.perf_counter() - t0
    with pe.load(model_dir, device="cpu", threads=1) as model:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda kp: answer(model, *kp), enumerate(paths)))
        out[f"{threads} at a time, a thread each"] = time.perf_counter() - t0
    return out


def paper() -> list[str]:
    from frame_bytes import estimate_bytes_per_frame, layout_for

    from personaplex_edge.config import PersonaPlexConfig
    from personaplex_edge.export.precision import plan_for

    cfg = PersonaPlexConfig()
    audio_h = FDB_V15_SESSIONS * SESSION_SECONDS / 3600
    rows = ["| device, precision | batch | GB held and read per tick (weights + KV rings) | ms "
            "per tick | sessions' audio per hour | one pass of v1.5 |", "|" + " --- |" * 6]
    # (device, plan, GB/s reached, GB of memory for the model: an Orin shares its 64 GB)
    for device, plan, gb_s, memory in (("H200, fp16", plan_for("fp16"), 1939.0, 141.0),
                                       ("Jetson AGX Orin, int4 + fp16 KV",
                                        plan_for("int4", "tensorrt"), 0.7 * 204.8, 48.0)):
        b = estimate_bytes_per_frame(cfg, layout_for(plan))
        for batch in (1, 8, 16, 32):
            tick = b["weights"] + batch * b["kv"]  # weights once, each row's whole ring
            if tick / 1e9 > memory:
                continue  # the rows' KV rings do not fit beside the weights
            ms = 1000 * tick / (gb_s * 1e9)
            per_hour = batch * 80.0 / ms  # hours of audio per hour
            rows.append(f"| {device} | {batch} | {tick / 1e9:.1f} | {ms:.1f} | "
                        f"{per_hour:.1f} h | {audio_h / per_hour * 60:.0f} min |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mid", choices=("demo", "mid"))
    ap.add_argument("--items", type=int, default=16)
    ap.add_argument("--min-s", type=float, default=10.0)
    ap.add_argument("--max-s", type=float, default=30.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/personaplex_bench_models")
    ap.add_argument("--paper", action="store_true")
    ap.add_argument("--batch1-ways", action="store_true",
                    help="on the batch-1 export: one item at a time against a thread per item")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.paper:
        print(f"Full-Duplex-Bench v1.5: {FDB_V15_SESSIONS} sessions x {SESSION_SECONDS:.0f} s "
              f"(assumed) = {FDB_V15_SESSIONS * SESSION_SECONDS / 3600:.1f} h of audio")
        print("\n".join(paper()))
        return
    from models import exported

    work = Path(args.work)
    paths = make_items(work, args.items, args.min_s, args.max_s)
    from personaplex_edge.audio import read_audio

    audio_h = sum(read_audio(p).shape[0] for p in paths) / 24000 / 3600
    if args.batch1_ways:
        ways = batch1_ways(exported(args.model, work, 1), paths, args.threads)
        for way, seconds in ways.items():
            print(f"{args.model}, batch-1 export, {way:28s} {seconds:8.1f} s  "
                  f"{audio_h / (seconds / 3600):6.2f} h of audio per hour")
        return
    one, many = exported(args.model, work, 1), exported(args.model, work, args.batch)
    t_run = run_path(one, paths, args.threads)
    t_batch = batch_path(many, paths, work / f"answers-{args.model}-b{args.batch}",
                         args.threads)
    rate_run, rate_batch = audio_h / (t_run / 3600), audio_h / (t_batch / 3600)
    print(f"{args.model}: {args.items} items, {audio_h * 3600:.0f} s of audio")
    print(f"  run, one item after another (batch-1 export)   {t_run:8.1f} s  "
          f"{rate_run:6.2f} h of audio per hour")
    print(f"  batch, {args.batch} in lockstep (batch-{args.batch} export)        "
          f"{t_batch:8.1f} s  {rate_batch:6.2f} h of audio per hour")
    print(f"  batch / run                                     {rate_batch / rate_run:8.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"model": args.model, "items": args.items, "audio_s": audio_h * 3600,
             "batch": args.batch, "run_s": t_run, "batch_s": t_batch}, indent=2))


if __name__ == "__main__":
    main()
