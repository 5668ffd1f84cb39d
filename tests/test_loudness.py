"""BS.1770-4 integrated loudness and normalisation (personaplex_edge.loudness) against pyloudnorm,
which the reference uses on voice prompts, and against the standard's own calibration point."""

from __future__ import annotations

import numpy as np
import pytest

from personaplex_edge.errors import AudioError
from personaplex_edge.loudness import (impulse_response, integrated_loudness, k_weighting,
                                       normalize_loudness)

RATES = (8000, 16000, 24000, 44100, 48000)


def _signals(rate: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rate)
    t = np.arange(int(3.3 * rate)) / rate
    quiet_gap = rng.standard_normal(t.size) * 0.3
    quiet_gap[rate // 2: 2 * rate] *= 0.01  # 1.5 s 40 dB down: the relative gate drops it
    return {
        "noise": rng.standard_normal(t.size) * 0.1,
        "tone_1k": 0.5 * np.sin(2 * np.pi * 1000 * t),
        "tone_40": 0.5 * np.sin(2 * np.pi * 40 * t),  # on the RLB high-pass slope
        "tone_high": 0.3 * np.sin(2 * np.pi * 0.4 * rate * t),  # on the shelf
        "gated": quiet_gap,
        "stereo": rng.standard_normal((t.size, 2)) * [0.2, 0.05],
        "surround": rng.standard_normal((t.size, 5)) * 0.05,
    }


@pytest.mark.parametrize("rate", RATES)
def test_matches_pyloudnorm(rate):
    pyln = pytest.importorskip("pyloudnorm", reason="pyloudnorm (dev extra) is the reference")
    meter = pyln.Meter(rate)
    for name, x in _signals(rate).items():
        ours = integrated_loudness(x, rate)
        want = meter.integrated_loudness(x)
        assert abs(ours - want) < 1e-6, (name, ours, want)


def test_filter_matches_a_recursive_biquad_cascade():
    """The FFT convolution is the recursive filter from rest, to rounding (direct form here)."""
    rate = 24000
    b, a = k_weighting(rate)
    x = np.random.default_rng(0).standard_normal(3000)
    y = np.zeros_like(x)
    for n in range(x.size):  # y[n] = sum b_k x[n-k] - sum_{k>0} a_k y[n-k]
        acc = sum(b[k] * x[n - k] for k in range(len(b)) if n >= k)
        y[n] = acc - sum(a[k] * y[n - k] for k in range(1, len(a)) if n >= k)
    from personaplex_edge.loudness import apply_filter

    np.testing.assert_allclose(apply_filter(b, a, x[:, None])[:, 0], y, atol=1e-10)
    assert abs(impulse_response(b, a)[-1]) < 1e-11  # the truncated tail is negligible


def test_calibration_point_of_the_standard():
    """BS.1770: a 997 Hz sine at 0 dBFS in one channel reads -3.01 LKFS. (-3.05 here and in
    pyloudnorm: its cookbook-derived shelf is ~0.04 dB off the standard's 48 kHz table.)"""
    rate = 48000
    t = np.arange(5 * rate) / rate
    assert integrated_loudness(np.sin(2 * np.pi * 997 * t), rate) == pytest.approx(-3.01, abs=0.05)


def test_relative_gate_ignores_the_quiet_part():
    rate = 16000
    rng = np.random.default_rng(1)
    loud = rng.standard_normal(4 * rate) * 0.1
    both = np.concatenate([loud, loud * 0.003])  # 50 dB down: below the relative gate
    # ungated, half the time at -50 dB would read ~3 dB lower; gated, only the blocks that
    # straddle the step pull it down a little
    assert integrated_loudness(both, rate) == pytest.approx(integrated_loudness(loud, rate),
                                                            abs=0.3)


@pytest.mark.parametrize("target", [-24.0, -16.0])
def test_normalize_reaches_the_target(target):
    rate = 24000
    x = (np.random.default_rng(2).standard_normal(3 * rate) * 0.02).astype(np.float32)
    y = normalize_loudness(x, rate, target)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert integrated_loudness(y, rate) == pytest.approx(target, abs=1e-4)
    np.testing.assert_allclose(y / x, (y / x)[0], rtol=1e-5)  # one gain, nothing else


def test_silence_and_short_audio_are_errors():
    with pytest.raises(AudioError, match="silent"):
        normalize_loudness(np.zeros(24000, np.float32), 24000)
    with pytest.raises(AudioError, match="too short"):
        integrated_loudness(np.ones(100, np.float32), 24000)
    with pytest.raises(AudioError, match="channels"):
        integrated_loudness(np.ones((24000, 7), np.float32), 24000)
