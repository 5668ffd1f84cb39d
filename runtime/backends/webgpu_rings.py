"""KV rings on a WebGPU adapter, written in place, and the row-wise store of any tensor there.

A graph reads each ring whole ([B, H, T, Dh]) and returns only the call's R new rows
([B, H, R, Dh]); row r of batch row b belongs at slot (p[b] + r) % T. WebGPU has no copy into
part of a buffer that onnxruntime's Python API exposes, so the write is a graph of its own, run
on the same adapter right after the step: one ScatterElements per ring (axis 2, the slots),
whose input and output are bound to the ring's one buffer. onnxruntime's WebGPU kernel copies
its input to its output only when the two differ, so the ring is updated in place and a frame
moves only its new rows - B * H * R * Dh values a ring, nothing through the host. The slot of
every element comes from the host as a small int32 index tensor ([B, H, R, Dh], the same for
every ring of a shape and position), one upload a frame.

Rows held in a lockstep batch (no input this tick) must keep their slots as they are: a second
graph writes, for those rows, what the slots already hold (GatherElements + Where), made on
first use.

`WebGpuStore` is the state.Store of a tensor in a WebGPU buffer: its row reads and writes go
through the host whole (onnxruntime offers whole-tensor copies only). They serve persona save
and restore, reset and held state rows, never the per-frame ring write.
"""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from personaplex_edge.manifest import RingSpec

from .state import host_dtype

_ONNX_TYPES = {"float32": 1, "float16": 10}  # TensorProto.FLOAT, FLOAT16

# One at a time on the adapter: the provider queues every session's work on one device of the
# process and is not safe for runs from two threads at once (a server prefills a persona on its
# prefill thread while its tick thread steps the others: measured, a CPU node of one run read
# another's shapes). A GPU runs one queue anyway; this makes the host side agree.
ADAPTER_LOCK = threading.RLock()


def device_value(shape: Sequence[int], dtype: str, fill: float | None = 0.0):
    """A tensor allocated on the WebGPU adapter (zeros, or `fill`, or left as allocated when
    None)."""
    import onnxruntime as ort

    with ADAPTER_LOCK:
        if fill is None:
            return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), host_dtype(dtype),
                                                             "webgpu", 0)
        return ort.OrtValue.ortvalue_from_numpy(np.full(shape, fill, host_dtype(dtype)),
                                                "webgpu", 0)


def _groups(specs: list[RingSpec]) -> dict[tuple, list[int]]:
    """Rings that share one index tensor: the same position and row-output shape."""
    out: dict[tuple, list[int]] = {}
    for i, s in enumerate(specs):
        if s.axis != 2 or len(s.shape) != 4:
            raise ValueError(f"ring {s.input_name}: the WebGPU ring write takes [B, H, T, Dh] "
                             "rings with slots on axis 2")
        out.setdefault((s.position, tuple(s.rows_shape)), []).append(i)
    return out


