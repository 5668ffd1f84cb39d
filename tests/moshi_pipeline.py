"""The reference conversation: moshi's own streaming pipeline, one 80 ms frame at a time.

Mimi encode -> LMGen step -> Mimi decode, greedy, on moshi's models (tests and benchmarks only).
LMGen runs on the agent-only view of the 16-step depformer (dep_q 8, moshi's own 7B setting; see
moshi_lm_reference.py), with the user's codes fed in from the encoder.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

STAGES = ("encode", "lm", "decode")


class ReferencePipeline:
    """`with ReferencePipeline(mimi, lm) as ref: ref.step(pcm)` per frame. Per-stage wall
    times in ms are kept in `times` when `timed`."""

    def __init__(self, mimi, lm, timed: bool = False):
        self.mimi, self.lm = mimi, lm
        self.timed = timed
        self.times: dict[str, list[float]] = {s: [] for s in STAGES}
        self._stack = ExitStack()

    def __enter__(self) -> "ReferencePipeline":
        from moshi.models.lm import LMGen

        self._full_dep_q = self.lm.dep_q
        self.lm.dep_q = 8
        self._stack.callback(setattr, self.lm, "dep_q", self._full_dep_q)
        self._stack.enter_context(torch.no_grad())
        self.gen = LMGen(self.lm, use_sampling=False)
        self._stack.enter_context(self.mimi.streaming(1))
        self._stack.enter_context(self.gen.streaming(1))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _mark(self, stage: str, t0: float) -> float:
        t1 = time.perf_counter()
        if self.timed:
            self.times[stage].append(1000 * (t1 - t0))
        return t1

    def step(self, pcm: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """pcm [frame] f32 -> (the emitted frame [9]: text, agent cb0..7, or None before the
        first; its decoded pcm [frame], zeros before the first)."""
        t = time.perf_counter()
        codes = self.mimi.encode(torch.from_numpy(pcm)[None, None])  # [1, 8, 1]
        t = self._mark("encode", t)
        out = self.gen.step(codes)  # [1, 9, 1] or None
        t = self._mark("lm", t)
        if out is None:
            return None, np.zeros(pcm.shape[0], np.float32)
        audio = self.mimi.decode(out[:, 1:])[0, 0].numpy()  # [frame]
        self._mark("decode", t)
        return out[0, :, 0].numpy(), audio
