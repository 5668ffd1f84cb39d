"""A batch run's progress: items done, hours of audio, times real time, time left. On a terminal
a bar redrawn in place (at most 5 times a second); otherwise - a CI log, a Kubernetes pod's
log - one plain line every `interval` seconds and one at the end."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from personaplex_edge.progress import bar, clock


class BatchProgress:
    def __init__(self, items: int, audio_seconds: float, stream: TextIO | None = None,
                 interval: float = 10.0, width: int = 24):
        self.items = items
        self.audio_seconds = audio_seconds  # of every item to answer (from the files' headers)
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.interval = interval
        self.width = width
        self.started = time.monotonic()
        self._last = float("-inf")
        self.done_items = 0
        self.done_seconds = 0.0  # audio answered, finished items and the frames of open ones

    def advance(self, seconds: float) -> None:
        """`seconds` more of audio answered."""
        self.done_seconds += seconds
        self._maybe_show()

    def item_done(self) -> None:
        self.done_items += 1
        self._maybe_show()

    def say(self, line: str) -> None:
        """A line of its own (an item that failed), not lost under the bar."""
        if self.live:
            self.stream.write("\r\033[K")
        self.stream.write(line + "\n")
        self._last = float("-inf")
        self._maybe_show()

    def line(self) -> str:
        wall = max(time.monotonic() - self.started, 1e-9)
        speed = self.done_seconds / wall
        left = max(self.audio_seconds - self.done_seconds, 0.0)
        eta = clock(left / speed) if speed > 0 else "?"
        return (f"{self.done_items}/{self.items} items, {clock(self.done_seconds)} of "
                f"{clock(self.audio_seconds)} of audio, {speed:.1f}x real time, "
                f"{clock(wall)} elapsed, {eta} left")

    def _maybe_show(self) -> None:
        now = time.monotonic()
        if now - self._last < (0.2 if self.live else self.interval):
            return
        self._last = now
        if self.live:
            self.stream.write(f"\r\033[K{bar(self.done_seconds, self.audio_seconds, self.width)} "
                              f"{self.line()}")
        else:
            self.stream.write(f"batch: {self.line()}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
        self.stream.write(f"batch: {self.line()}\n")
        self.stream.flush()
