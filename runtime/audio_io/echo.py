"""Echo cancellation for open speakers: what the loop played is removed from the microphone.

With a speaker in the room the model hears its own voice come back and answers itself. The loop
knows exactly what it sent to the speaker; that is the reference. Per 80 ms frame at 24 kHz:

    played(ref)   the samples just sent to the speaker, in order
    process(mic)  the microphone's frame -> the same frame without the echo (same length)

Inside, all the adaptive work is speexdsp's (see speexdsp.py):
    1. alignment   the reference is shifted by the echo's bulk delay (the loop's hint, then
                   DelayEstimator's measurement) minus a 40 ms margin, so the echo falls early
                   in the filter's 250 ms window: a short window adapts fast, and a reference
                   later than its echo could not cancel anything
    2. linear      speex's echo canceller subtracts the filtered reference (20 ms blocks)
    3. residual    speex's preprocessor suppresses, band by band, the echo the filter left
                   (and steady noise, at most 15 dB), less where the user talks over it
Measured (benchmarks/bench_aec.py, README): library defaults either mute the user in double
talk (WebRTC AEC3) or leave too much echo (speex with a 500 ms tail, no alignment, no
suppressor); this combination does neither.

Without libspeexdsp the canceller passes the microphone through unchanged and says so once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import speexdsp
from .echo_delay import DelayEstimator

INSTALL_HINT = ("install speexdsp: apt-get install libspeexdsp1 (Debian, Ubuntu, Jetson), "
                "brew install speexdsp (macOS)")


@dataclass
class EchoStats:
    """What the canceller did. Energies are sums of squares over the frames in which the
    reference was playing (echo possible), past the first `settle_frames` of them (the
    filter converging, 2 s); the ratio of the two is the echo removed."""

    enabled: bool = True
    frames: int = 0
    active_frames: int = 0  # frames with the reference playing
    mic_energy: float = 0.0  # what the microphone heard, in active frames
    out_energy: float = 0.0  # what went on to the model, in active frames
    ref_energy: float = 0.0  # what was played, aligned, in active frames
    settle_frames: int = 25
    realignments: int = 0  # times the measured delay moved the reference (reset the filter)
    delay_ms: float | None = None  # the echo's bulk delay the canceller works with

    @property
    def removed_db(self) -> float | None:
        """How much quieter the output is than the microphone while the model spoke."""
        if self.active_frames <= self.settle_frames or self.out_energy <= 0:
            return None
        return 10.0 * float(np.log10(max(self.mic_energy, 1e-30) / self.out_energy))

    @property
    def heard_db(self) -> float | None:
        """What reached the model while it spoke, relative to what it played (dB): the echo
        level it hears of itself (plus whatever the user said meanwhile)."""
        if self.active_frames <= self.settle_frames or self.ref_energy <= 0:
            return None
        return 10.0 * float(np.log10(max(self.out_energy, 1e-30) / self.ref_energy))

    def line(self) -> str:
        heard = self.heard_db
        heard_s = "n/a (the model spoke < 2 s)" if heard is None else f"{heard:.1f} dB"
        if not self.enabled:
            return f"aec off: the microphone heard the speaker at {heard_s} of what it played"
        removed = self.removed_db
        removed_s = "n/a" if removed is None else f"{removed:.1f} dB"
        delay = "not found" if self.delay_ms is None else f"{self.delay_ms:.0f} ms"
        return (f"aec: removed {removed_s} while the model spoke; the model heard itself at "
                f"{heard_s} of what it played (echo delay {delay}, {self.realignments} "
                "re-alignments)")


class _RefHistory:
    """The last `capacity` reference samples, addressed by their absolute index."""

    def __init__(self, capacity: int):
        self.buf = np.zeros(capacity, np.float32)  # [capacity], the newest at the end
        self.end = 0  # absolute index one past the newest sample

    def push(self, x: np.ndarray) -> None:
        n = x.shape[0]
        cap = self.buf.shape[0]
        if n >= cap:
            self.buf[:] = x[n - cap:]
        else:
            self.buf[:cap - n] = self.buf[n:]
            self.buf[cap - n:] = x
        self.end += n

    def window(self, start: int, out: np.ndarray) -> np.ndarray:
        """Fills out [n] with samples start..start+n (zeros where unknown: not yet played, or
        older than the history)."""
        n = out.shape[0]
        first = self.end - self.buf.shape[0]  # absolute index of buf[0]
        out[:] = 0.0
        lo, hi = max(start, first), min(start + n, self.end)
        if hi > lo:
            out[lo - start:hi - start] = self.buf[lo - first:hi - first]
        return out


def _to_int16(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """f32 in [-1, 1] -> int16 in place (full scale, clipped; truncation is below a step)."""
    out[:] = np.clip(x * 32768.0, -32768.0, 32767.0)
    return out


class EchoCanceller:
    """speexdsp's linear canceller + its residual-echo suppressor, with the reference aligned
    by the echo's measured delay. See the module docstring for the data flow."""

    def __init__(self, rate: int = 24000, frame_size: int = 1920, delay_ms: float | None = None,
                 tail_ms: float = 250.0, margin_ms: float = 40.0, max_delay_ms: float = 600.0,
                 block_ms: float = 20.0, suppress: bool = True, track_delay: bool = True,
                 lib=None):
        lib = lib if lib is not None else speexdsp.load()
        if lib is None:
            raise RuntimeError(f"libspeexdsp is missing ({speexdsp.missing_reason()}); "
                               f"{INSTALL_HINT}")
        self.rate = rate
        self.frame_size = frame_size
        block = int(round(rate * block_ms / 1000))
        if frame_size % block:
            raise ValueError(f"frame {frame_size} is not a whole number of {block}-sample blocks")
        self._block = block
        self._tail = int(round(rate * tail_ms / 1000))
        self._margin = int(round(rate * margin_ms / 1000))
        self._max_delay = int(round(rate * max_delay_ms / 1000))
        self._speex = speexdsp.SpeexEcho(lib, rate, block, self._tail, suppress=suppress)
        self._ref = _RefHistory(self._max_delay + self._tail + 4 * frame_size)
        self._delay = DelayEstimator(rate, frame_size, self._max_delay) if track_delay else None
        self._n_mic = 0  # absolute index of the next microphone sample
        self.stats = EchoStats()
        self._shift = 0  # reference samples the echo lags behind: mic[i] <-> ref[i - shift]
        if delay_ms is not None:
            self._set_delay(int(round(rate * delay_ms / 1000)))
        # buffers of one frame, allocated once
        self._aligned = np.zeros(frame_size, np.float32)  # [frame] reference under the echo
        self._window = np.zeros(self._max_delay + frame_size, np.float32)  # for the estimator
        self._mic16 = np.zeros(frame_size, np.int16)
        self._ref16 = np.zeros(frame_size, np.int16)
        self._out16 = np.zeros(frame_size, np.int16)

    @property
    def latency(self) -> int:
        """Samples by which the output lags the microphone (the suppressor's one block)."""
        return self._speex.latency

    def _set_delay(self, delay: int) -> None:
        self._shift = max(0, delay - self._margin)
        self.stats.delay_ms = 1000.0 * delay / self.rate

    def set_delay_hint(self, delay_ms: float) -> None:
        """The delay the caller expects (its buffers + device latencies); before any audio."""
        self._set_delay(int(round(self.rate * delay_ms / 1000)))

    def played(self, ref: np.ndarray) -> None:
        """ref [n] f32: samples just sent to the speaker (any n; call in playing order)."""
        self._ref.push(ref.astype(np.float32, copy=False))

    def skip(self, samples: int) -> None:
        """The microphone lost `samples` before the next frame (the loop dropped input)."""
        self._n_mic += samples

    def _follow_delay(self, mic: np.ndarray) -> None:
        n = self._n_mic
        self._ref.window(n - self._max_delay, self._window)
        delay = self._delay.update(mic, self._window)
        if delay is None:
            return
        # the echo may start anywhere from 5 to 100 ms into the filter's window (the rest of
        # the window covers the room's reverberation); else the reference moves
        ahead = delay - self._shift
        if ahead < self.rate // 200 or ahead > self.rate // 10:
            if max(0, delay - self._margin) != self._shift:
                self._set_delay(delay)
                self._speex.reset()
                self.stats.realignments += 1
        else:
            self.stats.delay_ms = 1000.0 * delay / self.rate

    def process(self, mic: np.ndarray) -> np.ndarray:
        """mic [frame_size] f32 -> [frame_size] f32 without the echo (a new array)."""
        if mic.shape[0] != self.frame_size:
            raise ValueError(f"expected {self.frame_size} samples, got {mic.shape[0]}")
        mic = mic.astype(np.float32, copy=False)
        if self._delay is not None:
            self._follow_delay(mic)
        ref = self._ref.window(self._n_mic - self._shift, self._aligned)
        _to_int16(mic, self._mic16)
        _to_int16(ref, self._ref16)
        b = self._block
        for i in range(0, self.frame_size, b):
            self._speex.run(self._mic16[i:i + b], self._ref16[i:i + b], self._out16[i:i + b])
        out = self._out16.astype(np.float32) / 32768.0  # [frame]
        self._account(mic, out, ref)
        self._n_mic += self.frame_size
        return out

    def _account(self, mic: np.ndarray, out: np.ndarray, ref: np.ndarray) -> None:
        s = self.stats
        s.frames += 1
        ref_e = float(np.dot(ref, ref))
        if ref_e > 1e-6 * ref.shape[0]:  # the model was audible (above -60 dBFS)
            s.active_frames += 1
            if s.active_frames <= s.settle_frames:
                return
            s.mic_energy += float(np.dot(mic, mic))
            s.out_energy += float(np.dot(out, out))
            s.ref_energy += ref_e

    def close(self) -> None:
        self._speex.close()


