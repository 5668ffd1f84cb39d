"""The live loop's status line and closing summary, for `run --realtime` and `mic`."""

from __future__ import annotations

import sys


class LiveStatus:
    """The live loop's status line (frame times over the last 100 frames, drops, underruns),
    and once, past start-up, a warning when the machine runs the model slower than real time:
    the drops are then the machine's limit, not a glitch, and the fix is another export."""

    def __init__(self, warn_after_frames: int = 25):
        self.warn_after_frames = warn_after_frames
        self.warned = False

    def __call__(self, loop) -> None:
        s = loop.stats
        t = s.timing.summary(last=100)
        frame_ms = t.get("frame", {"p50": 0.0, "p99": 0.0})
        line = (f"frames {s.frames}  frame {frame_ms['p50']:.1f}/{frame_ms['p99']:.1f} ms "
                f"(p50/p99)  dropped {s.dropped_frames}  underruns {s.underruns}"
                + s.status())
        live = sys.stderr.isatty()
        print(("\r" + line + "   ") if live else line, end="" if live else "\n",
              file=sys.stderr, flush=True)
        budget = s.timing.budget_ms
        if (not self.warned and s.frames >= self.warn_after_frames
                and frame_ms["p50"] > budget):
            self.warned = True
            print(f"\nwarning: a frame takes {frame_ms['p50']:.0f} ms (p50) against its "
                  f"{budget:.0f} ms of audio: this machine runs this model slower than real "
                  "time, so input is being dropped. Export a lower --precision or use a GPU "
                  "backend (README: which export for which machine).", file=sys.stderr,
                  flush=True)


def live_summary(loop, conv) -> None:
    from ..runtime.metrics import format_summary

    s = loop.stats
    print(file=sys.stderr)
    print(f"{'stopped' if s.interrupted else 'done'}: {s.frames} frames, {s.dropped_frames} "
          f"dropped, {s.underruns} underruns, {s.input_overflows} input overflows",
          file=sys.stderr)
    for line in s.report():  # echo cancelled, answer lost to clock drift
        print(line, file=sys.stderr)
    print(format_summary(conv.metrics.summary()), file=sys.stderr)
