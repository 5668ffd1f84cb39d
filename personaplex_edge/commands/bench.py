"""`personaplex-edge bench`: per-stage timings of N conversations on one model."""

from __future__ import annotations

from pathlib import Path

from ..errors import PersonaPlexError
from .common import add_conversation_args, load_model, note, sampling


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="per-stage timings: p50/p90/p99/max, over-budget frames")
    add_conversation_args(b)
    b.add_argument("--frames", type=int, default=200)
    b.add_argument("--warmup", type=int, default=10)
    b.add_argument("--streams", type=int, default=1,
                   help="conversations stepped together, as a server steps them (1)")
    b.add_argument("--position", type=int, default=None, metavar="N",
                   help="start each conversation N frames in (after its persona) without "
                        "stepping there; N >= the context (3000) times the steady state, the "
                        "KV ring full")
    b.add_argument("--json", help="write the summaries and every frame's stage times here")
    b.add_argument("--plot", help="draw frame time per stage over the run into this PNG "
                                  "(needs matplotlib)")
    b.add_argument("--aec", choices=("on", "off"), default="on",
                   help="the echo canceller in front of each stream, as --mic runs it (on); "
                        "off as serve runs (its clients cancel their own echo)")
    b.set_defaults(func=run)


def run(args) -> int:
    """Per-stage timings of N conversations on one model (the bundled speech sample, looped):
    per stream, per round and the largest N that keeps up (runtime/bench.py)."""
    import json

    from ..atomic import write_text_atomic
    from ..runtime.audio_io.echo import TimedStage
    from ..runtime.bench import plot, run_bench
    from ..runtime.persona import Persona

    if args.plot:  # before the run: a missing matplotlib fails now, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise PersonaPlexError("--plot needs matplotlib: pip install "
                                   "'personaplex-edge[plot]'") from None
    model = load_model(args)
    persona = Persona(text_prompt=args.text_prompt, voice=args.voice_prompt,
                      enabled=not args.no_persona)

    def canceller(conv):
        # the echo canceller on the bench's frames: the input as the microphone, the answer
        # as what the speaker played (its "aec" stage; absent without libspeexdsp)
        return TimedStage(conv.metrics, model.sample_rate, model.frame_size, warn=note)

    result = run_bench(model, args.frames, args.warmup, args.streams, sampling(args), persona,
                       front=canceller if args.aec == "on" else None, position=args.position)
    print(f"{model.model_dir}: {args.streams} stream(s), {args.frames} frames after "
          f"{args.warmup} warm-up, position {result.position} (context {result.context}), "
          f"on {model.device}")
    print(result.report())
    if args.json:
        data = {"model": str(model.model_dir), **result.to_json()}
        write_text_atomic(Path(args.json), json.dumps(data))
    if args.plot:
        plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0
