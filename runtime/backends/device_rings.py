"""KV rings on the GPU, written in place: one strided copy per frame for every ring of a graph.

A graph reads each ring whole (input [B, H, T, Dh]) and returns only the call's R new rows
([B, H, R, Dh]); the runtime writes row r at slot (p + r) % T, p being the ring's position (a
graph input, or a state tensor, named by the RingSpec) before the call. On the GPU all rings of
a graph that share a shape and a position live in one allocation, one after another, and their
row outputs in another; they then form a single table of rows:

    ring i, row (b, h), slot t    at  rings + ((i * B * H) + b * H + h) * T * row + t * row
    row output i, row (b, h), r   at  rows  + ((i * B * H) + b * H + h) * R * row + r * row

(row = Dh * itemsize), so writing slot t of every ring is ONE cudaMemcpy2DAsync: width `row`,
height n_rings * B * H, destination pitch T * row from rings + t * row, source pitch R * row
from rows + r * row; R copies per call (1 for Helium, 2 for Mimi's transformers).

TensorRT wants every tensor address 256-byte aligned (IExecutionContext::setTensorAddress), and
cudaMalloc only aligns the start of an allocation. Where a ring or its rows are not a multiple
of 256 bytes long (small widths: 4 heads x 1 row x 32 bytes), each ring is given a few unused
(b, h) rows of padding, the same number in both tables, so that the next ring starts aligned
and the single copy still lines up: `B * H` above becomes that padded count.

The same buffers serve the native TensorRT backend (tensor addresses) and onnxruntime's CUDA
and TensorRT providers (IO binding with raw device pointers, `bind_rings_to_ort`).
"""

from __future__ import annotations

import math

import numpy as np

from personaplex_edge.manifest import RingSpec

from .cuda_runtime import (DeviceBuffer, PinnedArray, Stream, copy_rows, copy_to_device,
                           copy_to_host, fill_zero)
from .state import host_dtype

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
ALIGN = 256  # bytes: what TensorRT asks of a tensor address, and what cudaMalloc gives


def _geometry(spec: RingSpec) -> tuple[int, int, int, int, str]:
    """(outer rows before the slot axis, slots T, bytes per slot row after it, rows per call,
    position name): rings alike in all five share one copy."""
    outer = int(np.prod(spec.shape[:spec.axis], dtype=np.int64))
    inner = int(np.prod(spec.shape[spec.axis + 1:], dtype=np.int64)) * ITEMSIZE[spec.dtype]
    return outer, spec.capacity, inner, spec.rows, spec.position


