"""KV rings on the GPU, written in place: one strided copy per frame for every ring of a graph.

A graph reads each ring whole (input [B, H, T, Dh]) and returns only the step's new rows
([B, H, 1, Dh]); the runtime writes those rows at slot position % T. On the GPU all rings of a
graph live in one allocation, one after another, and all their row outputs in another; rings of
one shape then form a single table of rows:

    ring i, row (b, h), slot t  at  rings + ((i * B * H) + b * H + h) * T * row + t * row
    row output i, row (b, h)    at  rows  + ((i * B * H) + b * H + h) * row

(row = Dh * itemsize), so writing slot t of every ring is ONE cudaMemcpy2DAsync: width `row`,
height n_rings * B * H, destination pitch T * row starting at rings + t * row, source pitch
`row`. Rings of different shapes (not exported today) fall back to one such copy per ring.

The same buffers serve the native TensorRT backend (tensor addresses) and onnxruntime's CUDA
and TensorRT providers (IO binding with raw device pointers, `bind_rings_to_ort`).
"""

from __future__ import annotations

import numpy as np

from personaplex_edge.manifest import RingSpec

from .cuda_runtime import DeviceBuffer, Stream, copy_rows, fill_zero

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def _geometry(spec: RingSpec) -> tuple[int, int, int]:
    """(outer rows before the slot axis, slots T, bytes per slot row after it)."""
    outer = int(np.prod(spec.shape[:spec.axis], dtype=np.int64))
    inner = int(np.prod(spec.shape[spec.axis + 1:], dtype=np.int64)) * ITEMSIZE[spec.dtype]
    return outer, spec.capacity, inner


def row_shape(spec: RingSpec) -> tuple[int, ...]:
    return tuple(1 if i == spec.axis else n for i, n in enumerate(spec.shape))


class DeviceRings:
    """The rings of one graph and their row outputs, on the device. `ring_ptr[input_name]` and
    `row_ptr[output_name]` are the addresses to bind."""

    def __init__(self, specs: list[RingSpec], stream: Stream):
        self.specs = list(specs)
        self.ring_ptr: dict[str, int] = {}
        self.row_ptr: dict[str, int] = {}
        self._groups: list[tuple[int, int, int, int, int, int]] = []
        self._buffers: list[DeviceBuffer] = []
        # one group per distinct geometry, each in its own pair of allocations
        by_geometry: dict[tuple, list[RingSpec]] = {}
        for s in self.specs:
            if s.dtype not in ITEMSIZE:
                raise ValueError(f"ring {s.input_name}: dtype {s.dtype} is not a float type")
            by_geometry.setdefault(_geometry(s), []).append(s)
        for (outer, slots, inner), group in by_geometry.items():
            rings = DeviceBuffer(len(group) * outer * slots * inner)
            rows = DeviceBuffer(len(group) * outer * inner)
            self._buffers += [rings, rows]
            for i, s in enumerate(group):
                self.ring_ptr[s.input_name] = rings.ptr + i * outer * slots * inner
                self.row_ptr[s.output_name] = rows.ptr + i * outer * inner
            self._groups.append((rings.ptr, rows.ptr, len(group) * outer, slots, inner,
                                 rings.nbytes))
        # Zeros: a masked slot gets probability 0, but 0 * NaN is NaN, so slots never written
        # must not hold whatever bits cudaMalloc left there.
        self.clear(stream)
        stream.synchronize()

    def clear(self, stream: Stream) -> None:
        """Zeros every ring and row (queued on `stream`)."""
        for buf in self._buffers:
            fill_zero(buf.ptr, buf.nbytes, stream)

    def write(self, position: int, stream: Stream) -> None:
        """Queues the copy of every new row into slot position % T (ordered on `stream` after
        the graph run that produced the rows, and before the next one)."""
        for rings, rows, height, slots, inner, _ in self._groups:
            slot = position % slots
            copy_rows(rings + slot * inner, slots * inner, rows, inner, inner, height, stream)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers)

    def close(self) -> None:
        for buf in self._buffers:
            buf.close()
        self._buffers = []


def bind_rings_to_ort(binding, rings: DeviceRings, device_id: int = 0) -> None:
    """Binds each ring input and row output of `rings` to an onnxruntime IO binding by raw
    device pointer (onnxruntime's CUDA or TensorRT provider). bfloat16 rings cannot be bound
    this way: onnxruntime's Python API names element types by numpy dtype, which has none."""
    for s in rings.specs:
        if s.dtype == "bfloat16":
            raise ValueError("bfloat16 KV rings cannot be bound through onnxruntime's Python "
                             "API; use the native TensorRT backend or a float16 export")
        dtype = np.dtype(s.dtype)
        binding.bind_input(s.input_name, "cuda", device_id, dtype, list(s.shape),
                           rings.ring_ptr[s.input_name])
        binding.bind_output(s.output_name, "cuda", device_id, dtype, list(row_shape(s)),
                            rings.row_ptr[s.output_name])
