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

Rows of a batch at different positions (conversations of a lockstep batch that joined at
different times) each go to their own slot: one strided copy per ring and batch row (height H
instead of n_rings * B * H). Where every row is written at the same slot - always at batch 1 -
the single copy above does it.

The same buffers serve the native TensorRT backend (tensor addresses) and onnxruntime's CUDA
and TensorRT providers (IO binding with raw device pointers, `bind_rings_to_ort`).
`DeviceStore` gives any device tensor [B, ...] the row-wise reads and writes that
state.BoundGraph builds state save, restore, reset and hold on.
"""

from __future__ import annotations

import math

import numpy as np

from personaplex_edge.contract import STATE_INPUT_PREFIX
from personaplex_edge.manifest import RingSpec

from .cuda_runtime import (DeviceBuffer, PinnedArray, Stream, copy_device, copy_rows,
                           copy_to_device, copy_to_host, fill_zero)
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
        # per ring: (ring address, rows address, rows per batch row (H), slots, bytes per slot
        # row, rows per call, position name), for rows written at their own slots
        self._rings: list[tuple[int, int, int, int, int, int, str]] = []
        self._by_output: dict[str, tuple[int, int, int, int, int, int, str]] = {}
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
                self._rings.append((self.ring_ptr[s.input_name], self.row_ptr[s.output_name],
                                    outer // s.shape[0], slots, inner, rows_per_call, position))
                self._by_output[s.output_name] = self._rings[-1]
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

    def write(self, positions: dict[str, np.ndarray], stream: Stream,
              active: list[int] | None = None) -> None:
        """Queues the copy of every new row r of batch row b into slot (p[b] + r) % T,
        p = positions[the ring's position name] ([B], before the call), for the rows in
        `active` (None: all). Ordered on `stream` after the run that produced the rows, and
        before the next one."""
        together = {name: p for name, p in positions.items()
                    if active is None and p.size and (p == p[0]).all()}
        for rings, rows, height, slots, inner, per_call, position in self._groups:
            if position not in together:
                continue
            p = int(together[position][0])
            for r in range(per_call):
                slot = (p + r) % slots
                copy_rows(rings + slot * inner, slots * inner, rows + r * inner,
                          per_call * inner, inner, height, stream)
        for ring, new, heads, slots, inner, per_call, position in self._rings:
            if position in together:
                continue
            p = positions[position]
            for b in (range(p.size) if active is None else active):
                for r in range(per_call):
                    slot = (int(p[b]) + r) % slots
                    copy_rows(ring + (b * heads * slots + slot) * inner, slots * inner,
                              new + (b * heads * per_call + r) * inner, per_call * inner,
                              inner, heads, stream)

    def write_frames(self, new_rows: dict[str, int], count: int,
                     positions: dict[str, np.ndarray], stream: Stream, rows: list[int]) -> None:
        """After a call over `count` frames: each ring's new rows (`new_rows[output name]`, a
        device buffer [B, H, count, Dh]) go to slots p[b]..p[b] + count - 1 of batch row b,
        for the `rows` given: one strided copy per ring and row (two where the slots wrap)."""
        for name, src in new_rows.items():
            ring, _, heads, slots, inner, _, position = self._by_output[name]
            for b in rows:
                done = 0
                while done < count:
                    slot = (int(positions[position][b]) + done) % slots
                    n = min(count - done, slots - slot)  # up to the end of the ring
                    copy_rows(ring + (b * heads * slots + slot) * inner, slots * inner,
                              src + (b * heads * count + done) * inner, count * inner,
                              n * inner, heads, stream)
                    done += n

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers)

    def close(self) -> None:
        for buf in self._buffers:
            buf.close()
        self._buffers = []


class RingPositions:
    """Each ring's positions before a call ([B], one per batch row), known on the host without
    waiting for the device.

    A position named by a graph input is read from the host input array. One named by a state
    tensor (`past.<name>`, Mimi's step counter [B]) lives on the device: after every run its new
    value (`present.<name>`) is copied to a pinned host mirror, in the same queue, so it is
    there once the run has been waited for - which every caller does before the next frame.
    State written from outside (set_state, reset, a held row) is mirrored again with `sync`."""

    def __init__(self, entry, host_inputs: dict[str, np.ndarray], host_dtype):
        states = {s.name: s for s in entry.state}
        self._inputs = host_inputs
        self._names = sorted({r.position for r in entry.rings})
        self.mirrors: dict[str, PinnedArray] = {}  # state name -> [B] pinned
        for name in self._names:
            if name in host_inputs:
                continue
            state = name.removeprefix(STATE_INPUT_PREFIX)
            if state not in states:
                raise ValueError(f"{entry.file}: ring position {name!r} is neither an input nor "
                                 "a state tensor")
            self.mirrors[state] = PinnedArray(states[state].shape, host_dtype(states[state].dtype))
        self._now = {name: np.zeros(1, np.int64) for name in self._names}

    def now(self) -> dict[str, np.ndarray]:
        """{position name: [B] values before the next call} (arrays reused call after call)."""
        for name in self._names:
            src = (self._inputs[name] if name in self._inputs
                   else self.mirrors[name.removeprefix(STATE_INPUT_PREFIX)].array).reshape(-1)
            if self._now[name].shape != src.shape:
                self._now[name] = np.zeros(src.shape, np.int64)
            np.copyto(self._now[name], src, casting="unsafe")
        return self._now

    def after_run(self, written: dict[str, int], stream: Stream) -> None:
        """Queues the copy of each position state's new value; `written` maps state names to
        the device buffers the run wrote."""
        for state, pinned in self.mirrors.items():
            copy_to_host(pinned.array, written[state], stream, pinned.ptr)

    def sync(self, current: dict[str, int], stream: Stream) -> None:
        """Mirrors the position states from the buffers `current` names (after a write from
        outside); waits for the copies."""
        self.after_run(current, stream)
        stream.synchronize()

    def close(self) -> None:
        for pinned in self.mirrors.values():
            pinned.close()


class DeviceStore:
    """A tensor [B, ...] in device memory, by batch row: the Store of state.BoundGraph on a GPU
    backend. Reads and writes wait for their copies (they are not per frame); row copies and
    fills are queued on the stream."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: str, stream: Stream):
        self.ptr, self.shape, self.stream = ptr, tuple(shape), stream
        self.dtype = host_dtype(dtype)
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def _at(self, b: int) -> int:
        return self.ptr + b * self.row_bytes

    def read(self, rows: list[int]) -> np.ndarray:
        out = np.empty((len(rows), *self.shape[1:]), self.dtype)
        flat = out.reshape(len(rows), -1)  # [rows, row elements]: a row is an array, never
        for i, b in enumerate(rows):      # a numpy scalar (a state [B] has 1-element rows)
            copy_to_host(flat[i], self._at(b), self.stream)
        self.stream.synchronize()
        return out

    def write(self, rows: list[int], array: np.ndarray) -> None:
        flat = np.ascontiguousarray(array, self.dtype).reshape(len(rows), -1)
        for i, b in enumerate(rows):
            copy_to_device(self._at(b), flat[i], self.stream)
        self.stream.synchronize()  # the pageable source must outlive the copy

    def fill(self, rows: list[int], value: float) -> None:
        if value == 0.0:
            for b in rows:
                fill_zero(self._at(b), self.row_bytes, self.stream)
            return
        self.write(rows, np.full((len(rows), *self.shape[1:]), value, self.dtype))

    def copy_rows_from(self, other: "DeviceStore", rows: list[int]) -> None:
        for b in rows:
            copy_device(self._at(b), other._at(b), self.row_bytes, self.stream)

    def _slot_geometry(self, n: int) -> tuple[int, int, int]:
        """A ring [B, H, T, Dh]: (H, bytes of T slots, bytes of n slots) per head."""
        _, heads, slots, *rest = self.shape
        inner = int(np.prod(rest, dtype=np.int64)) * self.dtype.itemsize
        return heads, slots * inner, n * inner

    def read_slots(self, rows: list[int], n: int) -> np.ndarray:
        heads, pitch, width = self._slot_geometry(n)
        out = np.empty((len(rows), heads, n, *self.shape[3:]), self.dtype)
        for i, b in enumerate(rows):
            copy_rows(out[i].ctypes.data, width, self._at(b), pitch, width, heads, self.stream,
                      "DeviceToHost")
        self.stream.synchronize()
        return out

    def write_slots(self, rows: list[int], array: np.ndarray) -> None:
        array = np.ascontiguousarray(array, self.dtype)
        heads, pitch, width = self._slot_geometry(array.shape[2])
        for i, b in enumerate(rows):
            copy_rows(self._at(b), pitch, array[i].ctypes.data, width, width, heads,
                      self.stream, "HostToDevice")
        self.stream.synchronize()


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
