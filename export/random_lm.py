"""A random LM checkpoint of any size in the published layout, written tensor by tensor.

The 7B's `model.safetensors` is 16.7 GB of bf16: too much to build in memory as
export/synthetic.py builds the small ones. Here the header comes from the project's own key
list (lm.expected_lm_tensors) and each tensor is written in chunks cut from one pool of
standard normals (64 MB) at random offsets, scaled and rounded to bf16 on the way:

    pool [16M] float32 --offset, x scale--> float32 chunk --round to nearest even--> bf16 bits

so the writer holds the pool and one chunk, whatever the size (peak RSS well under 1 GB), and
the full size writes in about a minute. The values are what the small checkpoints hold (norm
gains 1, embeddings N(0, 1), a linear layer N(0, 1 / fan_in)), reused across tensors: what a
random model computes matters for sizes and timings, not for what it says. Numpy only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import numpy as np

from personaplex_edge.config import PersonaPlexConfig

POOL = 1 << 24  # float32 normals (64 MB)
CHUNK = 1 << 22  # elements written per piece


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> the uint16 bits of the nearest bf16 (ties to even; no NaNs expected)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _scale(key: str, shape: tuple[int, ...]) -> float | None:
    """None: all ones (a norm gain); else the standard deviation of the tensor's values."""
    if key.endswith(".alpha"):
        return None
    if "emb" in key.split(".")[0]:
        return 1.0
    return 1.0 / math.sqrt(shape[-1])  # a linear layer [out, in]


def safetensors_header(shapes: dict[str, tuple[int, ...]], itemsize: int = 2,
                       dtype: str = "BF16") -> bytes:
    """The 8-byte length and JSON header of a file holding `shapes` in this order, one after
    another (padded to 8 bytes, as safetensors writes it)."""
    header, offset = {}, 0
    for key, shape in shapes.items():
        size = itemsize * math.prod(shape)
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset,
                                                                              offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def write_random_lm(cfg: PersonaPlexConfig, path: str | Path, seed: int = 0,
                    progress: Callable[[int], None] | None = None) -> int:
    """Writes `cfg`'s whole LM checkpoint to `path` (bf16, the published names, sorted);
    `progress(n)` after each n bytes. Returns the file's size."""
    from .lm import expected_lm_tensors

    return write_random_tensors(expected_lm_tensors(cfg), path, seed, progress)


def write_random_tensors(shapes: dict[str, tuple[int, ...]], path: str | Path, seed: int = 0,
                         progress: Callable[[int], None] | None = None) -> int:
    """A checkpoint of these tensors (any LM in moshi's names: PersonaPlex's, a Kyutai STT
    model's) at `path`, as write_random_lm writes one."""
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(POOL, dtype=np.float32)
    shapes = dict(sorted(shapes.items()))
    head = safetensors_header(shapes)
    with open(path, "wb") as f:
        f.write(head)
        for key, shape in shapes.items():
            scale, left = _scale(key, shape), math.prod(shape)
            while left:
                n = min(left, CHUNK)
                if scale is None:
                    chunk = np.ones(n, np.float32)
                else:
                    start = int(rng.integers(0, POOL - n + 1))
                    chunk = pool[start:start + n] * np.float32(scale)
                bits = float32_to_bf16_bits(chunk)
                f.write(memoryview(bits).cast("B"))
                left -= n
                if progress:
                    progress(bits.nbytes)
        return f.tell()
