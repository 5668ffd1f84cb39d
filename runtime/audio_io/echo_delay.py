"""Where in time the played signal comes back: the bulk delay between the reference and its echo.

The echo canceller's filter covers a few hundred milliseconds of room; the reference has to be
shifted so that the echo falls inside that window, a little after its start (a reference that
arrives after its own echo cannot be cancelled at all). The loop knows most of the delay (its
own buffers, what the devices report); this estimator measures it, so a device that misreports
its latency, or clocks that drift apart, are found and followed.

Method: generalised cross-correlation with phase transform (GCC-PHAT) between each microphone
frame and the reference window that could hold its echo, cross-spectra averaged over the frames
where both carry sound, on signals decimated to ~8 kHz (a bulk delay needs no more). One
estimate per frame, no adaptive filter: it says where, not what.
"""

from __future__ import annotations

import numpy as np


class DelayEstimator:
    def __init__(self, rate: int, frame: int, max_delay: int, forget: float = 0.97,
                 min_frames: int = 4, peak_ratio: float = 1.8, peak_rms: float = 10.0):
        self.decim = max(1, rate // 8000)
        self.frame = frame
        self.max_delay = max_delay  # samples at `rate`
        self._m = frame // self.decim  # decimated frame
        self._d = max_delay // self.decim  # decimated lags 0.._d
        n = self._d + 2 * self._m
        self._nfft = 1 << (n - 1).bit_length()
        self._cross = np.zeros(self._nfft // 2 + 1, np.complex128)  # averaged R * conj(M)
        f = np.fft.rfftfreq(self._nfft, self.decim / rate)
        # speech band only: below it room modes and hum, above it the decimation's aliases
        self._band = (f > 200.0) & (f < 3800.0)
        self._guard = max(1, int(0.002 * rate / self.decim))  # +-2 ms: one peak's width
        self.forget = forget
        self.min_frames = min_frames
        # confident when the peak stands out from the next one and from the floor (measured
        # on speech: an echo reaches 2-9x and 12-50x within 5 frames; no echo stays < 1.5x, 13x)
        self.peak_ratio = peak_ratio
        self.peak_rms = peak_rms
        self.frames = 0  # frames that went into the average
        self.delay: int | None = None  # the last confident estimate, samples at `rate`
        self.strength = 0.0

    def _decimate(self, x: np.ndarray) -> np.ndarray:
        k = self.decim
        n = x.shape[0] // k * k
        # a boxcar over k samples is a crude but sufficient anti-alias filter for a delay
        return x[:n].reshape(-1, k).mean(axis=1)

    def update(self, mic: np.ndarray, ref_window: np.ndarray) -> int | None:
        """mic [frame] and the reference that could hold its echo, ref_window
        [max_delay + frame] (its last `frame` samples are simultaneous with mic). Returns the
        current estimate in samples (None until it is confident)."""
        m = self._decimate(mic)
        r = self._decimate(ref_window)
        if np.dot(r, r) < 1e-7 * r.size or np.dot(m, m) < 1e-9 * m.size:
            return self.delay  # nothing playing, or a silent microphone: nothing to learn
        spec = np.fft.rfft(r, self._nfft) * np.conj(np.fft.rfft(m, self._nfft))
        self._cross *= self.forget
        self._cross += spec / (np.abs(spec).sum() + 1e-20)  # each frame weighs the same
        self.frames += 1
        if self.frames < self.min_frames:
            return self.delay
        # PHAT-beta (0.8): whitened, but loud bands count a little more than the noise floor's
        phat = np.where(self._band, self._cross / (np.abs(self._cross) ** 0.8 + 1e-20), 0.0)
        corr = np.fft.irfft(phat, self._nfft)[:self._d + 1]  # lag u = max_delay - delay
        u = int(np.argmax(corr))
        peak = float(corr[u])
        rest = corr.copy()
        rest[max(0, u - self._guard):u + self._guard + 1] = -np.inf
        second = float(rest.max()) if np.isfinite(rest).any() else 0.0
        self.strength = peak / (second + 1e-20) if second > 0 else np.inf
        floor = peak / (float(np.sqrt(np.mean(corr ** 2))) + 1e-20)
        if self.strength >= self.peak_ratio and floor >= self.peak_rms:
            self.delay = (self._d - u) * self.decim
        return self.delay
