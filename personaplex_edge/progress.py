"""Progress of a long step (an export's weights, a conversion): on a terminal a bar redrawn in
place (at most 5 times a second); otherwise - a CI log, a pod's log, a test - one plain line
every `interval` seconds through the caller's `say`, and one at the end. The batch runner's
progress (runtime/batch/progress.py) looks the same way."""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO


def clock(seconds: float) -> str:
    """H:MM:SS, or M:SS under an hour."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def bar(done: float, total: float, width: int = 24) -> str:
    filled = min(int(width * done / max(total, 1e-9)), width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


class Meter:
    """`what`: done / total GB, rate, elapsed and time left, advanced in bytes."""

    def __init__(self, what: str, total: int, say: Callable[[str], None],
                 stream: TextIO | None = None, interval: float = 10.0):
        self.what, self.total, self.say = what, max(int(total), 1), say
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.interval = interval
        self.started = time.monotonic()
        self.done = 0
        self._last = time.monotonic()  # the first plain line after one interval

    def line(self) -> str:
        wall = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / wall
        left = clock((self.total - self.done) / rate) if rate > 0 else "?"
        return (f"{self.what}: {self.done / 1e9:.2f} / {self.total / 1e9:.2f} GB, "
                f"{rate / 1e6:.0f} MB/s, {clock(wall)} elapsed, {left} left")

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last < (0.2 if self.live else self.interval):
            return
        self._last = now
        if self.live:
            self.stream.write(f"\r\033[K{bar(self.done, self.total)} {self.line()}")
            self.stream.flush()
        else:
            self.say(f"    {self.line()}")

    def close(self) -> None:
        """Clears the bar; the caller says what was done."""
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()
