"""The one reader of safetensors files: the header (names, dtypes, shapes, offsets) and row reads.

Every part of the export that looks into a checkpoint goes through `SafetensorsHeader`: the size
check before a long export (hub.py), the streamed weights of the LM graphs (frugal.py), and the
torch-side loads of Mimi and the LM check (checkpoint.py's TensorFile, a subclass that hands out
torch tensors). Nothing here imports torch.

Plain reads rather than a memory map: pages of a mapped 16.7 GB file count towards the
process's resident size for as long as the map lives, reads do not. The format: an 8-byte
little-endian header length, a JSON header (tensor -> dtype, shape, data_offsets relative to the
end of the header), then the tensors' bytes.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from personaplex_edge.errors import CheckpointError

# safetensors dtype -> numpy dtype of the stored bits (bf16 is read as its uint16 bits)
STORED = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
          "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
          "BOOL": np.bool_}
FLOAT_DTYPES = {"BF16", "F16", "F32", "F64"}
_HEADER_LIMIT = 100 << 20  # safetensors' own cap on the JSON header
CHUNK_BYTES = 16 << 20  # float32 bytes converted per block: bounds the transient memory


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors dtype name: "BF16", "F32", ...
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in the file
    end: int

    @property
    def row_elements(self) -> int:
        return math.prod(self.shape[1:])

    @property
    def itemsize(self) -> int:
        return np.dtype(STORED[self.dtype]).itemsize


def _read_header(path: Path) -> tuple[dict, int]:
    """(the JSON header, the offset where the data starts)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError("shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        if n > _HEADER_LIMIT:
            raise ValueError(f"header length {n} is implausible")
        text = f.read(n)
        if len(text) < n:
            raise ValueError("the header is cut short")
    header = json.loads(text)
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    return header, 8 + n


class SafetensorsHeader:
    """A safetensors file's header and reads of its tensors, by rows along dim 0.

    Keys can be renamed on the way in (`rename`: file key -> canonical key) for layouts that
    differ only in names. `declared_size` is the file size the header implies;
    `check_complete` compares it with the size on disk, which catches an interrupted download
    before a long export starts."""

    def __init__(self, path: str | Path, rename: Callable[[str], str] | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"checkpoint file {self.path} does not exist")
        try:
            header, self.data_start = _read_header(self.path)
        except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
            raise CheckpointError(f"{self.path} is not a readable safetensors file ({e}); "
                                  "download it again") from e
        header.pop("__metadata__", None)
        rename = rename or (lambda k: k)
        self.tensors: dict[str, TensorInfo] = {}
        self.declared_size = self.data_start
        for key, meta in header.items():
            try:
                begin, end = (int(v) for v in meta["data_offsets"])
                info = TensorInfo(meta["dtype"], tuple(int(s) for s in meta["shape"]),
                                  self.data_start + begin, self.data_start + end)
                if info.dtype not in STORED:
                    raise ValueError(f"dtype {info.dtype} is not supported")
            except (KeyError, TypeError, ValueError) as e:
                raise CheckpointError(f"{self.path}: malformed header entry for '{key}' "
                                      f"({e})") from e
            self.tensors[rename(key)] = info
            self.declared_size = max(self.declared_size, info.end)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: t.shape for k, t in self.tensors.items()}

    def keys(self) -> list[str]:
        return list(self.tensors)

    def check_complete(self, expected_size: int | None = None) -> None:
        """Raises CheckpointError when the file is shorter than its header says (or than
        `expected_size`, the size the hub reports)."""
        size = self.path.stat().st_size
        want = max(self.declared_size, expected_size or 0)
        if size < want:
            raise CheckpointError(
                f"{self.path} is truncated: {size:,} bytes on disk, {want:,} expected "
                f"({100 * size / want:.1f}%). The download was probably interrupted: delete "
                "the file and download it again (a hub download resumes by itself when run "
                "again)")

    def info(self, key: str) -> TensorInfo:
        try:
            return self.tensors[key]
        except KeyError:
            raise CheckpointError(f"{self.path} has no tensor '{key}'") from None

    def iter_raw(self, key: str, start: int = 0, stop: int | None = None,
                 chunk_bytes: int = CHUNK_BYTES) -> Iterator[np.ndarray]:
        """Rows start..stop of tensor `key` (dim 0) as stored (bf16 as uint16 bits), in blocks
        of about `chunk_bytes` once converted to float32: each [rows, *shape[1:]]. A scalar
        tensor is one row of shape []."""
        t = self.info(key)
        rows = t.shape[0] if t.shape else 1
        stop = rows if stop is None else stop
        if not 0 <= start <= stop <= rows:
            raise CheckpointError(f"{self.path}: rows {start}..{stop} of '{key}' are outside "
                                  f"its {rows} rows")
        row_elems = t.row_elements
        block = max(1, chunk_bytes // max(1, 4 * row_elems))
        with open(self.path, "rb") as f:
            for a in range(start, stop, block):
                b = min(stop, a + block)
                bits = np.empty((b - a) * row_elems, STORED[t.dtype])
                f.seek(t.begin + a * row_elems * t.itemsize)
                if f.readinto(memoryview(bits).cast("B")) != bits.nbytes:
                    raise CheckpointError(f"{self.path} ends inside tensor '{key}': the file is "
                                          "truncated; download it again")
                yield bits.reshape((b - a, *t.shape[1:]))

    def read_stored(self, key: str) -> np.ndarray:
        """The whole tensor as stored, in its own shape (bf16 as uint16 bits)."""
        t = self.info(key)
        parts = list(self.iter_raw(key))
        out = np.concatenate(parts) if len(parts) != 1 else parts[0]
        return out.reshape(t.shape)

    def iter_rows(self, key: str, start: int = 0, stop: int | None = None,
                  chunk_bytes: int = CHUNK_BYTES) -> Iterator[np.ndarray]:
        """The same blocks as iter_raw, converted to float32."""
        dtype = self.info(key).dtype
        for bits in self.iter_raw(key, start, stop, chunk_bytes):
            yield to_float32(bits, dtype)

    def read_rows(self, key: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The same rows as one float32 array (a whole tensor, in its shape, when no range is
        given)."""
        if (start, stop) == (0, None):
            return to_float32(self.read_stored(key), self.info(key).dtype)
        parts = list(self.iter_rows(key, start, stop))
        return np.concatenate(parts) if len(parts) != 1 else parts[0]


def into_float32(bits: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """Stored elements -> float32 `out` (bits' shape), with no temporary: bf16 bits widened
    exactly (the upper half of a float32, as the voice bank's are)."""
    if dtype == "BF16":
        np.left_shift(bits, 16, out=out.view(np.uint32), dtype=np.uint32)
    else:
        out[...] = bits


def to_float32(bits: np.ndarray, dtype: str) -> np.ndarray:
    """into_float32 into a new array."""
    out = np.empty(bits.shape, np.float32)
    into_float32(bits, dtype, out)
    return out
