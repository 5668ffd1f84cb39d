"""`personaplex-edge run`: a recording in, the model's answer out (its length), text per
frame; --say words for the model, --realtime through the live loop."""

from __future__ import annotations

import argparse
import sys

from ..errors import PersonaPlexError
from .common import add_backlog_arg, add_conversation_args, conversation
from .live import LiveStatus, live_summary


def add_parser(sub) -> None:
    r = sub.add_parser("run", help="offline conversation: a wav in, the answer out")
    add_conversation_args(r)
    r.add_argument("--input", required=True, help="what the user says (audio file)")
    r.add_argument("--output", required=True, help="the model's answer (24 kHz wav, same length)")
    r.add_argument("--text-out", help="per-frame text as JSON (piece, \"PAD\" or \"EPAD\")")
    r.add_argument("--user-text-out", metavar="FILE",
                   help="what the user said, per input frame as JSON, heard by the model's "
                   "transcriber (export --transcriber); like --text-out")
    r.add_argument("--say", action=SayAction, dest="says", metavar="TEXT",
                   help="words the model says, in its voice, through its text stream (may be "
                        "repeated; docs/say.md)")
    r.add_argument("--say-at", action=SayAction, dest="says", type=float, metavar="SECONDS",
                   help="when the --say before it arrives: the step ceil(SECONDS x 12.5) of the "
                        "input, 0 being the first frame after the persona (default 0)")
    r.add_argument("--realtime", action="store_true",
                   help="play the input through the live loop at the pace of a microphone "
                        "(drops and underruns as live; no sound device needed)")
    add_backlog_arg(r)
    r.set_defaults(func=run)


class SayAction(argparse.Action):
    """`--say TEXT` and `--say-at SECONDS` into one list of (text, seconds or None), in their
    order on the command line: a --say-at times the --say before it, and only that one."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        says = list(getattr(namespace, self.dest) or [])
        if option_string == "--say":
            says.append((value, None))
        else:
            if not says:
                parser.error(f"--say-at {value:g} before any --say: give it after the --say "
                             "it times")
            text, at = says[-1]
            if at is not None:
                parser.error(f"a second --say-at for --say {text!r}: each --say takes one, "
                             "after it")
            if not value >= 0 or value == float("inf"):
                parser.error(f"--say-at {value}: seconds from the start of the input, >= 0")
            says[-1] = (text, value)
        setattr(namespace, self.dest, says)


def run(args) -> int:
    """A recording in, the model's answer out (same length), text per frame: as fast as the
    machine goes, or with --realtime through the live loop at the pace of a microphone."""
    from ..audio import read_audio, write_audio
    from ..runtime.metrics import format_summary
    from ..runtime.words.text import Transcript, write_records
    from ..transcriber import no_transcriber

    pcm = read_audio(args.input)  # before the model loads: a bad file fails fast
    from ..runtime.words.say import check_say_text, said_line

    says = [(at or 0.0, check_say_text(text, "--say")) for text, at in args.says or []]
    model, conv = conversation(args)
    if args.user_text_out and not conv.transcribing:
        raise PersonaPlexError(f"--user-text-out: {no_transcriber(model.model_dir)}")
    if args.realtime:
        import numpy as np

        from ..runtime.audio_io.paced_file import run_paced
        from ..runtime.words.say import SayPlan

        transcript = Transcript(model.text, records=bool(args.text_out))
        heard = Transcript(model.loaded.heard_text, records=True) if conv.transcribing else None
        plan = SayPlan(says, model.sample_rate / model.frame_size)

        def step(frame):
            plan.say_due(conv.position - conv.prompt_frames, conv.say)
            audio, token = conv.core.step(frame)
            transcript.add(token)
            if heard is not None:
                heard.add(conv.core.heard_token)
            return audio

        # the last frame completed with silence, as respond() does: every sample is heard
        padding = (-pcm.shape[0]) % model.frame_size
        out, loop = run_paced(step, np.concatenate([pcm, np.zeros(padding, pcm.dtype)]),
                              frame_size=model.frame_size,
                              max_backlog_frames=args.max_backlog_frames, on_tick=LiveStatus())
        if heard is not None:  # the words still inside the transcriber's delay (heard.md)
            for token in conv.core.flush_heard(padding):
                heard.add(token)
        text, records = transcript.text, transcript.records
        user_text, user_records = (heard.text, heard.records) if heard else ("", [])
    else:
        response = conv.respond(pcm, say=says)
        out, text, records = response.pcm, response.text, response.records
        user_text, user_records = response.heard, response.heard_records
    write_audio(args.output, out[:pcm.shape[0]])
    if args.text_out:
        write_records(args.text_out, records)
    if args.user_text_out:
        write_records(args.user_text_out, user_records)
    if args.realtime:
        live_summary(loop, conv)  # first: it ends the status line the transcript would join
    print(text or "(no text)")
    if conv.transcribing:
        print(f"heard: {user_text or '(nothing)'}")
    if says:
        conv.cancel_say()  # the input is over: what was not reached is reported as such
        print(said_line(conv.say_events(), conv.prompt_frames), file=sys.stderr)
    if not args.realtime:
        print(format_summary(conv.metrics.summary()))
    return 0
