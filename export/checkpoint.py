"""Checkpoint tensors as torch tensors, checked against the shapes a config implies.

`TensorFile` is the torch face of the one safetensors reader (safetensors_file.py): the same
header, the same row reads, each tensor handed out as a torch tensor when asked for, so a
16.7 GB checkpoint is never held whole. `check_tensors` compares the header (names and shapes,
no data read) with what the config expects and reports every missing, unexpected or
mis-shaped tensor in one sorted message, naming the tensor and both shapes.
"""

from __future__ import annotations

from typing import Mapping

import torch

from personaplex_edge.errors import CheckpointError

from .safetensors_file import FLOAT_DTYPES, SafetensorsHeader, to_float32


class TensorFile(SafetensorsHeader):
    """A safetensors file opened for lazy reads of whole tensors as torch tensors."""

    def get(self, key: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Tensor `key`; a floating one converted to `dtype` (bf16 widens exactly)."""
        stored = self.info(key).dtype
        bits = self.read_stored(key)
        if stored in FLOAT_DTYPES:
            return torch.from_numpy(to_float32(bits, stored)).to(dtype)
        return torch.from_numpy(bits)


def check_tensors(tf: SafetensorsHeader, expected: Mapping[str, tuple[int, ...]], what: str,
                  optional: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """Raises one CheckpointError listing every disagreement between `tf` and `expected`.
    `optional` tensors may be absent but must have the right shape when present."""
    optional = optional or {}
    shapes = tf.shapes  # built once: a property
    problems = []
    for key in sorted(expected):
        if key not in shapes:
            problems.append(f"missing tensor '{key}' (expected shape {list(expected[key])})")
    for key in sorted(shapes):
        want = expected.get(key, optional.get(key))
        if want is None:
            problems.append(f"unexpected tensor '{key}' {list(shapes[key])}")
        elif tuple(shapes[key]) != tuple(want):
            problems.append(f"tensor '{key}' has shape {list(shapes[key])}, the config "
                            f"implies {list(want)}")
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"]
                                 if len(problems) > 20 else [])
        raise CheckpointError(
            f"{tf.path} does not match the {what} config ({len(problems)} problem(s)); is it "
            "the right file for this model, and does config.json describe it?\n  "
            + "\n  ".join(shown))
