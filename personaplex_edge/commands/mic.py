"""`personaplex-edge mic` (or `--mic`): full duplex on the sound devices."""

from __future__ import annotations

import sys

from .common import add_backlog_arg, add_conversation_args, conversation, note
from .live import LiveStatus, live_summary


def add_parser(sub) -> None:
    m = sub.add_parser("mic", help="talk with the model through the microphone and speaker "
                                   "(also: personaplex-edge --mic)")
    add_conversation_args(m, model_default="models/personaplex-7b-v1")
    m.add_argument("--input-device", help="index or part of the name (see 'devices')")
    m.add_argument("--output-device", help="index or part of the name (see 'devices')")
    m.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    add_backlog_arg(m)
    m.add_argument("--aec", choices=["on", "off"], default="on",
                   help="cancel the speaker's echo from the microphone (on, for open speakers; "
                        "off for a headset)")
    m.set_defaults(func=run)


def run(args) -> int:
    """Full duplex on the sound devices until Ctrl-C (or --duration seconds)."""
    model, conv = conversation(args, progress=note)
    if conv.transcribing:  # what the user said, turn by turn (docs/heard.md)
        def heard(event):
            if event.kind == "turn":
                print(f"\n[heard: {event.text}]", flush=True)
        conv.on_heard = heard
    print("listening; Ctrl-C to stop", file=sys.stderr)
    loop = conv.live(on_text=lambda piece: print(piece, end="", flush=True),
                     input_device=args.input_device, output_device=args.output_device,
                     duration=args.duration, on_tick=LiveStatus(),
                     max_backlog_frames=args.max_backlog_frames, aec=args.aec == "on",
                     progress=note)
    live_summary(loop, conv)
    return 0
