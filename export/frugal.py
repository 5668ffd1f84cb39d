"""What each LM parameter is made of in the checkpoint, and reading it tensor by tensor.

The 7B LM is 16.7 GB of bf16 and 33 GB once converted to float32: a machine that can run it
cannot also hold a second copy for the exporter. So the graphs are traced without their weights
(parameters stay graph inputs) and each parameter is then read here, from the checkpoint file,
one at a time, converted to float32 on the way, and written in its final precision by
lm_weights.py:

    safetensors file --reads (row blocks)--> bf16 bits --numpy--> float32 --> lm_weights.py

(the reader is safetensors_file.py). A parameter's value is a `WeightPlan`: rows of one or more
checkpoint tensors, concatenated along dim 0 and reshaped. That one form covers the published
layout's packings: the depformer's per-step slices of `in_proj_weight` (a row range), Helium's
stacked audio tables (16 tensors one after another) and every plain tensor (all rows of one).
Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from personaplex_edge.errors import CheckpointError

from .safetensors_file import SafetensorsHeader, into_float32


@dataclass(frozen=True)
class Segment:
    """Rows start..stop (None: all) of checkpoint tensor `key`."""

    key: str
    start: int = 0
    stop: int | None = None


@dataclass(frozen=True)
class WeightPlan:
    """A parameter = its segments concatenated along dim 0, reshaped to `shape`."""

    segments: tuple[Segment, ...]
    shape: tuple[int, ...]

    @classmethod
    def whole(cls, key: str, shape: tuple[int, ...]) -> "WeightPlan":
        return cls((Segment(key),), tuple(shape))

    @property
    def nbytes(self) -> int:
        return 4 * math.prod(self.shape)  # float32

    def keys(self) -> list[str]:
        return [s.key for s in self.segments]

    def check(self, header: SafetensorsHeader, name: str) -> None:
        """The segments exist and add up to exactly `shape`."""
        elems = 0
        for s in self.segments:
            t = header.info(s.key)
            stop = t.shape[0] if s.stop is None else s.stop
            elems += (stop - s.start) * t.row_elements
        if elems != math.prod(self.shape):
            raise CheckpointError(f"{header.path}: parameter {name} {list(self.shape)} cannot be "
                                  f"built from {self.keys()} ({elems} elements)")

    def rows(self, header: SafetensorsHeader, a: int, b: int) -> "WeightPlan":
        """The plan of rows a..b of this parameter (along its first axis), in checkpoint
        terms: each row must start and end on rows of the checkpoint tensors it comes from."""
        per_row = math.prod(self.shape[1:])
        lo, hi = a * per_row, b * per_row  # elements of the concatenation
        segments, at = [], 0
        for s in self.segments:
            t = header.info(s.key)
            stop = t.shape[0] if s.stop is None else s.stop
            n = (stop - s.start) * t.row_elements
            first, last = max(lo, at), min(hi, at + n)
            if first < last:
                if (first - at) % t.row_elements or (last - at) % t.row_elements:
                    raise ValueError(f"rows {a}..{b} of a {list(self.shape)} parameter cut "
                                     f"rows of '{s.key}'")
                segments.append(Segment(s.key, s.start + (first - at) // t.row_elements,
                                        s.start + (last - at) // t.row_elements))
            at += n
        return WeightPlan(tuple(segments), (b - a, *self.shape[1:]))

    def read(self, header: SafetensorsHeader) -> np.ndarray:
        """The whole parameter as float32 `shape`, each block of stored bits widened straight
        into its place (no concatenation: one pass, no second copy)."""
        out = np.empty(self.shape, np.float32)
        flat, at = out.reshape(-1), 0
        for s in self.segments:
            dtype = header.info(s.key).dtype
            for bits in header.iter_raw(s.key, s.start, s.stop):
                into_float32(bits.reshape(-1), dtype, flat[at:at + bits.size])
                at += bits.size
        return out
