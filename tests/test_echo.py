"""The echo canceller (runtime/audio_io/echo.py) on rooms the test synthesises: the issue's
targets, the delay it finds, the loop it runs in, its fallback without the library and the
offline `aec` command's bad inputs."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bench_aec import (FRAME, RATE, SCENES, double_talk_snr_db, erle_db, make_scene,
                       room_response, run_canceller)
from personaplex_edge.runtime.audio_io import echo as echo_mod
from personaplex_edge.runtime.audio_io import speexdsp

needs_speex = pytest.mark.skipif(
    speexdsp.load() is None,
    reason="libspeexdsp is not installed (apt-get install libspeexdsp1; scripts/install.sh does)")


@pytest.fixture(scope="module")
def scenes():
    return {i: make_scene(*SCENES[i][:5]) for i in range(len(SCENES))}


@needs_speex
@pytest.mark.parametrize("index", [1, 2, 3, 4])  # 120/150/20/90 ms, RT60 0.35-0.5, speech+babble
def test_removes_echo_and_keeps_the_user_in_double_talk(scenes, index):
    """The issue's targets on a scene: >= 20 dB ERLE while only the far end talks (after 2 s),
    >= 10 dB SNR of the user's speech in double talk at a lag within 20 ms, no clipping (the
    output's length is the `aec` command's test). The loop's delay hint is off by the scene's error
    (up to +-30 ms), as a device's reported latency may be."""
    seed, rt60, delay, drr, kind, err = SCENES[index]
    s = scenes[index]
    c = echo_mod.EchoCanceller(delay_ms=delay + err)
    out, ms = run_canceller(c, s["mic"], s["far"])
    erle = erle_db(s["mic"], out, s["far_only"])
    snr, lag = double_talk_snr_db(out, s["user"], s["double_talk"])
    assert erle >= 20.0, (erle, snr)
    assert snr >= 10.0 and abs(lag) <= 0.020 * RATE, (erle, snr, lag)
    assert float(np.abs(out).max()) < 0.9  # the microphone peaked at 0.5: nothing near clipping
    # the microphone itself, before cancelling, is far from the target: the figure measures
    assert double_talk_snr_db(s["mic"], s["user"], s["double_talk"])[0] < 0.0
    assert abs(c.stats.delay_ms - delay) <= 2.0  # it found the true delay despite the hint
    assert c.stats.realignments == 0  # a hint within the margin costs no re-convergence


@needs_speex
def test_library_defaults_miss_a_target_the_combination_meets(scenes):
    """Why the tuning: speex's canceller as it comes (500 ms tail, no alignment, no residual
    suppressor) leaves more than 10 dB of the 20 dB target on the table."""
    s = scenes[1]
    plain = echo_mod.EchoCanceller(tail_ms=500, block_ms=10, suppress=False, track_delay=False,
                                   margin_ms=0)
    out, _ = run_canceller(plain, s["mic"], s["far"])
    assert erle_db(s["mic"], out, s["far_only"]) < 12.0


@needs_speex
def test_cost_per_frame_is_within_3_ms(scenes):
    """The canceller's CPU per 80 ms frame, median: its own thread's CPU time (a busy machine
    makes the wall clock's longer by what other work takes, not this thread's); the wall
    clock's figure is bench_aec.py's ms/frame."""
    s = scenes[0]
    c = echo_mod.EchoCanceller(delay_ms=SCENES[0][2])
    times = []
    for i in range(0, s["mic"].size - FRAME + 1, FRAME):
        c.played(s["far"][i:i + FRAME])
        t0 = time.thread_time()
        c.process(s["mic"][i:i + FRAME])
        times.append(1000 * (time.thread_time() - t0))
    assert float(np.median(times)) <= 3.0, np.median(times)


@needs_speex
def test_delay_is_measured_over_a_recording_and_not_invented(scenes):
    s = scenes[2]  # 150 ms
    assert abs(echo_mod.estimate_delay(s["mic"], s["far"]) - 150.0) <= 2.0
    rng = np.random.default_rng(5)
    unrelated = (0.1 * rng.standard_normal(s["far"].size)).astype(np.float32)
    assert echo_mod.estimate_delay(unrelated, s["far"]) is None


def test_missing_library_passes_through_and_says_so_once(monkeypatch):
    monkeypatch.setattr(speexdsp, "load", lambda: None)
    monkeypatch.setattr(speexdsp, "missing_reason", lambda: "libspeexdsp not found")
    monkeypatch.setattr(echo_mod, "_warned", False)
    said = []
    cancellers = [echo_mod.make_canceller(True, warn=said.append) for _ in range(2)]
    assert len(said) == 1 and "apt-get install libspeexdsp1" in said[0]
    mic = np.linspace(-0.5, 0.5, FRAME, dtype=np.float32)
    for c in cancellers:
        assert isinstance(c, echo_mod.PassThrough) and not c.stats.enabled
        c.played(np.ones(FRAME, np.float32) * 0.1)
        np.testing.assert_array_equal(c.process(mic), mic)
    with pytest.raises(RuntimeError, match="libspeexdsp is missing"):
        echo_mod.EchoCanceller()


