"""The one writer of ONNX external data: a graph's weights in one `<graph>.onnx.data` file.

Both producers of weights write through `ExternalDataFile`: the LM export, which streams each
parameter from the checkpoint (frugal.py), and the precision rewrite, which makes each converted
weight just before it is written (graph_edit.py). Tensors go in one after another, each written
as it comes and hashed on the way, so a 30 GB file is never held in memory nor read back for
its manifest sha256.

Layout: tensors of 1 MiB or more start at a 64 KiB boundary (Windows' allocation granularity, a
multiple of every page size), so a runtime can memory-map them; small ones pack at 64 bytes.
Each tensor's TensorProto holds only the reference (location, offset, length).
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

ALIGN_LARGE, ALIGN_SMALL, LARGE = 1 << 16, 64, 1 << 20


class ExternalDataFile:
    """One external data file, written sequentially. `location` is the name the graph refers
    to (default: the file's own name; a caller writing to a temporary name that is renamed
    into place later passes the final one)."""

    def __init__(self, path: str | Path, location: str | None = None,
                 progress: Callable[[int], None] | None = None):
        self.path = Path(path)
        self.location = location or self.path.name
        self._file = open(self.path, "wb")
        self._sha = hashlib.sha256()
        self.offset = 0
        self._progress = progress

    def _write(self, data: bytes | memoryview) -> None:
        self._file.write(data)
        self._sha.update(data)
        self.offset += len(data)

    def add(self, name: str, data_type: int, dims, chunks: Iterable[bytes | memoryview],
            nbytes: int):
        """Writes one tensor of `nbytes` from its raw chunks (little-endian, as ONNX stores
        it); returns its onnx TensorProto holding the reference."""
        import onnx

        align = ALIGN_LARGE if nbytes >= LARGE else ALIGN_SMALL
        pad = -self.offset % align
        if pad:
            self._write(bytes(pad))
        begin = self.offset
        for chunk in chunks:
            self._write(chunk)
            if self._progress:
                self._progress(len(chunk))
        if self.offset - begin != nbytes:
            raise ValueError(f"{name}: wrote {self.offset - begin} bytes, its type and shape "
                             f"{list(dims)} need {nbytes}")
        tensor = onnx.TensorProto(name=name, dims=[int(d) for d in dims], data_type=data_type)
        for key, value in (("location", self.location), ("offset", str(begin)),
                           ("length", str(nbytes))):
            tensor.external_data.add(key=key, value=value)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        return tensor

    def add_float32(self, name: str, shape: tuple[int, ...], blocks: Iterable[np.ndarray]):
        """One float32 tensor from its row blocks (any float dtype, converted on the way)."""
        import onnx

        chunks = (memoryview(np.ascontiguousarray(b, dtype="<f4")).cast("B") for b in blocks)
        return self.add(name, onnx.TensorProto.FLOAT, shape, chunks, 4 * math.prod(shape))

    def close(self) -> str:
        """Flushes to disk and returns the file's sha256."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return self._sha.hexdigest()

    def abort(self) -> None:
        """Closes and removes a file that will not be completed."""
        self._file.close()
        self.path.unlink(missing_ok=True)
