"""The duplex loop without sound devices: rings, bounded latency, drops and underruns."""

from __future__ import annotations

import time

import numpy as np

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


def _drive(loop: DuplexLoop, frames: int, period: float) -> None:
    """Plays the role of the sound device: one frame in and one frame out per period."""
    out = np.empty(FRAME, np.float32)
    rng = np.random.default_rng(0)
    t_next = time.perf_counter()
    for _ in range(frames):
        loop.on_input((rng.standard_normal(FRAME) * 0.1).astype(np.float32))
        loop.on_output(out)
        t_next += period
        time.sleep(max(0.0, t_next - time.perf_counter()))


def test_fast_step_processes_every_frame_in_order():
    seen = []

    def step(frame):
        seen.append(frame.copy())
        return frame * 2.0

    loop = DuplexLoop(step, max_backlog_frames=2)
    loop.start()
    _drive(loop, 25, period=0.01)
    time.sleep(0.1)
    loop.stop()
    assert loop.stats.frames == 25 and loop.stats.dropped_frames == 0
    assert len(seen) == 25 and not any(np.array_equal(seen[0], s) for s in seen[1:])


def test_slow_step_drops_oldest_frames_and_latency_stays_bounded():
    """Every step takes longer than a frame: frames are dropped and counted, the backlog and the
    rings never grow past their bounds, and the loop still stops cleanly."""
    period = 0.02
    backlog_seen = []

    def slow(frame):
        backlog_seen.append(len(loop.input))
        time.sleep(period * 2.5)
        return frame

    loop = DuplexLoop(slow, max_backlog_frames=2)
    loop.start()
    _drive(loop, 60, period=period)
    loop.stop()
    s = loop.stats
    assert s.frames + s.dropped_frames >= 50  # every frame was either processed or dropped
    assert s.dropped_frames >= 20
    assert s.underruns > 0  # the output could not keep up either
    assert max(backlog_seen) <= loop.input.capacity
    assert s.max_backlog_frames <= loop.max_backlog_frames + 3
    assert len(loop.output) <= loop.output.capacity


def test_worker_error_reaches_the_caller():
    def broken(frame):
        raise ValueError("model exploded")

    loop = DuplexLoop(broken)
    loop.start()
    loop.on_input(np.zeros(FRAME, np.float32))
    deadline = time.time() + 5
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

    loop = DuplexLoop(step, input_rate=48000, output_rate=48000)
    loop.start()
    for _ in range(10):
        loop.on_input(np.zeros(2 * FRAME, np.float32))
        time.sleep(0.005)
    time.sleep(0.2)
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
    assert s.max_backlog_frames <= loop.max_backlog_frames + 3


def test_live_status_warns_once_when_the_machine_is_slower_than_real_time(capsys):
    """Frames slower than their 80 ms of audio: the status line says so once, with the fix;
    a machine that keeps up gets no warning."""
    from personaplex_edge.cli import _LiveStatus

    def slow(frame):
        time.sleep(0.1)
        return frame

    pcm = np.zeros(int(24000 * 1.6), np.float32)
    for step, expect in ((slow, 1), (lambda frame: frame, 0)):
        status = _LiveStatus(warn_after_frames=5)
        run_paced(step, pcm, on_tick=status, tick_seconds=0.1)
        err = capsys.readouterr().err
        assert err.count("slower than real time") == expect, err
        assert "frames " in err  # the status line itself
