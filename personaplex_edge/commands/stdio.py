"""`personaplex-edge stdio`: one conversation over stdin/stdout (runtime/stdio.py)."""

from __future__ import annotations

from ..errors import PersonaPlexError
from .common import add_conversation_args, conversation, note


def add_parser(sub) -> None:
    o = sub.add_parser("stdio", help="one conversation over stdin/stdout: framed PCM16 in, "
                                     "PCM16 and text out (for apps in any language)")
    add_conversation_args(o)
    o.add_argument("--max-backlog-frames", type=int, default=None,
                   help="live audio: drop the oldest input frames when more than this many "
                        "wait (default: lossless, the pipe holds the writer back)")
    o.set_defaults(func=run)


def run(args) -> int:
    """One conversation over stdin/stdout in framed messages (runtime/stdio.py)."""
    from ..runtime.stdio import serve_stdio

    if args.max_backlog_frames is not None and args.max_backlog_frames < 0:
        raise PersonaPlexError("--max-backlog-frames must be 0 or more")
    return serve_stdio(lambda: conversation(args, progress=note)[1],
                       args.max_backlog_frames, progress=note)
