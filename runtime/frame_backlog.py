"""The bounded-latency rule of every live front end (`serve`'s sessions, `stdio --max-backlog-
frames`): frames wait for the model in a short queue, and when more than `max_backlog` wait
beyond the one the next step takes, the oldest are dropped and counted - a conversation that
falls behind hears its recent audio answered, not audio from seconds ago."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

import numpy as np


class FrameBacklog:
    """Frames of one session waiting for the tick thread, at most `max_backlog` of them beyond
    the one the next tick takes; each frame carries the time it became ready."""

    def __init__(self, max_backlog: int, on_ready: Callable[[], None] = lambda: None):
        self.max_backlog = max_backlog
        self._frames: deque[tuple[np.ndarray, float]] = deque()
        self._lock = threading.Lock()
        self._on_ready = on_ready
        self.dropped = 0  # frames dropped because the session was behind
        self.pushed = 0

    def push(self, frame: np.ndarray) -> int:
        """Adds a frame; returns how many old frames it pushed out."""
        with self._lock:
            self._frames.append((frame, time.perf_counter()))
            self.pushed += 1
            dropped = 0
            while len(self._frames) > self.max_backlog + 1:
                self._frames.popleft()
                dropped += 1
            self.dropped += dropped
        self._on_ready()
        return dropped

    def trim(self, keep: int) -> int:
        """Drops all but the newest `keep` frames; returns how many it dropped."""
        with self._lock:
            dropped = max(0, len(self._frames) - keep)
            for _ in range(dropped):
                self._frames.popleft()
            self.dropped += dropped
        return dropped

    def take(self) -> tuple[np.ndarray, float] | None:
        with self._lock:
            return self._frames.popleft() if self._frames else None

    def __len__(self) -> int:
        return len(self._frames)
