"""The duplex loop without sound devices: rings, bounded latency, drops and underruns."""

from __future__ import annotations

import re
import threading
import time
import types

import numpy as np
import pytest

from personaplex_edge.runtime.audio_io.duplex import DuplexLoop
from personaplex_edge.runtime.metrics import FrameMetrics
from personaplex_edge.runtime.audio_io.paced_file import run_paced
from personaplex_edge.runtime.audio_io.sample_ring import SampleRing

FRAME = 1920


def test_ring_keeps_order_across_the_wrap_and_drops_oldest():
    ring = SampleRing(10)
    ring.write(np.arange(6, dtype=np.float32))
    out = np.empty(4, np.float32)
    assert ring.read_exact(out, timeout=0)
    np.testing.assert_array_equal(out, [0, 1, 2, 3])
    ring.write(np.arange(6, 14, dtype=np.float32))  # 2 + 8 = 10 samples: exactly full, wraps
    assert len(ring) == 10 and ring.overwritten == 0
    ring.write(np.array([14, 15, 16], np.float32))  # 3 too many: the 3 oldest go
    assert ring.overwritten == 3
    full = np.empty(10, np.float32)
    assert ring.read_exact(full, timeout=0)
    np.testing.assert_array_equal(full, np.arange(7, 17))


def test_ring_underrun_pads_with_silence_and_counts():
    ring = SampleRing(8)
    ring.write(np.ones(3, np.float32))
    out = np.full(5, 7.0, np.float32)
    ring.read_or_silence(out)
    np.testing.assert_array_equal(out, [1, 1, 1, 0, 0])
    assert ring.underruns == 1 and ring.underrun_samples == 2
    assert not ring.read_exact(np.empty(1, np.float32), timeout=0.01)


def _numbered(k: int, n: int = FRAME) -> np.ndarray:
    """Block k of a signal whose every sample holds its own index (exact in float32 < 2**24):
    whatever the loop hands on says where in the input it came from."""
    return np.arange(k * n, (k + 1) * n, dtype=np.float32)


