"""Weights streamed from a safetensors file into ONNX external data, one tensor at a time.

The 7B LM is 16.7 GB of bf16 and 33 GB once converted to float32: a machine that can run it
cannot also hold a second copy for the exporter. So the graphs are traced without their weights
(parameters stay graph inputs) and each parameter is then written here, straight from the
checkpoint file to the graph's `<graph>.onnx.data`, converted on the way:

    safetensors file --pread (row blocks)--> bf16 bits --numpy--> float32 --> .onnx.data

Plain reads rather than a memory map: pages of a mapped 16.7 GB file count towards the
process's resident size for as long as the map lives, reads do not.

A parameter's value is a `WeightPlan`: rows of one or more checkpoint tensors, concatenated along
dim 0 and reshaped. That one form covers the published layout's packings: the depformer's
per-step slices of `in_proj_weight` (a row range), Helium's stacked audio tables (16 tensors one
after another) and every plain tensor (all rows of one). Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

import numpy as np

from personaplex_edge.errors import CheckpointError

# safetensors dtype -> (numpy dtype of the stored bits, bytes per element)
_STORED = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}
_HEADER_LIMIT = 100 << 20  # safetensors' own cap on the JSON header
CHUNK_BYTES = 16 << 20  # float32 bytes converted per block: bounds the transient memory
# Tensors of 1 MiB or more start at a 64 KiB boundary (Windows' allocation granularity, a
# multiple of every page size), so a runtime can memory-map them; small ones pack tightly.
ALIGN_LARGE, ALIGN_SMALL, LARGE = 1 << 16, 64, 1 << 20


# ---- reading -------------------------------------------------------------------------------------

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
        return np.dtype(_STORED[self.dtype]).itemsize


class SafetensorsHeader:
    """The header of a safetensors file (names, dtypes, shapes, offsets) and row reads.

    `declared_size` is the file size the header implies; `check_complete` compares it with the
    size on disk, which catches an interrupted download before a long export starts."""

    def __init__(self, path: str | Path, rename: Callable[[str], str] | None = None):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
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
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{self.path} is not a readable safetensors file ({e}); "
                                  "download it again") from e
        header.pop("__metadata__", None)
        self.data_start = 8 + n
        rename = rename or (lambda k: k)
        self.tensors: dict[str, TensorInfo] = {}
        self.declared_size = self.data_start
        for key, meta in header.items():
            try:
                begin, end = (int(v) for v in meta["data_offsets"])
                info = TensorInfo(meta["dtype"], tuple(int(s) for s in meta["shape"]),
                                  self.data_start + begin, self.data_start + end)
            except (KeyError, TypeError, ValueError) as e:
                raise CheckpointError(f"{self.path}: malformed header entry for '{key}'") from e
            self.tensors[rename(key)] = info
            self.declared_size = max(self.declared_size, info.end)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: t.shape for k, t in self.tensors.items()}

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
        of about `chunk_bytes` once converted to float32: each [rows, *shape[1:]]."""
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
                bits = np.empty((b - a) * row_elems, _STORED[t.dtype])
                f.seek(t.begin + a * row_elems * t.itemsize)
                if f.readinto(memoryview(bits).cast("B")) != bits.nbytes:
                    raise CheckpointError(f"{self.path} ends inside tensor '{key}': the file is "
                                          "truncated; download it again")
                yield bits.reshape((b - a, *t.shape[1:]))

    def iter_rows(self, key: str, start: int = 0, stop: int | None = None,
                  chunk_bytes: int = CHUNK_BYTES) -> Iterator[np.ndarray]:
        """The same blocks converted to float32."""
        dtype = self.info(key).dtype
        for bits in self.iter_raw(key, start, stop, chunk_bytes):
            yield to_float32(bits, dtype)

    def read_rows(self, key: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The same rows as one float32 array (a whole tensor when no range is given)."""
        t = self.info(key)
        parts = list(self.iter_rows(key, start, stop))
        out = np.concatenate(parts) if len(parts) != 1 else parts[0]
        return out.reshape(t.shape) if (start, stop) == (0, None) else out


def to_float32(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Stored elements -> float32. bf16 is the top half of a float32: shift the bits up."""
    if dtype == "BF16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.astype(np.float32)


# ---- what each parameter is made of --------------------------------------------------------------

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

    def blocks(self, header: SafetensorsHeader) -> Iterator[np.ndarray]:
        for s in self.segments:
            yield from header.iter_rows(s.key, s.start, s.stop)

    def read(self, header: SafetensorsHeader) -> np.ndarray:
        """The whole parameter as float32 `shape` (for the check's torch side)."""
        return np.concatenate([b.reshape(-1) for b in self.blocks(header)]).reshape(self.shape)


# ---- writing -------------------------------------------------------------------------------------

class ExternalDataFile:
    """One `.onnx.data` file, written sequentially; hashed on the way so a 30 GB file is not
    read back for its manifest sha256."""

    def __init__(self, path: str | Path, progress: Callable[[int], None] | None = None):
        self.path = Path(path)
        self._file = open(self.path, "wb")
        self._sha = hashlib.sha256()
        self.offset = 0
        self._progress = progress

    def _write(self, data: bytes | memoryview) -> None:
        self._file.write(data)
        self._sha.update(data)
        self.offset += len(data)

    def add(self, name: str, shape: tuple[int, ...], blocks: Iterable[np.ndarray]):
        """Writes one float32 tensor from its row blocks; returns its onnx TensorProto, which
        holds only the reference (location, offset, length)."""
        import onnx

        nbytes = 4 * math.prod(shape)
        align = ALIGN_LARGE if nbytes >= LARGE else ALIGN_SMALL
        pad = -self.offset % align
        if pad:
            self._write(bytes(pad))
        begin = self.offset
        for block in blocks:
            self._write(memoryview(np.ascontiguousarray(block, dtype="<f4")).cast("B"))
            if self._progress:
                self._progress(block.nbytes)
        if self.offset - begin != nbytes:
            raise CheckpointError(f"{name}: wrote {self.offset - begin} bytes, its shape "
                                  f"{list(shape)} needs {nbytes}")
        tensor = onnx.TensorProto(name=name, dims=list(shape),
                                  data_type=onnx.TensorProto.FLOAT)
        for key, value in (("location", self.path.name), ("offset", str(begin)),
                           ("length", str(nbytes))):
            tensor.external_data.add(key=key, value=value)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        return tensor

    def close(self) -> str:
        """Flushes to disk and returns the file's sha256."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return self._sha.hexdigest()


def attach_external_weights(model_path: str | Path, plans: Mapping[str, WeightPlan],
                            header: SafetensorsHeader,
                            progress: Callable[[int], None] | None = None) -> dict[str, str]:
    """Turns the parameter inputs of a graph exported without its weights (torch.onnx.export
    with export_params=False, keep_initializers_as_inputs=True) into initializers whose data is
    written from `header`'s file into `<model>.data`. `plans` maps each parameter input name to
    what it is made of; every plan must be used and every parameter input must have a plan.
    Returns {data file name: sha256}."""
    import onnx

    model_path = Path(model_path)
    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    if graph.initializer:
        raise ValueError(f"{model_path.name} already holds weights")
    names = {i.name for i in graph.input}
    unused = sorted(set(plans) - names)
    if unused:
        raise ValueError(f"{model_path.name}: no graph input for parameter(s) {unused[:5]}")
    for name in plans:
        plans[name].check(header, name)
    data = ExternalDataFile(model_path.with_name(model_path.name + ".data"), progress)
    try:
        kept = []
        for inp in graph.input:
            plan = plans.get(inp.name)
            if plan is None:
                kept.append(inp)
                continue
            dims = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
            if dims != plan.shape or inp.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
                raise ValueError(f"{model_path.name}: parameter {inp.name} is {dims} in the "
                                 f"graph, {plan.shape} float32 in the plan")
            graph.initializer.append(data.add(inp.name, plan.shape, plan.blocks(header)))
        digest = data.close()
    except BaseException:
        data._file.close()
        raise
    del graph.input[:]
    graph.input.extend(kept)
    model_path.write_bytes(model.SerializeToString())
    return {data.path.name: digest}
