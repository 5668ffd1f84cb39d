"""A call's 48 kHz audio <-> the model's 24 kHz frames, resampled statefully (soxr's stream
resampler), so a block's edge is no edge in the signal: no click every 20 ms, and no filter
restarted per packet.

    in:   48 kHz pieces of any size  ->  24 kHz  ->  whole 1920-sample frames (the model's 80 ms)
    out:  a 1920-sample answer frame ->  48 kHz  ->  the samples the RTP track plays
"""

from __future__ import annotations

import numpy as np
import soxr

CALL_RATE = 48000  # Hz: Opus's own clock, the RTP timestamp rate of every Opus track
QUALITY = "HQ"  # soxr's default: 20-bit precision; its delay is counted in docs/measured.md


class Downsampler:
    """48 kHz pieces -> whole model frames at `rate`."""

    def __init__(self, rate: int = 24000, frame_size: int = 1920, in_rate: int = CALL_RATE):
        self._stream = soxr.ResampleStream(in_rate, rate, 1, dtype="float32", quality=QUALITY)
        self.frame_size = frame_size
        self._pending = np.zeros(0, np.float32)  # resampled samples short of a whole frame

    def feed(self, pcm: np.ndarray) -> list[np.ndarray]:
        """[n] float32 at the call's rate -> the whole frames they complete (new arrays)."""
        out = self._stream.resample_chunk(np.ascontiguousarray(pcm, np.float32))
        pcm = np.concatenate([self._pending, out]) if self._pending.size else out
        n = pcm.shape[0] // self.frame_size
        frames = [pcm[i * self.frame_size:(i + 1) * self.frame_size].copy() for i in range(n)]
        self._pending = pcm[n * self.frame_size:].copy()
        return frames


class Upsampler:
    """Answer frames at `rate` -> float32 at the call's rate (as many samples as the stream
    has ready: its delay is paid once, at the start)."""

    def __init__(self, rate: int = 24000, out_rate: int = CALL_RATE):
        self._stream = soxr.ResampleStream(rate, out_rate, 1, dtype="float32", quality=QUALITY)

    def feed(self, frame: np.ndarray) -> np.ndarray:
        return self._stream.resample_chunk(np.ascontiguousarray(frame, np.float32))