def padded_rows(outer: int, slots: int, inner: int, rows_per_call: int) -> int:
    """How many (b, h) rows one ring takes in its group's tables: `outer` rounded up so that a
    ring of that many rows and its row output are both whole multiples of ALIGN bytes."""
    step = math.lcm(ALIGN // math.gcd(ALIGN, slots * inner),
                    ALIGN // math.gcd(ALIGN, rows_per_call * inner))
    return -(-outer // step) * step


class DeviceRings:
    """The rings of one graph and their row outputs, on the device. `ring_ptr[input_name]` and
    `row_ptr[output_name]` are the addresses to bind."""

    def __init__(self, specs: list[RingSpec], stream: Stream):
        self.specs = list(specs)
        self.ring_ptr: dict[str, int] = {}
        self.row_ptr: dict[str, int] = {}
        self._groups: list[tuple[int, int, int, int, int, int, str]] = []
        self._buffers: list[DeviceBuffer] = []
        by_geometry: dict[tuple, list[RingSpec]] = {}
        for s in self.specs:
            if s.dtype not in ITEMSIZE:
                raise ValueError(f"ring {s.input_name}: dtype {s.dtype} is not a float type")
            by_geometry.setdefault(_geometry(s), []).append(s)
        for (outer, slots, inner, rows_per_call, position), group in by_geometry.items():
            stride = padded_rows(outer, slots, inner, rows_per_call)
            height = (len(group) - 1) * stride + outer  # the last ring needs no padding
            rings = DeviceBuffer(height * slots * inner)
            rows = DeviceBuffer(height * rows_per_call * inner)
            self._buffers += [rings, rows]
            for i, s in enumerate(group):
                self.ring_ptr[s.input_name] = rings.ptr + i * stride * slots * inner
                self.row_ptr[s.output_name] = rows.ptr + i * stride * rows_per_call * inner
            self._groups.append((rings.ptr, rows.ptr, height, slots, inner, rows_per_call,
                                 position))
        # Zeros: a masked slot gets probability 0, but 0 * NaN is NaN, so slots never written
        # must not hold whatever bits cudaMalloc left there.
        self.clear(stream)
        stream.synchronize()

    def clear(self, stream: Stream) -> None:
        """Zeros every ring and row (queued on `stream`)."""
        for buf in self._buffers:
            fill_zero(buf.ptr, buf.nbytes, stream)

    def write(self, positions: dict[str, int], stream: Stream) -> None:
        """Queues the copy of every new row r into slot (p + r) % T, p = positions[the ring's
        position name] (ordered on `stream` after the run that produced the rows, and before
        the next one)."""
        for rings, rows, height, slots, inner, per_call, position in self._groups:
            p = positions[position]
            for r in range(per_call):
                slot = (p + r) % slots
                copy_rows(rings + slot * inner, slots * inner, rows + r * inner,
                          per_call * inner, inner, height, stream)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers)

    def close(self) -> None:
        for buf in self._buffers:
            buf.close()
        self._buffers = []


class RingPositions:
    """Each ring's position before a call, known on the host without waiting for the device.

    A position named by a graph input is read from the host input array. One named by a state
    tensor (`past.<name>`, Mimi's step counter) lives on the device: after every run its new
    value (the first element of `present.<name>`) is copied to a pinned host scalar, in the same
    queue, so it is there once the run has been waited for - which every caller does before
    the next frame."""

    def __init__(self, entry, host_inputs: dict[str, np.ndarray], host_dtype):
        states = {s.name: s for s in entry.state}
        self._inputs = host_inputs
        self._names = sorted({r.position for r in entry.rings})
        self.mirrors: dict[str, PinnedArray] = {}  # state name -> [1] pinned
        self._init: dict[str, float] = {}
        for name in self._names:
            if name in host_inputs:
                continue
            state = name.removeprefix("past.")
            if state not in states:
                raise ValueError(f"{entry.file}: ring position {name!r} is neither an input nor "
                                 "a state tensor")
            self.mirrors[state] = PinnedArray((1,), host_dtype(states[state].dtype))
            self._init[state] = states[state].init
        self.reset()

    def now(self) -> dict[str, int]:
        """{position name: value before the next call}."""
        return {name: int(self._inputs[name].flat[0]) if name in self._inputs
                else int(self.mirrors[name.removeprefix("past.")].array[0])
                for name in self._names}

    def after_run(self, written: dict[str, int], stream: Stream) -> None:
        """Queues the copy of each position state's new value; `written` maps state names to
        the device buffers the run wrote."""
        for state, pinned in self.mirrors.items():
            copy_to_host(pinned.array, written[state], stream, pinned.ptr)

    def reset(self) -> None:
        for state, pinned in self.mirrors.items():
            pinned.array[0] = self._init[state]

    def set(self, arrays: dict[str, np.ndarray]) -> None:
        for state, pinned in self.mirrors.items():
            pinned.array[0] = np.asarray(arrays[state]).flat[0]

    def close(self) -> None:
        for pinned in self.mirrors.values():
            pinned.close()


def download_state(entry, state: dict[str, DeviceBuffer], rings: DeviceRings,
                   stream: Stream) -> dict[str, np.ndarray]:
    """A graph's whole state - its state buffers `state` (one ping-pong set) and its KV rings -
    copied to new host arrays; waits for the copies."""
    out = {s.name: np.empty(s.shape, host_dtype(s.dtype)) for s in entry.state}
    for name, a in out.items():
        copy_to_host(a, state[name].ptr, stream)
    for r in entry.rings:
        out[r.input_name] = np.empty(r.shape, host_dtype(r.dtype))
        copy_to_host(out[r.input_name], rings.ring_ptr[r.input_name], stream)
    stream.synchronize()
    return out


def upload_state(arrays: dict[str, np.ndarray], state: dict[str, DeviceBuffer],
                 rings: DeviceRings, positions: RingPositions, stream: Stream) -> None:
    """The reverse of download_state, for arrays checked by graph_io.check_state: each goes to
    its ring or state buffer, the mirrored ring positions follow; waits for the copies (their
    pageable sources must outlive them)."""
    for name, a in arrays.items():
        dst = rings.ring_ptr[name] if name in rings.ring_ptr else state[name].ptr
        copy_to_device(dst, a, stream)
    positions.set(arrays)
    stream.synchronize()


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
        binding.bind_output(s.output_name, "cuda", device_id, dtype, list(s.rows_shape),
                            rings.row_ptr[s.output_name])
