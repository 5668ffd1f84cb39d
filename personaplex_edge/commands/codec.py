"""`personaplex-edge codec`: a file through the Mimi encoder (codes) and back (audio)."""

from __future__ import annotations

import time

from ..errors import PersonaPlexError
from ..model_ref import resolve_model
from .common import MODEL_HELP, add_runtime_args, note


def add_parser(sub) -> None:
    c = sub.add_parser("codec", help="encode a file to Mimi codes and decode it back")
    c.add_argument("--model", required=True, help=MODEL_HELP)
    c.add_argument("--input", required=True, help="audio file (any rate, mono or stereo)")
    c.add_argument("--codes-out", help="write codes here as int64 .npy [frames, 8]")
    c.add_argument("--output", help="write the reconstruction here (24 kHz mono wav)")
    add_runtime_args(c)
    c.set_defaults(func=run)


def run(args) -> int:
    import numpy as np

    from ..audio import read_audio, save_array_atomic, write_audio
    from ..runtime.codec import Codec

    if args.codes_out is None and args.output is None:
        raise PersonaPlexError("nothing to write: give --codes-out and/or --output")
    codec = Codec.load(resolve_model(args.model, note), device=args.device,
                       threads=args.threads, progress=note)
    pcm = read_audio(args.input, codec.sample_rate)
    t0 = time.perf_counter()
    codes = codec.encode(pcm)
    t_enc = time.perf_counter() - t0
    frames = codes.shape[0]
    line = (f"{args.input}: {pcm.shape[0] / codec.sample_rate:.2f} s, {frames} frames; "
            f"encode {1000 * t_enc / frames:.1f} ms/frame")
    if args.output is not None:
        t0 = time.perf_counter()
        recon = codec.decode(codes)[:pcm.shape[0]]
        line += f", decode {1000 * (time.perf_counter() - t0) / frames:.1f} ms/frame"
        write_audio(args.output, recon, codec.sample_rate)
    if args.codes_out is not None:
        save_array_atomic(args.codes_out, codes.astype(np.int64))
    print(line)
    return 0
