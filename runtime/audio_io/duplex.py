"""The full-duplex loop: audio in -> (echo cancelled) -> one model step per 80 ms frame -> out.

Audio callbacks only move samples between rings. One worker thread takes 1920-sample frames from
the input ring, removes the echo of what the speaker played (an optional canceller, see
echo.py), runs the step, and puts the answer on the output ring. Latency is bounded on both
sides: when the worker falls behind, the oldest input frames are dropped (and counted) so it
always works on recent audio; when the output ring runs dry the device plays silence (counted as
an underrun); when it overflows (an output clock slower than the input's) the oldest answer is
overwritten (counted as lost). Devices at another rate are resampled by the worker, never in a
callback.

The canceller's reference is what the output callback actually handed to the device (silence of
underruns included), copied into a third ring: so ring jitter, underruns and overwrites never
misalign it. Its delay is then the devices' own: the callbacks' timestamps and sample counts
plus the latencies the devices report give the first estimate, the canceller measures the rest.
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
    output_lost: int = 0  # answer samples (device rate) overwritten before they were played
    output_rate: int = 24000
    max_backlog_frames: int = 0  # most input waiting when the worker took a frame
    input_overflows: int = 0  # blocks the sound system itself reported as overflowed
    interrupted: bool = False  # stopped by Ctrl-C
    echo: object | None = None  # the canceller's EchoStats (echo.py), when one runs
    # per frame: the canceller's time ("aec") and the whole frame (canceller + step)
    timing: FrameMetrics = field(default_factory=lambda: FrameMetrics(stages=("aec",)),
                                 repr=False)

    def report(self) -> list[str]:
        """Lines for the end-of-session summary beyond the frame counts."""
        lines = []
        if self.echo is not None:
            lines.append(self.echo.line())
        if self.output_lost:
            lines.append(f"{1000 * self.output_lost / self.output_rate:.0f} ms of the answer "
                         "were overwritten before they were played (the output device's clock "
                         "runs slower than the input's)")
        return lines

    def status(self) -> str:
        """A short addition to the live status line."""
        if self.echo is None:
            return ""
        aec = self.timing.summary(last=100).get("aec")
        return "" if aec is None else f"  aec {aec['p50']:.1f} ms"


class _Resampler:
    """Streaming soxr resampling between the device rate and the model rate."""

    def __init__(self, rate_in: int, rate_out: int):
        import soxr

        self._stream = soxr.ResampleStream(rate_in, rate_out, 1, dtype="float32", quality="HQ")

    def __call__(self, samples: np.ndarray) -> np.ndarray:
        return self._stream.resample_chunk(samples)


class DuplexLoop:
    """Owns the rings and the worker; a sound backend (or a test) calls `on_input`/`on_output`
    from its audio callback at the device rate.

    `echo`: a canceller (echo.EchoCanceller or PassThrough) or None. `step_metrics`: the step's
    own FrameMetrics, charged with the canceller's time as its "aec" stage."""

    def __init__(self, step: FrameStep, frame_size: int = 1920, model_rate: int = 24000,
                 input_rate: int = 24000, output_rate: int = 24000, max_backlog_frames: int = 2,
                 buffer_frames: int = 1, echo=None, step_metrics: FrameMetrics | None = None):
        self.step = step
        self.frame_size = frame_size
        self.model_rate = model_rate
        self.max_backlog_frames = max_backlog_frames
        self.buffer_frames = buffer_frames
        self.stats = DuplexStats(output_rate=output_rate)
        in_ratio, out_ratio = input_rate / model_rate, output_rate / model_rate
        self._in_ratio, self._out_ratio = in_ratio, out_ratio
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
        self.echo = echo
        self.step_metrics = step_metrics
        if echo is not None:
            self.stats.echo = echo.stats
            # what the speaker was handed, at the device rate, for the canceller's reference
            self.played = SampleRing(int((buffer_frames + 8) * frame_size * out_ratio) + 1)
            self._played_chunk = np.zeros(self.played.capacity, np.float32)
            self._played_to_model = (_Resampler(output_rate, model_rate)
                                     if output_rate != model_rate else None)
        self._stop = threading.Event()
        self._primed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.alive: Callable[[], bool] = lambda: True  # the backend says if its device still runs
        # A device that stops calling back without an error (a sound server that died, a
        # USB device pulled) while its stream still reports itself active is noticed by
        # silence from the input: no samples for this long.
        self.stall_seconds = 3.0
        self.startup_seconds = 15.0  # sound servers can take a while to deliver the first block
        self.device_latency = (0.0, 0.0)  # (input, output) seconds, as the devices report them
        self._last_input: float | None = None
        self._started_at = 0.0
        # (samples delivered so far, monotonic time of that callback), per direction
        self._in_count = 0
        self._out_count = 0
        self._in_clock: tuple[int, float] | None = None
        self._out_clock: tuple[int, float] | None = None
        self._hinted = False

    # -- audio callback side (no allocation, no model work) ---------------------------------
    def on_input(self, samples: np.ndarray) -> None:
        self.input.write(samples)
        now = time.monotonic()
        self._in_count += samples.shape[0]
        self._in_clock = (self._in_count, now)  # one tuple: read whole by the worker
        self._last_input = now

    def on_output(self, out: np.ndarray) -> None:
        before = self.output.underruns
        self.output.read_or_silence(out)
        if self._primed and self.output.underruns != before:
            self.stats.underruns += 1
        if self.echo is not None:
            self._out_clock = (self._out_count, time.monotonic())  # first sample of this block
            self._out_count += out.shape[0]
            self.played.write(out)

    # -- worker -------------------------------------------------------------------------------
    def start(self) -> None:
        """Starts the worker; call once the devices are running (the stall clock starts now)."""
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
                if self._stalled():
                    waited = (time.monotonic() - (self._last_input or self._started_at))
                    raise AudioDeviceError(
                        f"the audio input stopped delivering samples {waited:.0f} s ago while "
                        "its device still reports itself running (a sound server that hung, a "
                        "device that was suspended or unplugged); check the device and start "
                        "again ('personaplex-edge devices' lists them)")
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
        lost = 0
        if waiting > self.max_backlog_frames:
            dropped = self.input.drop_oldest(keep=self.max_backlog_frames * chunk)
            self.stats.dropped_frames += -(-dropped // chunk)
            lost += dropped
        # samples the input ring overwrote on its own (worker stuck) count as dropped too
        overwritten = self.input.take_overwritten()
        if overwritten:
            self.stats.dropped_frames += -(-overwritten // chunk)
            lost += overwritten
        if lost and self.echo is not None:
            # the canceller's microphone clock jumps with the input it never saw
            self.echo.skip(int(round(lost / self._in_ratio)))

    def _feed_reference(self) -> None:
        """Hands the canceller what the speaker played since the last frame (model rate)."""
        lost = self.played.take_overwritten()
        if lost:  # played but never seen (the worker was stuck): silence keeps the timing
            self.echo.played(np.zeros(int(round(lost / self._out_ratio)), np.float32))
        n = min(len(self.played), self._played_chunk.shape[0])
        if n == 0:
            return
        chunk = self._played_chunk[:n]
        self.played.read_exact(chunk, timeout=0)
        self.echo.played(self._played_to_model(chunk) if self._played_to_model else chunk)

    def _hint_delay(self) -> None:
        """The echo's delay from what the devices say, once both have called back: the
        newest microphone sample was captured an input latency before its callback; the
        newest played block reaches the air an output latency after its callback."""
        if self._hinted or self._in_clock is None or self._out_clock is None:
            return
        (in_count, t_in), (out_count, t_out) = self._in_clock, self._out_clock
        in_lat, out_lat = self.device_latency
        # the input sample index captured when played sample `out_count` leaves the speaker
        captured = in_count + (t_out + out_lat - (t_in - in_lat)) * self.input_rate_hz
        delay = captured / self._in_ratio - out_count / self._out_ratio  # model-rate samples
        if delay < 0:
            # the microphone started after the speaker (a slow input: PipeWire, Bluetooth,
            # USB): its first sample heard what was played -delay samples into the reference.
            # Counting the microphone from there puts both on one clock, and the rest of the
            # delay is the room's and the devices', which the canceller follows
            self.echo.skip(int(round(-delay)))
            delay = 0.0
        self.echo.set_delay_hint(1000.0 * delay / self.model_rate)
        self._hinted = True

    @property
    def input_rate_hz(self) -> float:
        return self._in_ratio * self.model_rate

    def _work(self) -> None:
        timing = self.stats.timing
        try:
            while not self._stop.is_set():
                if not self._next_frame():
                    break
                timing.start_frame()
                frame = self._frame
                if self.echo is not None:
                    self._feed_reference()
                    self._hint_delay()
                    frame = self.echo.process(frame)
                    ms = timing.mark("aec")
                    if self.step_metrics is not None:
                        self.step_metrics.add_before("aec", ms)
                out = self.step(frame)
                timing.end_frame()
                self.stats.frames += 1
                if self._to_device:
                    out = self._to_device(out)
                if not self._primed:
                    # a little silence ahead of the first answer absorbs jitter in step time
                    self.output.write(np.zeros(self.buffer_frames * self._out_block,
                                               np.float32))
                    self._primed = True
                self.output.write(out)
                self.stats.output_lost += self.output.take_overwritten()
                self._drop_backlog()
        except BaseException as e:  # surfaced by stop() in the main thread
            self._error = e
            self._stop.set()

    def failed(self) -> bool:
        return self._error is not None
