"""The half of a bound graph that every GPU backend shares (onnxruntime CUDA, TensorRT): each
input and output as a pinned host array and a device buffer, the two ping-pong state sets,
the KV rings (DeviceRings), the ring positions mirrored to the host, their row-wise stores
for state.BoundGraph, and freeing all of it."""

from __future__ import annotations

import numpy as np

from personaplex_edge.manifest import GraphEntry

from .cuda_runtime import DeviceBuffer, PinnedArray, Stream
from .device_rings import DeviceRings, DeviceStore, RingPositions
from .state import BoundGraph, host_dtype


def nbytes(shape, dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * host_dtype(dtype).itemsize


class DeviceGraph(BoundGraph):
    """Subclasses call `_allocate(entry, stream)` and implement `_call`."""

    stream: Stream
    _own_stream: bool = False

    def _allocate(self, entry: GraphEntry, stream: Stream) -> None:
        self.entry = entry
        self.device = "cuda"
        self.stream = stream
        self.batch = entry.inputs[0].shape[0]
        self._pinned_in = {t.name: PinnedArray(t.shape, host_dtype(t.dtype))
                           for t in entry.inputs}
        self._pinned_out = {t.name: PinnedArray(t.shape, host_dtype(t.dtype))
                            for t in entry.outputs}
        self.inputs = {n: p.array for n, p in self._pinned_in.items()}
        self.outputs = {n: p.array for n, p in self._pinned_out.items()}
        self._dev_in = {t.name: DeviceBuffer(nbytes(t.shape, t.dtype)) for t in entry.inputs}
        self._dev_out = {t.name: DeviceBuffer(nbytes(t.shape, t.dtype)) for t in entry.outputs}
        self._state = [{s.name: DeviceBuffer(nbytes(s.shape, s.dtype)) for s in entry.state}
                       for _ in range(2)]
        self._stores = [{s.name: DeviceStore(st[s.name].ptr, s.shape, s.dtype, stream)
                         for s in entry.state} for st in self._state]
        self.rings = DeviceRings(entry.rings, stream)
        self._ring_stores = {r.input_name: DeviceStore(self.rings.ring_ptr[r.input_name],
                                                       r.shape, r.dtype, stream)
                             for r in entry.rings}
        self._positions = RingPositions(entry, self.inputs, host_dtype)
        self._turn = 0

    def _state_ptrs(self, turn: int) -> dict[str, int]:
        return {n: b.ptr for n, b in self._state[turn].items()}

    def _positions_changed(self) -> None:
        self._positions.sync(self._state_ptrs(self._turn), self.stream)

    def close(self) -> None:
        """Frees the device memory now (otherwise when the graph is collected); pinned host
        buffers go with the last view of them."""
        self.stream.synchronize()
        for buf in (*self._dev_in.values(), *self._dev_out.values(),
                    *(b for s in self._state for b in s.values())):
            buf.close()
        for pinned in (*self._pinned_in.values(), *self._pinned_out.values()):
            pinned.close()
        self.rings.close()
        self._positions.close()
        if self._own_stream:
            self.stream.close()