class PassThrough:
    """Same surface, no cancelling: for --aec off and a missing library. Still measures what
    the microphone heard while the model spoke, so 'off' and 'on' can be compared."""

    latency = 0

    def __init__(self, rate: int = 24000, frame_size: int = 1920, window_ms: float = 300.0):
        self.frame_size = frame_size
        self.stats = EchoStats(enabled=False)
        self._window = int(rate * window_ms / 1000)
        self._ref = _RefHistory(self._window + 4 * frame_size)
        self._recent = np.zeros(self._window + frame_size, np.float32)
        self._n_mic = 0

    def set_delay_hint(self, delay_ms: float) -> None:
        pass

    def skip(self, samples: int) -> None:
        pass

    def played(self, ref: np.ndarray) -> None:
        self._ref.push(ref.astype(np.float32, copy=False))

    def process(self, mic: np.ndarray) -> np.ndarray:
        s = self.stats
        s.frames += 1
        # without a delay estimate, "the model was audible" means: in the last window
        recent = self._ref.window(self._ref.end - self._recent.shape[0], self._recent)
        ref_e = float(np.dot(recent, recent)) * self.frame_size / recent.shape[0]
        if ref_e > 1e-6 * self.frame_size:
            e = float(np.dot(mic, mic))
            s.active_frames += 1
            if s.active_frames <= s.settle_frames:  # as the canceller counts
                self._n_mic += self.frame_size
                return mic
            s.mic_energy += e
            s.out_energy += e
            s.ref_energy += ref_e
        self._n_mic += self.frame_size
        return mic

    def close(self) -> None:
        pass


