"""Integrated loudness (ITU-R BS.1770-4) and loudness normalisation, in numpy alone.

The reference normalises a custom voice prompt to -24 LUFS (pyloudnorm) before Mimi encodes
it; a prompt at another level conditions the model on another voice. The measure:

    K-weighting     a high shelf (+4 dB above ~1.5 kHz: the head's effect) then the RLB
                    high-pass (~38 Hz), as RBJ-cookbook biquads derived for the actual sample
                    rate from the 48 kHz design parameters, as pyloudnorm derives them
    blocks          400 ms, 75 % overlap; mean square per channel, channel weights 1, 1, 1,
                    1.41, 1.41 (L, R, C, Ls, Rs)
    gates           absolute -70 LUFS, then relative: 10 LU below the loudness of the blocks
                    that passed the absolute gate
    loudness        -0.691 + 10 log10 of the weighted mean square of the blocks that pass both

No scipy: the two biquads are applied as one linear filter by FFT convolution with their
impulse response. The response is sampled from the frequency response on a grid long enough
that what wraps around (the tail beyond the grid, which decays as the pole radius to the n-th
power) is below 1e-12 of the response: the same output as a recursive filter from rest, to
float64 rounding, with no per-sample Python loop.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import AudioError

BLOCK_SECONDS = 0.4
OVERLAP = 0.75
ABSOLUTE_GATE = -70.0  # LUFS
RELATIVE_GATE = -10.0  # LU below the absolutely-gated loudness
CHANNEL_WEIGHTS = (1.0, 1.0, 1.0, 1.41, 1.41)
_TAIL = 1e-12  # what the truncated impulse response may leave out, relative
_BLOCK = 1 << 18  # samples per FFT convolution block (bounds memory for long files)


def _biquad(kind: str, gain_db: float, q: float, fc: float, rate: float):
    """(b [3], a [3]) of an RBJ-cookbook biquad, normalised so that a[0] = 1."""
    A = 10.0 ** (gain_db / 40.0)
    w0 = 2.0 * math.pi * fc / rate
    cos, alpha = math.cos(w0), math.sin(w0) / (2.0 * q)
    if kind == "high_shelf":
        s = 2.0 * math.sqrt(A) * alpha
        b = [A * ((A + 1) + (A - 1) * cos + s), -2 * A * ((A - 1) + (A + 1) * cos),
             A * ((A + 1) + (A - 1) * cos - s)]
        a = [(A + 1) - (A - 1) * cos + s, 2 * ((A - 1) - (A + 1) * cos),
             (A + 1) - (A - 1) * cos - s]
    elif kind == "high_pass":
        b = [(1 + cos) / 2, -(1 + cos), (1 + cos) / 2]
        a = [1 + alpha, -2 * cos, 1 - alpha]
    else:
        raise ValueError(kind)
    return np.array(b) / a[0], np.array(a) / a[0]


def k_weighting(rate: float) -> tuple[np.ndarray, np.ndarray]:
    """(b [5], a [5]): the shelf and the RLB high-pass combined into one filter."""
    b1, a1 = _biquad("high_shelf", 4.0, 1 / math.sqrt(2), 1500.0, rate)
    b2, a2 = _biquad("high_pass", 0.0, 0.5, 38.0, rate)
    return np.convolve(b1, b2), np.convolve(a1, a2)


def impulse_response(b: np.ndarray, a: np.ndarray) -> np.ndarray:
    """The impulse response of the stable filter b/a, up to where its tail is below _TAIL."""
    r = float(np.max(np.abs(np.roots(a))))
    if not r < 1.0:
        raise ValueError("unstable filter")
    decay = -math.log(max(r, 1e-3))  # per sample
    # |h[n]| <~ n^(order - 1) r^n (repeated poles): solve for where that reaches _TAIL
    order = len(a) - 1
    n = -math.log(_TAIL) / decay
    for _ in range(4):
        n = (-math.log(_TAIL) + (order - 1) * math.log(n)) / decay
    n = int(n) + 64
    size = 1 << max(6, (2 * n - 1).bit_length())
    z = np.exp(-2j * np.pi * np.fft.rfftfreq(size))  # e^{-jw} on the grid
    response = np.polyval(b[::-1], z) / np.polyval(a[::-1], z)  # sum b_k z^k / sum a_k z^k
    return np.fft.irfft(response, size)[:n]


def apply_filter(b: np.ndarray, a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x [T, C] -> the filter's output from rest [T, C] (float64), by overlap-add FFT
    convolution with the impulse response."""
    h = impulse_response(b, a)
    T = x.shape[0]
    size = 1 << (_BLOCK + len(h) - 1).bit_length()
    H = np.fft.rfft(h, size)[:, None]  # [F, 1]
    y = np.zeros((T + size, x.shape[1]))
    for start in range(0, T, _BLOCK):
        block = x[start:start + _BLOCK]  # [<=_BLOCK, C]
        y[start:start + size] += np.fft.irfft(np.fft.rfft(block, size, axis=0) * H, size,
                                              axis=0)
    return y[:T]


