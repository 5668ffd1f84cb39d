"""The full-duplex loop: audio in -> one model step per 80 ms frame -> audio out.

Audio callbacks only move samples between rings. One worker thread takes 1920-sample frames from
the input ring, runs the step, and puts the answer on the output ring. Latency is bounded on both
sides: when the worker falls behind, the oldest input frames are dropped (and counted) so it
always works on recent audio; when the output ring runs dry the device plays silence (counted as
an underrun). Devices at another rate are resampled by the worker, never in a callback.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from personaplex_edge.errors import AudioDeviceError

from ..metrics import FrameMetrics
from .sample_ring import SampleRing

FrameStep = Callable[[np.ndarray], np.ndarray]  # pcm [frame] f32 at 24 kHz -> pcm [frame]


@dataclass
class DuplexStats:
    frames: int = 0  # frames the step processed
    dropped_frames: int = 0  # input frames skipped because the worker was behind
    underruns: int = 0  # output blocks that came up short after start-up
    max_backlog_frames: int = 0  # most input waiting when the worker took a frame
    input_overflows: int = 0  # blocks the sound system itself reported as overflowed
    interrupted: bool = False  # stopped by Ctrl-C
    timing: FrameMetrics = field(default_factory=lambda: FrameMetrics(stages=()), repr=False)


class _Resampler:
    """Streaming soxr resampling between the device rate and the model rate."""

    def __init__(self, rate_in: int, rate_out: int):
        import soxr

        self._stream = soxr.ResampleStream(rate_in, rate_out, 1, dtype="float32", quality="HQ")

    def __call__(self, samples: np.ndarray) -> np.ndarray:
        return self._stream.resample_chunk(samples)


class DuplexLoop:
    """Owns the rings and the worker; a sound backend (or a test) calls `on_input`/`on_output`
    from its audio callback at the device rate."""

    def __init__(self, step: FrameStep, frame_size: int = 1920, model_rate: int = 24000,
                 input_rate: int = 24000, output_rate: int = 24000, max_backlog_frames: int = 2,
                 buffer_frames: int = 1):
        self.step = step
        self.frame_size = frame_size
        self.max_backlog_frames = max_backlog_frames
        self.buffer_frames = buffer_frames
        self.stats = DuplexStats()
        in_ratio, out_ratio = input_rate / model_rate, output_rate / model_rate
        # the device-side rings hold a few frames; overflow overwrites the oldest samples
        self.input = SampleRing(int((max_backlog_frames + 2) * frame_size * in_ratio) + 1)
        self.output = SampleRing(int((buffer_frames + 4) * frame_size * out_ratio) + 1)
        self._to_model = _Resampler(input_rate, model_rate) if input_rate != model_rate else None
        self._to_device = (_Resampler(model_rate, output_rate) if output_rate != model_rate
                           else None)
        self._model_in = SampleRing(4 * frame_size)  # model-rate samples waiting for a frame
        self._chunk = np.zeros(max(1, int(round(frame_size * in_ratio))), np.float32)
        self._out_block = max(1, int(round(frame_size * out_ratio)))
        self._frame = np.zeros(frame_size, np.float32)
        self._stop = threading.Event()
        self._primed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.alive: Callable[[], bool] = lambda: True  # the backend says if its device still runs
        # A device that stops calling back without an error (a sound server that died, a
        # USB device pulled) is noticed by silence from the input: no samples for this long.
        self.stall_seconds = 3.0
        self.startup_seconds = 15.0  # sound servers can take a while to deliver the first block
        self._last_input: float | None = None
        self._started_at = 0.0

    # -- audio callback side (no allocation, no model work) ---------------------------------
    def on_input(self, samples: np.ndarray) -> None:
        self.input.write(samples)
        self._last_input = time.monotonic()

    def on_output(self, out: np.ndarray) -> None:
        before = self.output.underruns
        self.output.read_or_silence(out)
        if self._primed and self.output.underruns != before:
            self.stats.underruns += 1

    # -- worker -------------------------------------------------------------------------------
    def start(self) -> None:
        self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._work, name="personaplex-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.input.wake()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _next_frame(self) -> bool:
        """Fills self._frame with the next model-rate frame; False when stopping."""
        chunk = self._chunk
        while len(self._model_in) < self.frame_size:
            if not self.input.read_exact(chunk, timeout=0.2):
                if self._stop.is_set():
                    return False
                if not self.alive():
                    raise AudioDeviceError("the audio device stopped delivering samples "
                                          "(unplugged or taken by another program?)")
                continue
            self._model_in.write(self._to_model(chunk) if self._to_model else chunk)
        return self._model_in.read_exact(self._frame, timeout=0)

    def _stalled(self) -> bool:
        now = time.monotonic()
        if self._last_input is None:
            return now - self._started_at > self.startup_seconds
        return now - self._last_input > self.stall_seconds

    def _drop_backlog(self) -> None:
        chunk = self._chunk.shape[0]
        waiting = len(self.input) // chunk
        self.stats.max_backlog_frames = max(self.stats.max_backlog_frames, waiting)
        if waiting > self.max_backlog_frames:
            dropped = self.input.drop_oldest(keep=self.max_backlog_frames * chunk)
            self.stats.dropped_frames += -(-dropped // chunk)
        # samples the input ring overwrote on its own (worker stuck) count as dropped too
        lost = self.input.overwritten
        if lost:
            self.input.overwritten = 0
            self.stats.dropped_frames += -(-lost // chunk)

    def _work(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._next_frame():
                    break
                self.stats.timing.start_frame()
                out = self.step(self._frame)
                self.stats.timing.end_frame()
                self.stats.frames += 1
                if self._to_device:
                    out = self._to_device(out)
                if not self._primed:
                    # a little silence ahead of the first answer absorbs jitter in step time
                    self.output.write(np.zeros(self.buffer_frames * self._out_block,
                                               np.float32))
                    self._primed = True
                self.output.write(out)
                self._drop_backlog()
        except BaseException as e:  # surfaced by stop() in the main thread
            self._error = e
            self._stop.set()

    def failed(self) -> bool:
        return self._error is not None