def ring_write_model(specs: list[RingSpec], hold: bool, rows: int | None = None) -> bytes:
    """The ring-write graph of `specs` (module docstring): inputs `ring.i`, `rows.i` and one
    `slots.g` per group, outputs `ring_out.i` (bound to `ring.i`'s buffer); with `hold`, a
    `write.g` [B, 1, 1, 1] bool per group keeps the other rows' slots. `rows` overrides R
    (a persona's prefill writes all its frames at once)."""
    from onnx import TensorProto, helper

    inputs, outputs, nodes = [], [], []
    for g, (key, members) in enumerate(_groups(specs).items()):
        shape = list(key[1])
        if rows is not None:
            shape[2] = rows
        inputs.append(helper.make_tensor_value_info(f"slots.{g}", TensorProto.INT32, shape))
        if hold:
            inputs.append(helper.make_tensor_value_info(f"write.{g}", TensorProto.BOOL,
                                                        [shape[0], 1, 1, 1]))
        for i in members:
            s = specs[i]
            kind = _ONNX_TYPES[s.dtype]
            inputs += [helper.make_tensor_value_info(f"ring.{i}", kind, list(s.shape)),
                       helper.make_tensor_value_info(f"rows.{i}", kind, shape)]
            outputs.append(helper.make_tensor_value_info(f"ring_out.{i}", kind, list(s.shape)))
            new = f"rows.{i}"
            if hold:
                nodes += [helper.make_node("GatherElements", [f"ring.{i}", f"slots.{g}"],
                                           [f"kept.{i}"], axis=2),
                          helper.make_node("Where", [f"write.{g}", f"rows.{i}", f"kept.{i}"],
                                           [f"new.{i}"])]
                new = f"new.{i}"
            nodes.append(helper.make_node("ScatterElements", [f"ring.{i}", f"slots.{g}", new],
                                          [f"ring_out.{i}"], axis=2))
    graph = helper.make_graph(nodes, "ring_write", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model.SerializeToString()


class RingWriter:
    """The rings of one bound graph on the adapter, and their per-frame write."""

    def __init__(self, specs: list[RingSpec], options, capture: bool = False):
        import onnxruntime as ort

        self.specs = list(specs)
        self._options = options  # a callable: capture -> SessionOptions for the adapter
        self.rings = [device_value(s.shape, s.dtype) for s in self.specs]
        self.rows = [device_value(s.rows_shape, s.dtype) for s in self.specs]
        self._groups = list(_groups(self.specs).items())
        # [B, H, R, Dh] int32 slots per group, built on the host in place each frame
        self._slots = [np.zeros(key[1], np.int32) for key, _ in self._groups]
        # copied up each frame: onnxruntime copies a host array bound to a GPU session when it
        # is bound, not at each run
        self._dev_slots = [device_value(a.shape, "int32") for a in self._slots]
        with ADAPTER_LOCK:
            self._session = ort.InferenceSession(ring_write_model(self.specs, False),
                                                 options(capture))
        self._binding = self._bind(self._session, self.rows, self._dev_slots)
        self._run_options = ort.RunOptions()
        if capture:
            self._run_options.add_run_config_entry("gpu_graph_id", "1")
        self._held = None  # (session, binding, write masks), made on first use

    def _bind(self, session, rows, slots, masks=None):
        binding = session.io_binding()
        for g, (_, members) in enumerate(self._groups):
            binding.bind_ortvalue_input(f"slots.{g}", slots[g])
            if masks is not None:
                binding.bind_ortvalue_input(f"write.{g}", masks[g])
            for i in members:
                binding.bind_ortvalue_input(f"ring.{i}", self.rings[i])
                binding.bind_ortvalue_input(f"rows.{i}", rows[i])
                binding.bind_ortvalue_output(f"ring_out.{i}", self.rings[i])
        return binding

    def _fill_slots(self, positions: dict[str, np.ndarray], out: list[np.ndarray]) -> None:
        """Each group's index tensor `out[g]` ([B, H, R, Dh]): slot (p[b] + r) % T for every
        (b, h, r, d), R its own rows."""
        for g, (key, members) in enumerate(self._groups):
            capacity = self.specs[members[0]].capacity
            p = np.asarray(positions[key[0]], np.int64).reshape(-1, 1, 1, 1)
            r = np.arange(out[g].shape[2], dtype=np.int64).reshape(1, 1, -1, 1)
            np.copyto(out[g], (p + r) % capacity, casting="unsafe")

    def write(self, positions: dict[str, np.ndarray], active: list[int] | None) -> None:
        """After a step: every ring's new rows into their slots, for the batch rows in
        `active` (None: all). `positions`: each position name's [B] values before the step."""
        with ADAPTER_LOCK:
            if active is not None and len(active) < self.specs[0].shape[0]:
                self._write_held(positions, active)
                return
            self._fill_slots(positions, self._slots)
            for dev, host in zip(self._dev_slots, self._slots):
                dev.update_inplace(host)
            self._session.run_with_iobinding(self._binding, self._run_options)

    def _write_held(self, positions: dict[str, np.ndarray], active: list[int]) -> None:
        import onnxruntime as ort

        if self._held is None:  # (under ADAPTER_LOCK: write's)
            session = ort.InferenceSession(ring_write_model(self.specs, True), self._options(False))
            masks = [device_value((key[1][0], 1, 1, 1), "bool", False) for key, _ in self._groups]
            binding = self._bind(session, self.rows, self._dev_slots, masks)
            self._held = (session, binding, masks)
        session, binding, masks = self._held
        self._fill_slots(positions, self._slots)
        for dev, host in zip(self._dev_slots, self._slots):
            dev.update_inplace(host)
        write = np.zeros(masks[0].shape(), np.bool_)
        write[active] = True
        for m in masks:
            m.update_inplace(write)
        session.run_with_iobinding(binding)

    def write_frames(self, new_rows: list, count: int, positions: dict[str, np.ndarray],
                     active: list[int]) -> None:
        """After a call over `count` frames (a persona's prefill): `new_rows[i]` ([B, H, count,
        Dh] on the adapter) into slots p[b]..p[b] + count - 1 of the `active` rows. Once per
        persona: its graph is made for the call."""
        import onnxruntime as ort

        hold = len(active) < self.specs[0].shape[0]
        with ADAPTER_LOCK:
            session = ort.InferenceSession(ring_write_model(self.specs, hold, rows=count),
                                           self._options(False))
        slots = [np.zeros((*key[1][:2], count, key[1][3]), np.int32) for key, _ in self._groups]
        self._fill_slots(positions, slots)
        masks = None
        if hold:
            write = np.zeros((self.specs[0].shape[0], 1, 1, 1), np.bool_)
            write[active] = True
            masks = [ort.OrtValue.ortvalue_from_numpy(write, "webgpu", 0) for _ in self._groups]
        with ADAPTER_LOCK:
            binding = self._bind(session, new_rows, [ort.OrtValue.ortvalue_from_numpy(
                a, "webgpu", 0) for a in slots], masks)
            session.run_with_iobinding(binding)


class WebGpuStore:
    """A tensor [B, ...] in a WebGPU buffer, by batch row (the module docstring's Store): each
    read or write moves the whole tensor through the host."""

    def __init__(self, value):
        self.value = value  # an OrtValue on the adapter

    def _whole(self) -> np.ndarray:
        with ADAPTER_LOCK:
            return self.value.numpy()

    def _put(self, whole: np.ndarray) -> None:
        with ADAPTER_LOCK:
            self.value.update_inplace(np.ascontiguousarray(whole))

    def read(self, rows: list[int]) -> np.ndarray:
        return self._whole()[rows].copy()

    def write(self, rows: list[int], array: np.ndarray) -> None:
        whole = self._whole()
        whole[rows] = array
        self._put(whole)

    def fill(self, rows: list[int], value: float) -> None:
        whole = self._whole()
        whole[rows] = value
        self._put(whole)

    def copy_rows_from(self, other: "WebGpuStore", rows: list[int]) -> None:
        self.write(rows, other._whole()[rows])

    def read_slots(self, rows: list[int], n: int) -> np.ndarray:
        return self._whole()[rows, :, :n].copy()

    def write_slots(self, rows: list[int], array: np.ndarray) -> None:
        whole = self._whole()
        whole[rows, :, :array.shape[2]] = array
        self._put(whole)