def _as_channels(pcm: np.ndarray) -> np.ndarray:
    x = np.asarray(pcm, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or not 1 <= x.shape[1] <= len(CHANNEL_WEIGHTS):
        raise AudioError(f"loudness needs audio shaped [samples] or [samples, channels] with "
                         f"1..{len(CHANNEL_WEIGHTS)} channels, got {list(np.shape(pcm))}")
    return x


def integrated_loudness(pcm: np.ndarray, rate: int) -> float:
    """Integrated loudness in LUFS of pcm [T] or [T, C] (C <= 5, float); -inf when every block
    is below the absolute gate (silence)."""
    x = _as_channels(pcm)
    T = x.shape[0]
    if T < BLOCK_SECONDS * rate:
        raise AudioError(f"{T / rate:.2f} s of audio is too short to measure loudness (BS.1770 "
                         f"needs at least {BLOCK_SECONDS} s)")
    y = apply_filter(*k_weighting(rate), x)  # [T, C]
    # Block j spans samples [l_j, u_j): the same float expressions as pyloudnorm, so the block
    # edges agree to the sample; means divide by the nominal block length.
    step = 1.0 - OVERLAP
    blocks = int(np.round((T / rate - BLOCK_SECONDS) / (BLOCK_SECONDS * step))) + 1
    j = np.arange(blocks)
    lo = (BLOCK_SECONDS * (j * step) * rate).astype(np.int64)
    hi = np.minimum((BLOCK_SECONDS * (j * step + 1) * rate).astype(np.int64), T)
    energy = np.concatenate([np.zeros((1, x.shape[1])), np.cumsum(y * y, axis=0)])  # [T+1, C]
    z = (energy[hi] - energy[lo]) / (BLOCK_SECONDS * rate)  # [blocks, C] mean squares
    weights = np.array(CHANNEL_WEIGHTS[:x.shape[1]])
    with np.errstate(divide="ignore"):
        block_loudness = -0.691 + 10.0 * np.log10(z @ weights)  # [blocks]
        kept = block_loudness >= ABSOLUTE_GATE
        if not kept.any():
            return float("-inf")
        relative = -0.691 + 10.0 * np.log10(z[kept].mean(axis=0) @ weights) + RELATIVE_GATE
        kept = (block_loudness > relative) & (block_loudness > ABSOLUTE_GATE)
        return float(-0.691 + 10.0 * np.log10(z[kept].mean(axis=0) @ weights))


def normalize_loudness(pcm: np.ndarray, rate: int, target: float = -24.0) -> np.ndarray:
    """pcm scaled to integrated loudness `target` LUFS, float32, same shape. Not clipped (the
    reference does not clip either; Mimi takes samples beyond +-1). Audio too short to measure
    or silent (nothing above -70 LUFS) is an AudioError: a voice prompt needs a voice."""
    loudness = integrated_loudness(pcm, rate)
    if not np.isfinite(loudness):
        raise AudioError("the audio is silent (below -70 LUFS everywhere): nothing to "
                         "normalise; give a recording of a voice")
    gain = 10.0 ** ((target - loudness) / 20.0)
    return (np.asarray(pcm, dtype=np.float64) * gain).astype(np.float32)