def estimate_delay(mic: np.ndarray, ref: np.ndarray, rate: int = 24000, frame_size: int = 1920,
                   max_delay_ms: float = 600.0) -> float | None:
    """The echo's bulk delay (ms) over two whole recordings, mic [T] and ref [T'] f32 at
    `rate`; None when no echo of ref is found in mic."""
    max_delay = int(round(rate * max_delay_ms / 1000))
    est = DelayEstimator(rate, frame_size, max_delay)
    hist = _RefHistory(max_delay + 2 * frame_size)
    window = np.zeros(max_delay + frame_size, np.float32)
    for i in range(0, mic.shape[0] - frame_size + 1, frame_size):
        hist.push(ref[i:i + frame_size])
        est.update(mic[i:i + frame_size], hist.window(i - max_delay, window))
    return None if est.delay is None else 1000.0 * est.delay / rate


def cancel_recording(mic: np.ndarray, ref: np.ndarray, rate: int = 24000,
                     delay_ms: float | None = None, frame_size: int = 1920,
                     lib=None) -> tuple[np.ndarray, EchoCanceller]:
    """The live canceller over two recordings that start together: mic [T] and ref [T'] f32
    at `rate` -> (clean [T] f32, the canceller with its stats). Without `delay_ms` the delay
    is first measured over the whole recording. The output lags the input by the
    suppressor's one block (`canceller.latency` samples), as live."""
    if delay_ms is None:
        delay_ms = estimate_delay(mic, ref, rate, frame_size)
    c = EchoCanceller(rate, frame_size, delay_ms=delay_ms, lib=lib)
    frames = -(-mic.shape[0] // frame_size)
    padded_mic = np.zeros(frames * frame_size, np.float32)  # [frames * frame]
    padded_mic[:mic.shape[0]] = mic
    padded_ref = np.zeros(frames * frame_size, np.float32)  # ref beyond its end: silence
    n = min(ref.shape[0], padded_ref.shape[0])
    padded_ref[:n] = ref[:n]
    out = np.empty_like(padded_mic)
    for k in range(frames):
        s = slice(k * frame_size, (k + 1) * frame_size)
        c.played(padded_ref[s])
        out[s] = c.process(padded_mic[s])
    return out[:mic.shape[0]], c


def cancel_file(mic_path, ref_path, out_path, delay_ms: float | None = None,
                rate: int = 24000) -> str:
    """`personaplex-edge aec`: mic_path minus the echo of ref_path, written to out_path at the
    microphone file's rate and length. Both files any rate (resampled to `rate`). A bad input
    or a missing library is a PersonaPlexError before anything is written. Returns a summary."""
    import time

    import soundfile as sf

    from personaplex_edge.audio import read_audio, resample, write_audio
    from personaplex_edge.errors import PersonaPlexError

    if delay_ms is not None and not 0.0 <= delay_ms <= 2000.0:
        raise PersonaPlexError(f"--delay-ms {delay_ms:g} is outside 0..2000 ms: give the "
                               "echo's delay after the reference (or leave it out: it is "
                               "measured)")
    mic = read_audio(mic_path, rate)
    ref = read_audio(ref_path, rate)
    if speexdsp.load() is None:
        raise PersonaPlexError(f"echo cancellation needs libspeexdsp "
                               f"({speexdsp.missing_reason()}); {INSTALL_HINT}")
    info = sf.info(str(mic_path))
    t0 = time.perf_counter()
    clean, canceller = cancel_recording(mic, ref, rate, delay_ms)
    ms = 1000.0 * (time.perf_counter() - t0) / max(1, canceller.stats.frames)
    out = resample(clean, rate, int(info.samplerate))
    n = int(info.frames)
    out = np.pad(out, (0, max(0, n - out.shape[0])))[:n]  # the microphone's length, exactly
    write_audio(out_path, out, int(info.samplerate))
    st = canceller.stats
    how = "given" if delay_ms is not None else "measured"
    delay = "no echo found" if st.delay_ms is None else f"{st.delay_ms:.0f} ms ({how})"
    removed = st.removed_db
    return (f"{mic_path}: {mic.shape[0] / rate:.2f} s; echo delay {delay}; removed "
            f"{'n/a (the reference is silent)' if removed is None else f'{removed:.1f} dB'} "
            f"while the reference played; {ms:.2f} ms per 80 ms frame; output lags the "
            f"microphone by {1000 * canceller.latency / rate:.0f} ms")


_warned = False


class TimedStage:
    """The canceller as a stage in front of a step, charging its time to `metrics` ("aec"):
    `clean = stage(mic_frame)`, then `stage.played(answer_frame)`. For `bench`, which has no
    sound devices: the bench's input plays the microphone, the model's answer the speaker."""

    def __init__(self, metrics, rate: int = 24000, frame_size: int = 1920,
                 warn: Callable[[str], None] = print):
        self.metrics = metrics
        self.canceller = make_canceller(True, rate, frame_size, warn=warn)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        import time

        t0 = time.perf_counter()
        clean = self.canceller.process(frame)
        if isinstance(self.canceller, EchoCanceller):
            self.metrics.add_before("aec", 1000.0 * (time.perf_counter() - t0))
        return clean

    def played(self, frame: np.ndarray) -> None:
        self.canceller.played(frame)


def make_canceller(enabled: bool, rate: int = 24000, frame_size: int = 1920,
                   delay_ms: float | None = None, warn: Callable[[str], None] = print, **kw):
    """The canceller for --aec on (a PassThrough for off); without libspeexdsp a PassThrough
    too, after one message through `warn` (once per process)."""
    global _warned
    if not enabled:
        return PassThrough(rate, frame_size)
    if speexdsp.load() is None:
        if not _warned:
            _warned = True
            warn(f"echo cancellation is off: libspeexdsp is not installed "
                 f"({speexdsp.missing_reason()}); {INSTALL_HINT}. With open speakers the model "
                 "will hear itself; use a headset or --aec off to silence this message.")
        return PassThrough(rate, frame_size)
    return EchoCanceller(rate, frame_size, delay_ms=delay_ms, **kw)