class _RoomDevice:
    """A sound card whose microphone hears its own speaker through a room: 20 ms blocks on the
    host clock, the played stream convolved with `h` (+ noise) and fed back as the input; with
    `late_blocks`, the input stream starts that many blocks after the output."""

    def __init__(self, loop, h: np.ndarray, seconds: float, block: int = 480,
                 late_blocks: int = 0):
        self.loop, self.h, self.block, self.late_blocks = loop, h, block, late_blocks
        self.blocks = int(seconds * RATE / block)
        self.played = np.zeros(self.blocks * block + h.size, np.float32)
        self._size = 1 << (h.size + 2 * block).bit_length()
        self._h = np.fft.rfft(h, self._size)
        self.rng = np.random.default_rng(0)

    def run(self):
        b = self.block
        t0 = time.monotonic()
        for k in range(self.blocks):
            time.sleep(max(0.0, t0 + k * b / RATE - time.monotonic()))
            if self.loop.failed():
                return
            start = k * b
            self.loop.on_output(self.played[start:start + b])
            lo = max(0, start + b - (self._size - b))
            seg = np.fft.irfft(np.fft.rfft(self.played[lo:start + b], self._size) * self._h,
                               self._size)
            echo = seg[start - lo:start - lo + b].astype(np.float32)
            if k < self.late_blocks:
                continue
            self.loop.on_input(echo + (1e-4 * self.rng.standard_normal(b)).astype(np.float32))


def _speak_in_a_room(seconds: float, late_blocks: int = 0, metrics=None, spans=None):
    """The duplex loop with the canceller on a device that hears itself (80 ms, RT60 0.3 s),
    its step saying the bundled speech whatever it hears (timing its frames into `metrics`;
    the canceller's own `process` calls, ms each, into `spans`); -> the loop, after `seconds`
    of audio."""
    from personaplex_edge.runtime.audio_io.duplex import DuplexLoop

    speech = make_scene(0)["far"][:int((seconds + 1) * RATE)] * 0.8
    said = [0]

    def step(frame):
        if metrics is not None:
            metrics.start_frame()
        i = said[0] * FRAME
        said[0] += 1
        if metrics is not None:
            metrics.end_frame()
        return speech[i:i + FRAME] if i + FRAME <= speech.size else np.zeros(FRAME, np.float32)

    canceller = echo_mod.EchoCanceller()
    if spans is not None:
        process = canceller.process

        def timed(mic):
            t0 = time.perf_counter()
            out = process(mic)
            spans.append(1000 * (time.perf_counter() - t0))
            return out

        canceller.process = timed
    loop = DuplexLoop(step, echo=canceller, step_metrics=metrics)
    device = _RoomDevice(loop, room_response(0.3, 80, 0.0, np.random.default_rng(1)), seconds,
                         late_blocks=late_blocks)
    loop.start()
    device.run()
    loop.stop()
    return loop


@needs_speex
def test_live_loop_cancels_its_own_echo_and_times_the_stage():
    """What the step receives while it talks is far below what the microphone heard, the
    delay is found from the callbacks' clocks and the estimator, and the step's metrics get
    an "aec" stage."""
    from personaplex_edge.runtime.metrics import FrameMetrics

    metrics, spans = FrameMetrics(), []
    loop = _speak_in_a_room(7.0, metrics=metrics, spans=spans)
    st = loop.stats.echo
    assert st.active_frames > 40
    assert st.removed_db >= 15.0, st.line()
    assert st.delay_ms is not None and 80 <= st.delay_ms <= 80 + 1000 * 3 * FRAME / RATE
    summary = metrics.summary()
    assert "aec" in summary and summary["aec"]["p50"] > 0
    # the step's "aec" stage is the loop's own timing of the canceller, frame for frame
    stage = metrics.table()[:, metrics.stages.index("aec")]
    assert stage.shape[0] == len(spans) == loop.stats.frames > 80
    np.testing.assert_array_equal(stage, loop.stats.timing.table()[:, 0])
    # ... and it holds the canceller's work and little else (not the wait for the next frame,
    # 80 ms): each frame's stage holds its `process` call, and what the stage adds to it
    # (handing over the reference, the delay hint) costs less than the call itself - both
    # measured in the same moments, so a busy machine stretches them alike. The canceller's
    # own cost (<= 3 ms of CPU) is test_cost_per_frame_is_within_3_ms's, and bench_aec.py's.
    spans = np.asarray(spans)
    assert (stage >= spans).all()
    assert np.median(stage - spans) <= np.median(spans), (np.median(stage), np.median(spans))
    assert "removed" in loop.stats.report()[0]


