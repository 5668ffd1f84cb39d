"""`personaplex-edge aec`: the live echo canceller over two recordings."""

from __future__ import annotations


def add_parser(sub) -> None:
    a = sub.add_parser("aec", help="the live echo canceller, offline: a microphone recording "
                                   "minus the echo of what was played")
    a.add_argument("--mic", required=True, help="what the microphone heard (any rate)")
    a.add_argument("--ref", required=True, help="what the speaker played, starting together "
                                                "with --mic (any rate)")
    a.add_argument("--output", required=True, help="the cleaned microphone (the mic's rate "
                                                   "and length)")
    a.add_argument("--delay-ms", type=float, default=None,
                   help="the echo's delay, if known (default: measured from the recordings)")
    a.set_defaults(func=run)


def run(args) -> int:
    """The --mic echo canceller over two recordings (runtime/audio_io/echo.py)."""
    from ..runtime.audio_io.echo import cancel_file

    print(cancel_file(args.mic, args.ref, args.output, args.delay_ms))
    return 0