def _until(condition, timeout: float = 60.0) -> None:
    """Returns once condition() holds (the worker is a thread of its own: a busy machine may
    run it late); AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.01)


def _drive(loop: DuplexLoop, frames: int, period: float, fed: list | None = None) -> None:
    """Plays the role of the sound device: one numbered frame in and one frame out per period
    (`fed` gets the index one past the newest sample fed, with the time)."""
    out = np.empty(FRAME, np.float32)
    t_next = time.perf_counter()
    for k in range(frames):
        loop.on_input(_numbered(k))
        if fed is not None:
            fed.append(((k + 1) * FRAME, time.perf_counter()))
        loop.on_output(out)
        t_next += period
        time.sleep(max(0.0, t_next - time.perf_counter()))


def test_fast_step_processes_every_frame_in_order():
    seen = []

    def step(frame):
        seen.append(frame.copy())
        return frame * 2.0

    # a backlog as long as the drive: a worker the scheduler stalls (the suite runs beside
    # other work) catches up instead of dropping; dropping is the next test's
    loop = DuplexLoop(step, max_backlog_frames=25)
    loop.start()
    _drive(loop, 25, period=0.01)
    _until(lambda: loop.stats.frames >= 25)
    loop.stop()
    assert loop.stats.frames == 25 and loop.stats.dropped_frames == 0
    # every frame, whole and in its place: frame k holds samples k*1920 .. k*1920 + 1919
    np.testing.assert_array_equal(np.concatenate(seen), np.arange(25 * FRAME, dtype=np.float32))


def test_a_worker_behind_skips_to_the_newest_frames():
    """While a step is busy three frames arrive; with max_backlog_frames=1 the next step must
    get the newest one, and the two older ones are dropped and counted (not played late)."""
    busy, release = threading.Event(), threading.Event()
    seen = []

    def step(frame):
        seen.append(int(frame[0]) // FRAME)
        if len(seen) == 1:
            busy.set()
            release.wait(60)
        return frame

    loop = DuplexLoop(step, max_backlog_frames=1)
    loop.start()
    loop.on_input(_numbered(0))
    assert busy.wait(60)
    for k in (1, 2, 3):  # the ring holds max_backlog + 2 = 3 frames: nothing overwritten
        loop.on_input(_numbered(k))
    release.set()
    _until(lambda: len(seen) >= 2)
    loop.on_input(_numbered(4))
    _until(lambda: len(seen) >= 3)  # the frame after is stepped too
    loop.stop()
    assert seen == [0, 3, 4], seen
    assert loop.stats.dropped_frames == 2


def test_slow_step_drops_oldest_frames_and_latency_stays_bounded():
    """Every step takes longer than a frame: frames are dropped and counted, and each frame
    the step gets is recent: at most the allowed backlog plus what arrived during one step
    behind the newest input (without the drop-oldest rule the ring would hand out frames a
    full ring, max_backlog + 2 frames, old)."""
    period = 0.02
    fed: list = []
    lag = []

    def slow(frame):
        newest = fed[-1][0] if fed else 0
        lag.append((newest - int(frame[-1]) - 1) / FRAME)  # frames between it and the newest
        time.sleep(period * 2.5)
        return frame

    loop = DuplexLoop(slow, max_backlog_frames=2)
    loop.start()
    _drive(loop, 60, period=period, fed=fed)
    loop.stop()
    s = loop.stats
    assert s.frames + s.dropped_frames >= 50  # every frame was either processed or dropped
    assert s.dropped_frames >= 20
    assert s.underruns > 0  # the output could not keep up either
    # after a step, keep 2 waiting, take 1: the step sees a frame ~1-2 frames old, plus one
    # step's arrivals (2.5) at most before the next drop; a full ring would mean 4+ frames
    steady = sorted(lag[3:])
    assert steady and steady[len(steady) // 2] <= 2.0, lag


def test_a_device_that_stops_calling_back_ends_the_session():
    """An input that delivers and then falls silent while its stream still says it runs: the
    worker ends the session with a clear AudioDeviceError within the stall time."""
    from personaplex_edge.errors import AudioDeviceError

    loop = DuplexLoop(lambda frame: frame)
    loop.stall_seconds = 0.5
    assert loop.alive()  # the device keeps reporting itself active
    loop.start()
    for k in range(3):
        loop.on_input(_numbered(k))
        time.sleep(0.02)
    deadline = time.monotonic() + 60
    while loop.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not loop.running, "the worker waits forever on a device that stopped"
    with pytest.raises(AudioDeviceError, match="stopped delivering samples") as stalled:
        loop.stop()
    # ended by its own stall clock, set to 0.5 s: the loop's own account of the silence it
    # waited, under the default stall time (3 s), however late a busy machine ran the test
    waited = int(re.search(r"samples (\d+) s ago while its device still reports itself "
                           r"running", str(stalled.value)).group(1))
    assert waited < 3, str(stalled.value)
    assert loop.stats.frames == 3


def test_a_device_that_never_starts_is_a_stall_too():
    from personaplex_edge.errors import AudioDeviceError

    loop = DuplexLoop(lambda frame: frame)
    loop.startup_seconds = 0.3
    loop.start()
    loop._thread.join(3)
    with pytest.raises(AudioDeviceError):
        loop.stop()


def test_answer_overwritten_by_a_slow_output_clock_is_counted():
    """An output device that consumes nothing (its clock far slower than the input's): the
    output ring overflows and the lost answer is counted, in samples, and reported."""
    # a backlog as long as the input: a worker a busy machine runs late drops nothing
    loop = DuplexLoop(lambda frame: frame, buffer_frames=1, max_backlog_frames=12)
    loop.start()
    for k in range(12):
        loop.on_input(_numbered(k))
        time.sleep(0.01)
    _until(lambda: loop.stats.frames >= 12)  # every answer written
    loop.stop()
    # 1 frame of start-up silence + 12 answers into a ring of 5 frames (+1 sample)
    assert loop.stats.output_lost == (1 + 12) * FRAME - loop.output.capacity
    assert "overwritten" in " ".join(loop.stats.report())


def test_ring_overwrite_count_is_taken_and_reset_together():
    ring = SampleRing(4)
    ring.write(np.arange(6, dtype=np.float32))
    assert ring.take_overwritten() == 2
    assert ring.take_overwritten() == 0
    ring.write(np.arange(3, dtype=np.float32))
    assert ring.take_overwritten() == 3


def test_worker_error_reaches_the_caller():
    def broken(frame):
        raise ValueError("model exploded")

    loop = DuplexLoop(broken)
    loop.start()
    loop.on_input(np.zeros(FRAME, np.float32))
    deadline = time.time() + 60
    while loop.running and time.time() < deadline:
        time.sleep(0.01)
    try:
        loop.stop()
    except ValueError as e:
        assert "model exploded" in str(e)
    else:
        raise AssertionError("the worker's error was swallowed")


def test_device_rate_is_resampled_in_the_worker():
    """A 48 kHz device: the step still sees 1920-sample frames at 24 kHz, the device gets 3840."""
    sizes = []

    def step(frame):
        sizes.append(frame.shape[0])
        return frame

    # a backlog as long as the input: a worker a busy machine runs late drops nothing
    loop = DuplexLoop(step, input_rate=48000, output_rate=48000, max_backlog_frames=10)
    loop.start()
    for _ in range(10):
        loop.on_input(np.zeros(2 * FRAME, np.float32))
        time.sleep(0.005)
    _until(lambda: loop.stats.frames >= 8)
    loop.stop()
    assert sizes and set(sizes) == {FRAME}
    assert loop.stats.frames >= 8
    assert len(loop.output) > 2 * FRAME  # output came back at the device rate


def test_frame_metrics_percentiles_and_budget():
    m = FrameMetrics(stages=("encode", "host"), capacity=8)
    for i in range(12):  # more than the capacity: only the newest 8 are kept
        m.start_frame()
        m._row[0] = 10.0 * i
        m._row[-1] = 0.0
        m.end_frame()
    t = m.table()
    assert t.shape == (8, 3)
    np.testing.assert_array_equal(t[:, 0], 10.0 * np.arange(4, 12))
    s = m.summary()
    assert s["frames"] == 8 and s["encode"]["max"] == 110.0
    assert s["over_budget"] == 0  # recorded wall time is tiny; stage values are not wall time


def test_paced_file_is_heard_in_real_time_and_answered_after_the_loop_latency():
    """An identity step through the paced file device: the speaker plays the recording back,
    shifted by the loop's latency (a frame to collect, the start-up buffer), not faster than
    real time, and with nothing lost or repeated."""
    rate, seconds = 24000, 1.6
    pcm = (np.random.default_rng(1).standard_normal(int(rate * seconds)) * 0.1).astype(np.float32)
    t0 = time.monotonic()
    buffer = 3  # frames of start-up silence: 240 ms of slack for a busy machine's scheduler
    played, loop = run_paced(lambda frame: frame, pcm, block_seconds=0.02, tail_seconds=0.4,
                             buffer_frames=buffer)
    wall = time.monotonic() - t0
    assert wall >= seconds + 0.4 - 0.03  # paced by the clock, not as fast as it can
    assert loop.stats.dropped_frames == 0 and loop.stats.underruns == 0
    assert loop.stats.frames == -(-(pcm.size + int(0.4 * rate)) // 480) * 480 // FRAME
    # the lag of the echo, from the cross-correlation of the two signals
    spectrum = np.fft.rfft(played, 2 * played.size) * np.conj(np.fft.rfft(pcm, 2 * played.size))
    lag = int(np.argmax(np.fft.irfft(spectrum)[:played.size]))
    # a frame to collect and the buffer; a worker (or the clock thread) late around the first
    # frame adds a few blocks, the same for the rest of the run
    assert (1 + buffer) * FRAME <= lag <= (1 + buffer) * FRAME + 6 * 480, lag
    assert lag + pcm.size <= played.size  # the tail let the whole recording come back
    np.testing.assert_array_equal(played[lag:lag + pcm.size], pcm)
    assert not np.any(played[:lag - FRAME])  # silence before the first answer


def test_paced_file_with_a_slow_step_drops_frames_like_a_live_device():
    def slow(frame):
        time.sleep(0.15)  # nearly two frames' time per frame
        return frame

    pcm = np.zeros(int(24000 * 2.0), np.float32)
    played, loop = run_paced(slow, pcm, block_seconds=0.02)
    s = loop.stats
    assert played.shape == pcm.shape
    assert s.dropped_frames >= 5 and s.frames <= 15


def test_live_status_warns_once_when_the_machine_is_slower_than_real_time(capsys):
    """Frames slower than their 80 ms of audio: the status line says so once, with the fix;
    a machine that keeps up gets no warning."""
    from personaplex_edge.commands.live import LiveStatus

    def slow(frame):
        time.sleep(0.1)
        return frame

    pcm = np.zeros(int(24000 * 1.6), np.float32)
    for step, expect in ((slow, 1), (lambda frame: frame, 0)):
        status = LiveStatus(warn_after_frames=5)
        run_paced(step, pcm, on_tick=status, tick_seconds=0.1)
        err = capsys.readouterr().err
        assert err.count("slower than real time") == expect, err
        assert "frames " in err  # the status line itself


class _SlowOpeningDevices:
    """A stand-in for the sounddevice module: streams that take `open_s` to start (a
    Bluetooth or USB device waking up), then call back every 20 ms from their own threads."""

    def __init__(self, open_s: float):
        self.open_s = open_s

    def check_input_settings(self, *a, **k):
        pass

    check_output_settings = check_input_settings

    def _stream(self, samplerate, blocksize, callback, output: bool, **kw):
        devices = self

        class Stream:
            latency = 0.02
            active = False

            def __enter__(self):
                time.sleep(devices.open_s)
                self.active = True
                self._thread = threading.Thread(target=self._run, daemon=True)
                self._thread.start()
                return self

            def _run(self):
                block = np.zeros((samplerate // 50, 1), np.float32)
                status = types.SimpleNamespace(input_overflow=False)
                while self.active:
                    callback(block, block.shape[0], None, status)
                    time.sleep(0.02)

            def __exit__(self, *exc):
                self.active = False
                self._thread.join()

        return Stream()

    def InputStream(self, **kw):
        return self._stream(output=False, **kw)

    def OutputStream(self, **kw):
        return self._stream(output=True, **kw)


def test_the_stall_clock_starts_once_the_devices_run(monkeypatch):
    """Opening the devices takes longer than the loop allows a device to stay silent at the
    start: that wait is not a stall, because the loop's clock starts once both streams run."""
    from personaplex_edge.runtime.audio_io import devices
    from personaplex_edge.runtime.audio_io.duplex import DuplexLoop

    monkeypatch.setattr(devices, "_sd", lambda: _SlowOpeningDevices(open_s=0.6))
    original = DuplexLoop.__init__

    def impatient(self, *a, **k):
        original(self, *a, **k)
        self.startup_seconds = 0.5  # shorter than opening the two streams takes (1.2 s)

    monkeypatch.setattr(DuplexLoop, "__init__", impatient)
    loop = devices.run_on_devices(lambda frame: frame, duration=1.0, tick_seconds=0.05)
    # (what the input delivered while the output opened is old by then: dropped, as always)
    assert loop.stats.frames > 0 and loop.stats.frames + loop.stats.dropped_frames >= 8
