"""Reading safetensors checkpoints tensor by tensor, checked against the shapes a config implies.

Files are memory-mapped (`safe_open`): a tensor is read when asked for, so a 16.7 GB checkpoint is
never held whole. `check_tensors` compares the file's header (names and shapes, no data read)
with what the config expects and reports every missing, unexpected or mis-shaped tensor in one
sorted message, naming the tensor and both shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import torch
from safetensors import safe_open

from personaplex_edge.errors import CheckpointError


class TensorFile:
    """A safetensors file opened for lazy reads. Keys can be renamed on the way in (`rename`:
    file key -> canonical key) for layouts that differ only in names."""

    def __init__(self, path: str | Path, rename: Callable[[str], str] | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"checkpoint file {self.path} does not exist")
        try:
            self._file = safe_open(str(self.path), framework="pt")
            keys = list(self._file.keys())
        except Exception as e:  # safetensors raises its own error types for a damaged header
            raise CheckpointError(f"{self.path} is not a readable safetensors file: {e}") from e
        rename = rename or (lambda k: k)
        self._source = {rename(k): k for k in keys}
        self.shapes = {}
        for canonical, key in self._source.items():
            self.shapes[canonical] = tuple(self._file.get_slice(key).get_shape())

    def keys(self) -> list[str]:
        return list(self._source)

    def get(self, key: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        try:
            tensor = self._file.get_tensor(self._source[key])
        except KeyError:
            raise CheckpointError(f"{self.path} has no tensor '{key}'") from None
        return tensor.to(dtype) if tensor.is_floating_point() else tensor


def check_tensors(tf: TensorFile, expected: Mapping[str, tuple[int, ...]], what: str,
                  optional: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """Raises one CheckpointError listing every disagreement between `tf` and `expected`.
    `optional` tensors may be absent but must have the right shape when present."""
    optional = optional or {}
    problems = []
    for key in sorted(expected):
        if key not in tf.shapes:
            problems.append(f"missing tensor '{key}' (expected shape {list(expected[key])})")
    for key in sorted(tf.shapes):
        want = expected.get(key, optional.get(key))
        if want is None:
            problems.append(f"unexpected tensor '{key}' {list(tf.shapes[key])}")
        elif tuple(tf.shapes[key]) != tuple(want):
            problems.append(f"tensor '{key}' has shape {list(tf.shapes[key])}, the config "
                            f"implies {list(want)}")
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"]
                                 if len(problems) > 20 else [])
        raise CheckpointError(
            f"{tf.path} does not match the {what} config ({len(problems)} problem(s)); is it "
            "the right file for this model, and does config.json describe it?\n  "
            + "\n  ".join(shown))
