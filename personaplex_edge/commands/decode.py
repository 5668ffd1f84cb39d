"""`personaplex-edge decode`: a codes file of `batch --codes` into its audio."""

from __future__ import annotations

from ..model_ref import resolve_model
from .common import add_runtime_args, note


def add_parser(sub) -> None:
    k = sub.add_parser("decode", help="a codes file of batch --codes -> its audio (code2wav)")
    k.add_argument("--model", required=True, help="the model directory that wrote the codes")
    k.add_argument("--codes", required=True, help="NAME.codes.npz")
    k.add_argument("--output", required=True, help="the audio (24 kHz wav)")
    add_runtime_args(k)
    k.set_defaults(func=run)


def run(args) -> int:
    """A codes file of batch --codes -> the audio the batch wrote (Mimi decoder alone)."""
    from ..audio import write_audio
    from ..runtime.batch import AgentCodes
    from ..runtime.codec import Codec

    codes = AgentCodes.load(args.codes)  # before the model loads
    codec = Codec.load(resolve_model(args.model, note), device=args.device,
                       threads=args.threads, progress=note)
    write_audio(args.output, codes.to_audio(codec), codec.sample_rate)
    print(f"{args.codes}: {codes.codes.shape[0]} frames -> {args.output} "
          f"({codes.samples / codes.sample_rate:.2f} s)")
    return 0