@needs_speex
def test_a_microphone_that_starts_after_the_speaker_is_still_cancelled():
    """The input stream starts 600 ms after the output (slow inputs do: PipeWire, Bluetooth,
    USB), longer than the echo's 80 ms: the microphone's first sample heard what was played
    well into the reference, which the loop must count the microphone from (it removed
    0.5 dB when the delay was clamped at zero instead)."""
    st = _speak_in_a_room(6.0, late_blocks=30).stats.echo
    assert st.active_frames > 30
    assert st.removed_db >= 15.0, st.line()
    assert st.delay_ms is not None and 40 <= st.delay_ms <= 80 + 1000 * 3 * FRAME / RATE


def test_a_step_without_canceller_shows_no_aec_stage():
    from personaplex_edge.runtime.metrics import FrameMetrics

    m = FrameMetrics()
    m.start_frame()
    m.mark("encode")
    m.end_frame()
    assert "aec" not in m.summary() and "encode" in m.summary()
    m.add_before("aec", 2.0)
    m.start_frame()
    m.end_frame()
    row = m.table()[-1]
    assert row[0] == 2.0 and row[-1] >= 2.0  # charged to the stage and to the frame's total


# -- the offline command ----------------------------------------------------------------------

def _cli(*argv):
    from personaplex_edge.cli import main

    return main(list(argv))


@pytest.fixture(scope="module")
def recordings(tmp_path_factory, scenes):
    """mic.wav at 16 kHz, played.wav at 48 kHz (any rate is resampled)."""
    import soundfile as sf
    import soxr

    d = tmp_path_factory.mktemp("aec")
    s = scenes[1]
    sf.write(str(d / "mic.wav"), soxr.resample(s["mic"], RATE, 16000), 16000)
    sf.write(str(d / "played.wav"), soxr.resample(s["far"], RATE, 48000), 48000)
    return d


@needs_speex
def test_aec_command_writes_the_mics_rate_and_length(recordings, capsys):
    import soundfile as sf

    out = recordings / "clean.wav"
    assert _cli("aec", "--mic", str(recordings / "mic.wav"), "--ref",
                str(recordings / "played.wav"), "--output", str(out)) == 0
    line = capsys.readouterr().out
    assert "echo delay 120 ms (measured)" in line, line
    info, mic = sf.info(str(out)), sf.info(str(recordings / "mic.wav"))
    assert (info.samplerate, info.frames) == (mic.samplerate, mic.frames)
    clean, _ = sf.read(str(out), dtype="float32")
    raw, _ = sf.read(str(recordings / "mic.wav"), dtype="float32")
    a, b = 2 * 16000, 6 * 16000  # far end only
    assert 10 * np.log10(np.sum(raw[a:b] ** 2) / np.sum(clean[a:b] ** 2)) >= 20.0


@pytest.mark.parametrize("case", ["missing mic", "not audio", "nan ref", "empty ref",
                                  "bad delay"])
def test_aec_command_bad_inputs_are_one_message_and_no_output(recordings, tmp_path, capsys,
                                                             case):
    import soundfile as sf

    mic, ref = recordings / "mic.wav", recordings / "played.wav"
    extra = []
    if case == "missing mic":
        mic = tmp_path / "nope.wav"
    elif case == "not audio":
        ref = tmp_path / "ref.wav"
        ref.write_bytes(b"this is not a sound file at all" * 10)
    elif case == "nan ref":
        ref = tmp_path / "ref.wav"
        sf.write(str(ref), np.full(4800, np.nan, np.float32), 24000, subtype="FLOAT")
    elif case == "empty ref":
        ref = tmp_path / "ref.wav"
        sf.write(str(ref), np.zeros(0, np.float32), 24000)
    else:
        extra = ["--delay-ms", "-5"]
    out = tmp_path / "clean.wav"
    code = _cli("aec", "--mic", str(mic), "--ref", str(ref), "--output", str(out), *extra)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("personaplex-edge: error:") == 1 and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".clean.wav*"))


def test_aec_command_without_the_library_refuses(recordings, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(speexdsp, "load", lambda: None)
    out = tmp_path / "clean.wav"
    code = _cli("aec", "--mic", str(recordings / "mic.wav"), "--ref",
                str(recordings / "played.wav"), "--output", str(out))
    assert code == 2 and "libspeexdsp1" in capsys.readouterr().err
    assert not out.exists()


def test_mic_parser_takes_aec_and_defaults_to_on():
    from personaplex_edge.cli import build_parser

    p = build_parser()
    assert p.parse_args(["mic"]).aec == "on"
    assert p.parse_args(["mic", "--aec", "off"]).aec == "off"
    with pytest.raises(SystemExit):
        p.parse_args(["mic", "--aec", "maybe"])

