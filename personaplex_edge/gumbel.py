"""Gumbel noise for the graphs' in-graph sampling (Gumbel-max over the top-k): drawn on the host
from a seeded generator, so a seed reproduces a conversation, and zeros give greedy decoding.

One implementation for export (example inputs, checks) and runtime (filled in place into the
bound noise buffers every frame: no allocation per frame).
"""

from __future__ import annotations

import numpy as np

_TINY = np.finfo(np.float64).tiny
_BELOW_ONE = 1.0 - np.finfo(np.float64).epsneg


def fill_gumbel(rng: np.random.Generator, out: np.ndarray, scratch: np.ndarray) -> None:
    """Writes standard Gumbel samples -log(-log(u)), u uniform in the open interval (0, 1), into
    `out` (any float dtype) using `scratch` (float64, out's shape) as working memory."""
    rng.random(out=scratch)
    # keep u away from 0 and 1 so neither log sees 0 (both ends would give +-inf)
    np.clip(scratch, _TINY, _BELOW_ONE, out=scratch)
    np.log(scratch, out=scratch)
    np.negative(scratch, out=scratch)
    np.log(scratch, out=scratch)
    np.negative(scratch, out=scratch)
    np.copyto(out, scratch, casting="same_kind")


def gumbel_noise(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Standard Gumbel samples [shape] float32 (a new array; see fill_gumbel)."""
    out = np.empty(shape, np.float32)
    fill_gumbel(rng, out, np.empty(shape, np.float64))
    return out
