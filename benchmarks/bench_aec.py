"""Echo cancellation on synthetic rooms: echo removed, the user's speech kept, cost per frame.

    python benchmarks/bench_aec.py [--scenes N] [--json out.json]

A scene (make_scene) is what a microphone beside a speaker hears: the played answer through a
synthetic room (exponentially decaying impulse response, RT60 0.2-0.5 s, bulk delay 20-150 ms,
direct-to-reverberant ratio -6..+6 dB) arriving up to 3 dB louder than the user, the user's
speech during a double-talk stretch, and noise 35 dB below the echo. The played answer and the
user are the bundled speech sample (the user's reversed and pitched down, so the two never
correlate) or a harmonic babble (gliding pitch through formant filters, syllable-like bursts).

Figures (the issue's targets):
    ERLE        mic energy / output energy while only the far end talks, from 2 s on (>= 20 dB)
    DT SNR      output against the user-only signal during double talk, at the best gain and a
                lag within 20 ms (>= 10 dB)
    ms/frame    the canceller's time per 80 ms frame (<= 3 ms)

Configurations: each library as it comes (speexdsp's canceller with a 500 ms tail; the same
with its preprocessor; WebRTC AEC3 through livekit when installed) and the runtime's canceller
(runtime/audio_io/echo.py) told the delay with an error of up to +-30 ms, as the live loop's
hint may be, or told nothing (its delay estimator alone; the offline command measures the
delay over the whole file first instead).

The tests (tests/test_echo.py) import the scenes and figures from here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

RATE = 24000
FRAME = 1920
SPEECH = Path(__file__).resolve().parent.parent / "personaplex_edge" / "data" / "hello.wav"

# (seed, RT60 s, delay ms, direct-to-reverberant dB, far-end kind, hint error ms)
SCENES = [
    (0, 0.25, 40, 3.0, "speech", 0),
    (1, 0.45, 120, 0.0, "speech", 25),
    (2, 0.35, 150, -3.0, "speech", -25),
    (3, 0.50, 20, 6.0, "speech", 30),
    (4, 0.45, 90, -6.0, "harmonic", -20),
    (5, 0.20, 70, 0.0, "harmonic", 10),
]


def _speech() -> np.ndarray:
    from personaplex_edge.audio import read_audio

    return read_audio(SPEECH, RATE)  # [T] f32 at 24 kHz


def _fftconv(x: np.ndarray, h: np.ndarray, n: int) -> np.ndarray:
    size = 1 << (x.size + h.size - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(h, size), size)[:n].astype(np.float32)


def room_response(rt60: float, delay_ms: float, drr_db: float, rng) -> np.ndarray:
    """h [delay + tail] f32: a direct path of 1 after `delay_ms`, then a diffuse tail decaying
    60 dB in `rt60` s, starting 3 ms later, scaled to `drr_db` below the direct path."""
    n = int(RATE * min(1.0, 1.5 * rt60))
    t = np.arange(n) / RATE
    tail = rng.standard_normal(n) * np.exp(-6.9 * t / rt60)
    tail[:int(0.003 * RATE)] = 0.0
    tail = np.convolve(tail, np.ones(4) / 4, "same")  # walls absorb the highest frequencies
    tail *= np.sqrt(10 ** (-drr_db / 10) / np.sum(tail ** 2))
    d = int(RATE * delay_ms / 1000)
    h = np.zeros(d + n, np.float32)
    h[d:] += tail
    h[d] += 1.0
    return h


def harmonic_babble(seconds: float, rng, f0: float = 140.0) -> np.ndarray:
    """[T] f32: voiced bursts (a gliding pitch's harmonics through three formant resonances)
    of 150-400 ms with 50-250 ms gaps: speech-like in spectrum and rhythm, no words."""
    n = int(RATE * seconds)
    out = np.zeros(n, np.float32)
    i = 0
    while i < n:
        m = int(RATE * rng.uniform(0.15, 0.4))
        t = np.arange(m) / RATE
        pitch = f0 * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(1, 4) * t + rng.uniform(0, 6)))
        phase = 2 * np.pi * np.cumsum(pitch) / RATE
        formants = rng.uniform([300, 900, 2200], [800, 1800, 3200])
        burst = np.zeros(m)
        for k in range(1, int(4000 / f0)):
            fk = k * pitch.mean()
            gain = sum(1.0 / (1 + ((fk - f) / 120.0) ** 2) for f in formants) / k ** 0.5
            burst += gain * np.sin(k * phase)
        burst *= np.hanning(m)
        out[i:i + m] = burst[:max(0, min(m, n - i))]
        i += m + int(RATE * rng.uniform(0.05, 0.25))
    return out / (np.abs(out).max() + 1e-9) * 0.5


def make_scene(seed: int = 0, rt60: float = 0.35, delay_ms: float = 80.0, drr_db: float = 0.0,
               far_kind: str = "speech", seconds: float = 12.0, echo_over_user_db: float = 3.0,
               noise_db: float = -35.0, double_talk: tuple[float, float] = (6.0, 10.0)) -> dict:
    """A microphone recording and its parts, each [seconds * RATE] f32:
    mic = echo + user + noise; far = what was played; far-only and double-talk ranges (samples)."""
    rng = np.random.default_rng(seed)
    n = int(RATE * seconds)
    speech = _speech()
    if far_kind == "speech":
        slow = np.interp(np.arange(0, speech.size, 1 / 1.15), np.arange(speech.size), speech)
        far = np.concatenate([speech, slow.astype(np.float32), speech[::-1]])
    else:
        far = harmonic_babble(seconds, rng)
    far = np.pad(far, (0, max(0, n - far.size)))[:n].astype(np.float32)
    echo = _fftconv(far, room_response(rt60, delay_ms, drr_db, rng), n)
    # the user: the sample reversed and pitched down (no correlation with the played answer)
    rev = speech[::-1]
    low = np.interp(np.arange(0, rev.size, 1 / 1.2), np.arange(rev.size), rev).astype(np.float32)
    a, b = int(RATE * double_talk[0]), int(RATE * double_talk[1])
    user = np.zeros(n, np.float32)
    user[a:b] = low[:b - a]

    def active_rms(x):
        return float(np.sqrt(np.mean(x[np.abs(x) > 1e-3 * np.abs(x).max()] ** 2)))

    user *= 10 ** (-echo_over_user_db / 20) * active_rms(echo[a:b]) / active_rms(user[a:b])
    noise = (rng.standard_normal(n) * active_rms(echo) * 10 ** (noise_db / 20)).astype(np.float32)
    mic = echo + user + noise
    scale = 0.5 / float(np.abs(mic).max())  # a microphone well below clipping
    return {"mic": mic * scale, "far": far, "echo": echo * scale, "user": user * scale,
            "noise": noise * scale, "far_only": (2 * RATE, a), "double_talk": (a, b)}


def erle_db(mic: np.ndarray, out: np.ndarray, span: tuple[int, int]) -> float:
    a, b = span
    return 10 * float(np.log10(np.sum(mic[a:b] ** 2) / max(1e-30, float(np.sum(out[a:b] ** 2)))))


def double_talk_snr_db(out: np.ndarray, user: np.ndarray, span: tuple[int, int],
                       max_lag_ms: float = 20.0) -> tuple[float, int]:
    """(SNR of out against g * user shifted by a lag, best over g and |lag| <= max_lag_ms;
    that lag in samples)."""
    a, b = span
    max_lag = int(round(RATE * max_lag_ms / 1000))
    u = user[a:b].astype(np.float64)  # [L]
    lo, hi = max(0, a - max_lag), min(out.size, b + max_lag)
    o = out[lo:hi].astype(np.float64)  # [L + 2 max_lag] (less at the edges)
    size = 1 << (o.size + u.size).bit_length()
    # corr[k] = sum_t o[k + t] u[t]: every lag at once
    corr = np.fft.irfft(np.fft.rfft(o, size) * np.conj(np.fft.rfft(u, size)), size)
    csum = np.concatenate([[0.0], np.cumsum(o * o)])
    uu = float(np.dot(u, u))
    best, best_lag = -np.inf, 0
    for lag in range(-max_lag, max_lag + 1):
        k = a + lag - lo
        if k < 0 or k + u.size > o.size:
            continue
        c = float(corr[k])
        if c <= 0:
            continue
        oo = csum[k + u.size] - csum[k]
        g = c / uu
        err = oo - g * c  # |o - g u|^2 at the optimal g
        snr = 10 * np.log10(g * c / max(err, 1e-30))
        if snr > best:
            best, best_lag = float(snr), lag
    return best, best_lag


def run_canceller(canceller, mic: np.ndarray, far: np.ndarray) -> tuple[np.ndarray, float]:
    """Frame by frame, as the live loop does: (output [T] f32, ms per frame)."""
    n = mic.size // FRAME * FRAME
    out = np.array(mic, np.float32)  # a trailing part frame passes through
    t0 = time.perf_counter()
    for i in range(0, n, FRAME):
        canceller.played(far[i:i + FRAME])
        out[i:i + FRAME] = canceller.process(mic[i:i + FRAME])
    return out, 1000 * (time.perf_counter() - t0) / (n // FRAME)


def webrtc_aec3(mic: np.ndarray, far: np.ndarray) -> tuple[np.ndarray, float]:
    """livekit's AudioProcessingModule (WebRTC AEC3) with its defaults, 10 ms frames at
    48 kHz (whole signals resampled with soxr first, so no chunking delay is added): the
    library as it comes, for comparison. (output [T] f32, ms per 80 ms of audio)."""
    import soxr
    from livekit import rtc

    apm = rtc.AudioProcessingModule(echo_cancellation=True)
    m48 = soxr.resample(mic, RATE, 48000).astype(np.float32)
    r48 = soxr.resample(far, RATE, 48000).astype(np.float32)
    out = np.zeros_like(m48)

    def frame(x):
        pcm = np.clip(x * 32768, -32768, 32767).astype(np.int16)
        return rtc.AudioFrame(pcm.tobytes(), 48000, 1, 480)

    t0 = time.perf_counter()
    for i in range(0, m48.size - 479, 480):
        apm.process_reverse_stream(frame(r48[i:i + 480]))
        f = frame(m48[i:i + 480])
        apm.set_stream_delay_ms(0)
        apm.process_stream(f)
        out[i:i + 480] = np.frombuffer(f.data, np.int16).astype(np.float32) / 32768
    ms = 1000 * (time.perf_counter() - t0) / (mic.size / FRAME)
    return soxr.resample(out, 48000, RATE).astype(np.float32)[:mic.size], ms


def configurations(hint_error_ms: float, delay_ms: float) -> dict:
    """name -> runner (mic, far) -> (output, ms per frame); None when its library is missing."""
    from personaplex_edge.runtime.audio_io import speexdsp
    from personaplex_edge.runtime.audio_io.echo import EchoCanceller

    have_speex = speexdsp.load() is not None
    out = {}

    def runner(**kw):
        if not have_speex:
            return None
        return lambda mic, far: run_canceller(EchoCanceller(**kw), mic, far)

    out = {}
    out["speexdsp linear, defaults (500 ms tail)"] = runner(
        tail_ms=500, block_ms=10, suppress=False, track_delay=False, margin_ms=0)
    out["speexdsp + its preprocessor, defaults"] = runner(
        tail_ms=500, block_ms=10, suppress=True, track_delay=False, margin_ms=0)
    try:
        import livekit.rtc  # noqa: F401
        out["WebRTC AEC3 (livekit), defaults"] = webrtc_aec3
    except ImportError:
        out["WebRTC AEC3 (livekit), defaults"] = None
    out["tuned, delay hint off by the scene's error"] = runner(delay_ms=delay_ms + hint_error_ms)
    out["tuned, no hint (estimator only)"] = runner()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenes", type=int, default=len(SCENES))
    p.add_argument("--json", help="write the rows here too")
    args = p.parse_args(argv)
    rows = []
    print(f"{'scene':34} {'configuration':44} {'ERLE dB':>8} {'DT SNR dB':>10} {'lag ms':>7} "
          f"{'ms/frame':>9} {'peak':>5}")
    for seed, rt60, delay, drr, kind, err in SCENES[:args.scenes]:
        s = make_scene(seed, rt60, delay, drr, kind)
        name = f"RT60 {rt60:.2f} s, {delay} ms, DRR {drr:+.0f}, {kind}"
        for config, run in configurations(err, delay).items():
            if run is None:
                print(f"{name:34} {config:44} (library not installed)")
                continue
            out, ms = run(s["mic"], s["far"])
            erle = erle_db(s["mic"], out, s["far_only"])
            snr, lag = double_talk_snr_db(out, s["user"], s["double_talk"])
            peak = float(np.abs(out).max())
            rows.append({"scene": name, "config": config, "erle_db": erle, "dt_snr_db": snr,
                         "lag_ms": 1000 * lag / RATE, "ms_per_frame": ms, "peak": peak,
                         "hint_error_ms": err})
            print(f"{name:34} {config:44} {erle:8.1f} {snr:10.1f} {1000 * lag / RATE:7.1f} "
                  f"{ms:9.2f} {peak:5.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
