"""A bounded, thread-safe ring of audio samples between an audio callback and the worker.

Capacity is fixed at creation and nothing is allocated afterwards. A writer that finds the ring
full overwrites the oldest samples (and counts them): latency stays bounded instead of growing.
A reader that asks for more than there is gets what there is, padded with silence (counted as an
underrun), because an audio device cannot wait.
"""

from __future__ import annotations

import threading

import numpy as np


class SampleRing:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._buf = np.zeros(capacity, np.float32)  # [capacity]
        self._start = 0  # index of the oldest sample
        self._size = 0
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self.overwritten = 0  # samples dropped because the ring was full
        self.underrun_samples = 0  # samples of silence handed out for lack of data
        self.underruns = 0  # reads that came up short

    def __len__(self) -> int:
        with self._lock:
            return self._size

    def write(self, samples: np.ndarray) -> None:
        n = samples.shape[0]
        with self._lock:
            if n >= self.capacity:  # only the newest capacity samples can be kept
                self.overwritten += self._size + n - self.capacity
                samples = samples[n - self.capacity:]
                n = self.capacity
                self._start, self._size = 0, 0
            excess = self._size + n - self.capacity
            if excess > 0:
                self._start = (self._start + excess) % self.capacity
                self._size -= excess
                self.overwritten += excess
            end = (self._start + self._size) % self.capacity
            first = min(n, self.capacity - end)
            self._buf[end:end + first] = samples[:first]
            self._buf[:n - first] = samples[first:]
            self._size += n
            self._ready.notify_all()

    def _take(self, out: np.ndarray, n: int) -> None:
        first = min(n, self.capacity - self._start)
        out[:first] = self._buf[self._start:self._start + first]
        out[first:n] = self._buf[:n - first]
        self._start = (self._start + n) % self.capacity
        self._size -= n

    def read_or_silence(self, out: np.ndarray) -> None:
        """Fills `out` (in place): for the audio callback, never blocks."""
        want = out.shape[0]
        with self._lock:
            n = min(want, self._size)
            self._take(out, n)
            if n < want:
                out[n:] = 0.0
                self.underruns += 1
                self.underrun_samples += want - n

    def read_exact(self, out: np.ndarray, timeout: float | None = None) -> bool:
        """Waits until `out` can be filled completely; False on timeout (out untouched)."""
        want = out.shape[0]
        with self._ready:
            if not self._ready.wait_for(lambda: self._size >= want, timeout=timeout):
                return False
            self._take(out, want)
            return True

    def drop_oldest(self, keep: int) -> int:
        """Discards all but the newest `keep` samples; returns how many were dropped."""
        with self._lock:
            drop = max(0, self._size - keep)
            self._start = (self._start + drop) % self.capacity
            self._size -= drop
            return drop

    def take_overwritten(self) -> int:
        """The samples overwritten since the last call (read and reset under the lock, so a
        writer's count between the two is never lost)."""
        with self._lock:
            n, self.overwritten = self.overwritten, 0
            return n

    def wake(self) -> None:
        """Wakes a blocked `read_exact` (used when stopping)."""
        with self._ready:
            self._ready.notify_all()
