"""Test inputs that are not silence: a voiced, gliding tone with a little noise, so codes,
answers and text vary from frame to frame and between seeds."""

from __future__ import annotations

import numpy as np


def voiced(seconds: float, rate: int, seed: int) -> np.ndarray:
    """[seconds * rate] float32: its pitch glides at a rate the seed sets."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 60 * np.sin(2 * np.pi * (0.5 + 0.1 * seed) * t)
    tone = 0.3 * np.sin(2 * np.pi * np.cumsum(f0) / rate)
    return (tone + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)
