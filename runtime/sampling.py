"""How a conversation samples: temperatures and top-k (runtime inputs of the graphs, per batch
row, so changing them needs no re-export) and the seeded Gumbel noise of its batch row."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.gumbel import fill_gumbel


@dataclass(frozen=True)
class SamplingParams:
    """The reference's defaults."""

    temp: float = 0.8  # audio
    temp_text: float = 0.7
    top_k: int = 250  # audio
    top_k_text: int = 25
    greedy: bool = False
    seed: int | None = None

    def check(self, k_max_text: int, k_max_audio: int,
              name: Callable[[str], str] = lambda field: "--" + field.replace("_", "-")
              ) -> None:
        """PersonaPlexError for what a model with these largest top-k cannot sample with; the
        message names each field as `name` spells it (a flag by default, a config key for the
        assistant)."""
        for field, k, k_max in (("top_k_text", self.top_k_text, k_max_text),
                                ("top_k", self.top_k, k_max_audio)):
            if not 1 <= k <= k_max:
                raise PersonaPlexError(f"{name(field)} {k} is outside 1..{k_max} (the largest "
                                       "top-k this model was exported with)")
        for field, t in (("temp_text", self.temp_text), ("temp", self.temp)):
            if not (t > 0 and math.isfinite(t)):
                raise PersonaPlexError(f"{name(field)} must be a finite number above 0 (use "
                                       f"{name('greedy')} for argmax)")


class RowNoise:
    """One batch row's sampling noise: its own generator (seeded), filling its rows of the
    bound noise buffers in place each frame - text first, then audio, the order a conversation
    alone would draw them in - or zeros once for greedy decoding."""

    def __init__(self, params: SamplingParams, text_row: np.ndarray, audio_row: np.ndarray):
        self.greedy = params.greedy
        self.rng = np.random.default_rng(params.seed)
        self._rows = (text_row, audio_row)  # views [K] and [codebooks, K] into the buffers
        self._scratch = tuple(np.empty(r.shape, np.float64) for r in self._rows)
        if self.greedy:
            text_row[...] = 0.0  # zero noise: argmax
            audio_row[...] = 0.0

    def fill(self) -> None:
        if self.greedy:
            return
        for row, scratch in zip(self._rows, self._scratch):
            fill_gumbel(self.rng, row, scratch)
