"""`personaplex-edge batch`: many recordings offline, unpaced and in lockstep
(runtime/batch)."""

from __future__ import annotations

import os
import sys

from ..errors import PersonaPlexError
from ..model_ref import resolve_model
from .common import add_conversation_args, load_model, note, sampling


def add_parser(sub) -> None:
    t = sub.add_parser("batch", help="many recordings offline, unpaced and in lockstep: a "
                                     "Full-Duplex-Bench tree, a folder or a JSONL manifest")
    add_conversation_args(t)
    t.add_argument("--input", required=True,
                   help="a Full-Duplex-Bench tree (*/input.wav), a folder of audio files, or "
                        "a .jsonl manifest (input, output, text_prompt, voice_prompt, seed)")
    t.add_argument("--output", help="where the answers go (default: beside each input in a "
                                    "Full-Duplex-Bench tree; needed for a folder)")
    t.add_argument("--shard", help="K/N: this machine's part of the sorted items (every N-th "
                                   "from the K-th), e.g. a job array's index")
    t.add_argument("--overwrite", action="store_true",
                   help="answer items again whose outputs are there (default: skip them)")
    t.add_argument("--codes", action="store_true",
                   help="also keep each answer's agent codes and text tokens (NAME.codes.npz: "
                        "personaplex-edge decode turns them into the same audio)")
    t.add_argument("--rows", type=int, default=None,
                   help="items stepped together (default: the model's --batch)")
    t.add_argument("--workers", type=int, default=None,
                   help="threads, each stepping its own rows (default: one per core for a "
                        "batch-1 model on the CPU, each session call on one thread; else 1)")
    t.set_defaults(func=run)


def run(args) -> int:
    """Many recordings, unpaced, in lockstep (runtime/batch): the answers beside them or under
    --output, a summary, exit 1 when any item failed."""
    import time

    from ..runtime.batch import find_items, parse_shard, run_batch, shard
    from ..runtime.persona import Persona

    k, n = parse_shard(args.shard)  # before the model loads: a bad flag fails fast
    layout = find_items(args.input, args.output)
    items = shard(layout.items, k, n)
    if args.rows is not None and args.rows < 1:
        raise PersonaPlexError("--rows must be at least 1")
    if args.workers is not None and args.workers < 1:
        raise PersonaPlexError("--workers must be at least 1")
    # the model's batch and backend decide the default, before anything is loaded: on a
    # batch-1 model on the CPU a worker per core, each session call on one thread, beats one
    # item at a time on every core (README, Measured: Batch - 1.4-1.5x on the demo model,
    # 1.07x on the mid one)
    from ..manifest import load_model_dir
    from ..runtime.backends import cpu_only

    args.model = str(resolve_model(args.model, note))  # a hub id is fetched once
    manifest = load_model_dir(args.model, need="lm", progress=note)
    cores = os.cpu_count() or 1
    workers = args.workers or 1
    if args.workers is None and cores > 1 and manifest.batch == 1 \
            and cpu_only(manifest, args.device):
        workers = cores
        if args.threads is None:
            args.threads = 1
    model = load_model(args, note)
    model.text  # every item's prompt and text need it: a model without one stops here
    note(f"{layout.kind}: {len(items)} of {len(layout.items)} items (shard {k}/{n}), "
          f"{args.rows or model.batch} at a time"
          + (f" by each of {workers} workers" if workers > 1 else "")
          + f" on {model.model_dir}")
    summary = run_batch(model, items, sampling(args),
                        Persona(text_prompt=args.text_prompt, voice=args.voice_prompt,
                                enabled=not args.no_persona),
                        overwrite=args.overwrite, codes=args.codes, rows=args.rows,
                        workers=workers)
    summary.extra = {"model": str(model.model_dir), "input": str(args.input),
                     "layout": layout.kind, "shard": f"{k}/{n}",
                     "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "flags": {"greedy": args.greedy, "seed": args.seed, "temp": args.temp,
                               "temp_text": args.temp_text, "top_k": args.top_k,
                               "top_k_text": args.top_k_text}}
    name = "batch-summary.json" if n == 1 else f"batch-summary-{k}-of-{n}.json"
    summary.write(layout.summary_dir / name)
    counts = summary.to_json()["counts"]
    print(f"{counts['done']} done, {counts['skipped']} skipped (finished before), "
          f"{counts['failed']} failed, {counts['interrupted']} interrupted; "
          f"{summary.audio_seconds / 3600:.3f} h of audio in {summary.wall_seconds:.1f} s "
          f"({summary.to_json()['times_real_time']:.1f}x real time); summary: "
          f"{layout.summary_dir / name}")
    if summary.interrupted:
        raise KeyboardInterrupt
    if counts["failed"]:
        print(f"personaplex-edge: {counts['failed']} item(s) failed (listed above and in the "
              "summary)", file=sys.stderr)
        return 1
    return 0
