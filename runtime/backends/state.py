"""A graph's state, the same way on every backend: what a state tensor is, where each batch row
of it lives, and the one implementation of save, restore, reset and hold that every backend's
bound graph shares.

Every state tensor and every KV ring has the batch axis first ([B, ...]), so batch row b of a
tensor is one contiguous block of bytes. A backend keeps each tensor in a `Store` - host memory
(numpy) or device memory - that can read, write and copy rows; `BoundGraph` builds everything a
conversation needs on top of that:

    state(rows)         a copy of the rows' state tensors and KV rings (to save a persona)
    set_state(a, rows)  the reverse, every tensor checked first
    reset(rows)         state tensors back to their initial values; rings need nothing (their
                        slots are masked by position)
    run(active)         one call; rows outside `active` are held: their K/V rows are not
                        written and their state is copied back, so a row that had no input this
                        tick is exactly where it was

Host-side numpy here; device stores live in device_rings.py.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

import numpy as np

from personaplex_edge.errors import ModelDirError, StateError
from personaplex_edge.manifest import GraphEntry, RingSpec, StateSpec


def host_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a manifest dtype on the host (bfloat16 through ml_dtypes)."""
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise StateError("bfloat16 tensors on the host need ml_dtypes: pip install "
                             "ml_dtypes") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


Rows = Sequence[int] | None  # batch rows, None for all


def row_list(rows: Rows, batch: int) -> list[int]:
    if rows is None:
        return list(range(batch))
    out = [int(r) for r in rows]
    bad = [r for r in out if not 0 <= r < batch]
    if bad:
        raise StateError(f"batch rows {bad} do not exist (batch {batch})")
    return out


def state_specs(entry: GraphEntry) -> dict[str, StateSpec | RingSpec]:
    """A graph's whole state: its state tensors (by name) and its KV rings (by input name)."""
    specs: dict[str, StateSpec | RingSpec] = {s.name: s for s in entry.state}
    specs.update({r.input_name: r for r in entry.rings})
    return specs


def check_state(entry: GraphEntry, arrays: dict[str, np.ndarray],
                rows: int | None = None) -> dict[str, np.ndarray]:
    """`arrays` checked against the graph's whole state (its state tensors and KV rings): the
    same names, each with its shape (batch `rows` instead of the graph's where given) and dtype.
    Returns them as contiguous arrays, in the entry's order; raises StateError before anything
    is written."""
    specs = state_specs(entry)
    missing, unknown = sorted(set(specs) - set(arrays)), sorted(set(arrays) - set(specs))
    if missing or unknown:
        raise StateError(f"{entry.file}: state is missing {missing or 'nothing'} and "
                         f"has unknown {unknown or 'nothing'}")
    checked = {}
    for name, spec in specs.items():
        a = np.ascontiguousarray(arrays[name])
        shape = tuple(spec.shape) if rows is None else (rows, *spec.shape[1:])
        if a.shape != shape or a.dtype != host_dtype(spec.dtype):
            raise StateError(f"{entry.file}: state '{name}' must be {spec.dtype} "
                             f"{list(shape)}, got {a.dtype} {list(a.shape)}")
        checked[name] = a
    return checked


def dims_agree(want: tuple, have: tuple) -> bool:
    """A manifest's shape against a graph's or engine's: every fixed dimension equal; a
    dynamic one (-1 on the graph's side: Helium's frames axis) takes the manifest's size."""
    return len(want) == len(have) and all(h == -1 or h == w for w, h in zip(want, have))


def copy_input(entry_file: str, inputs: dict[str, np.ndarray], name: str,
               value: np.ndarray) -> None:
    """Copies `value` into the host input array `inputs[name]` (a same-kind cast, the shape
    must match)."""
    target = inputs.get(name)
    if target is None:
        raise StateError(f"{entry_file} has no input '{name}'; it takes " + ", ".join(inputs))
    if value.shape != target.shape:
        raise StateError(f"{entry_file} input '{name}' must have shape "
                         f"{list(target.shape)}, got {list(value.shape)}")
    np.copyto(target, value, casting="same_kind")


class Store(Protocol):
    """One tensor [B, ...] in host or device memory, by batch row."""

    def read(self, rows: list[int]) -> np.ndarray: ...  # a copy [len(rows), ...]
    def write(self, rows: list[int], array: np.ndarray) -> None: ...
    def fill(self, rows: list[int], value: float) -> None: ...
    def copy_rows_from(self, other: "Store", rows: list[int]) -> None: ...
    # KV rings [B, H, T, Dh] only: the first n slots of the rows
    def read_slots(self, rows: list[int], n: int) -> np.ndarray: ...
    def write_slots(self, rows: list[int], array: np.ndarray) -> None: ...


class HostStore:
    """A tensor in a numpy array (onnxruntime on the CPU binds the array's memory itself)."""

    def __init__(self, array: np.ndarray):
        self.array = array  # [B, ...]

    def read(self, rows: list[int]) -> np.ndarray:
        return self.array[rows].copy()

    def write(self, rows: list[int], array: np.ndarray) -> None:
        self.array[rows] = array

    def fill(self, rows: list[int], value: float) -> None:
        self.array[rows] = value

    def copy_rows_from(self, other: "HostStore", rows: list[int]) -> None:
        self.array[rows] = other.array[rows]

    def read_slots(self, rows: list[int], n: int) -> np.ndarray:
        return self.array[rows, :, :n].copy()

    def write_slots(self, rows: list[int], array: np.ndarray) -> None:
        self.array[rows, :, :array.shape[2]] = array


def write_ring_rows(spec: RingSpec, ring: np.ndarray, new: np.ndarray, positions: np.ndarray,
                    rows: Iterable[int]) -> None:
    """Host rings: for each batch row b in `rows`, the call's new rows [b, ..., r, ...] go to
    slot (positions[b] + r) % T of ring [b] in place (plain slicing, no temporary)."""
    axis, T = spec.axis, spec.capacity
    for b in rows:
        p = int(positions[b])
        for r in range(new.shape[axis]):
            target = [b] + [slice(None)] * (axis - 1) + [(p + r) % T]
            source = [b] + [slice(None)] * (axis - 1) + [r]
            ring[tuple(target)] = new[tuple(source)]


class BoundGraph:
    """The shared half of every backend's per-conversation graph. A backend sets, in its
    constructor: `entry`, `batch`, `inputs` / `outputs` (host arrays), `_stores` (two ping-pong
    dicts {state name: Store}), `_ring_stores` ({ring input name: Store}), `_turn` (the set the
    next call reads), and implements `_call(active)` (one run: it reads set `_turn`, writes the
    other set and writes the active rows' K/V rows into the rings; it does not flip `_turn`)
    and `_positions_changed()` (state was written from outside: refresh anything mirrored)."""

    entry: GraphEntry
    batch: int
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    _stores: list[dict[str, Store]]
    _ring_stores: dict[str, Store]
    _turn: int

    # -- per call -------------------------------------------------------------------------
    def run(self, active: Sequence[int] | None = None) -> dict[str, np.ndarray]:
        """One call over the whole batch; rows outside `active` (None: all) are held."""
        active = None if active is None else list(active)
        self._call(active)
        self.finish_call(active)
        return self.outputs

    def finish_call(self, active: list[int] | None) -> None:
        """After a call that read set `_turn` and wrote the other: the held rows' state is put
        back (the call wrote every row) and the parity flips."""
        held = [] if active is None else sorted(set(range(self.batch)) - set(active))
        if held and self.entry.state:
            before, after = self._stores[self._turn], self._stores[1 - self._turn]
            for s in self.entry.state:
                after[s.name].copy_rows_from(before[s.name], held)
        self._turn = 1 - self._turn
        if held and self.entry.state:
            self._positions_changed()

    def _call(self, active: list[int] | None) -> None:
        raise NotImplementedError

    def _check_open(self, handle) -> None:
        """`handle` (the backend's session or context) is None once the graph was closed."""
        if handle is None:
            raise ModelDirError(f"{self.entry.file}: this graph was closed")

    def _frames_count(self, frames: dict[str, np.ndarray], handle) -> int:
        """A call over several frames (run_frames), checked the same on every backend: the
        graph open, without state tensors. -> F, the frames of the call."""
        self._check_open(handle)
        if self.entry.state:
            raise ModelDirError(f"{self.entry.file}: a call over several frames is for graphs "
                                "without state tensors")
        return next(iter(frames.values())).shape[1]

    def _positions_changed(self) -> None:
        pass

    # -- state ------------------------------------------------------------------------------
    def _store(self, name: str) -> Store:
        return self._ring_stores[name] if name in self._ring_stores \
            else self._stores[self._turn][name]

    def state(self, rows: Rows = None) -> dict[str, np.ndarray]:
        """The rows' current state, KV rings included, as host arrays (a copy)."""
        rows = row_list(rows, self.batch)
        return {name: self._store(name).read(rows) for name in state_specs(self.entry)}

    def set_state(self, arrays: dict[str, np.ndarray], rows: Rows = None) -> None:
        """Replaces the rows' whole state (e.g. one saved with `state()`), every tensor checked
        before anything is written."""
        rows = row_list(rows, self.batch)
        for name, a in check_state(self.entry, arrays, len(rows)).items():
            self._store(name).write(rows, a)
        self._positions_changed()

    def reset(self, rows: Rows = None) -> None:
        """The rows' state tensors back to their initial values, in place. KV rings need no
        clearing: a slot not written since the reset is masked by its position."""
        rows = row_list(rows, self.batch)
        for s in self.entry.state:
            self._stores[self._turn][s.name].fill(rows, s.init)
        self._positions_changed()

    def fill_rings(self, rows: Rows, value: float = 0.0) -> None:
        """Every slot of the rows' KV rings set to `value`, in place: a stand-in for a long
        conversation's history (bench --position), so that a full ring reads memory that is
        really there, not pages the system has not handed out yet (those read as one shared
        zero page, from the cache)."""
        rows = row_list(rows, self.batch)
        for store in self._ring_stores.values():
            store.fill(rows, value)

    def ring_prefix(self, rows: Rows, slots: int) -> dict[str, np.ndarray]:
        """The first `slots` slots of every KV ring of the rows (what positions 0..slots-1
        wrote, while the rings have not wrapped): a persona's whole effect on the graph."""
        rows = row_list(rows, self.batch)
        return {r.input_name: self._ring_stores[r.input_name].read_slots(rows, slots)
                for r in self.entry.rings}

    def set_ring_prefix(self, arrays: dict[str, np.ndarray], rows: Rows) -> None:
        """The reverse of ring_prefix, every ring checked first."""
        rows = row_list(rows, self.batch)
        specs = {r.input_name: r for r in self.entry.rings}
        if set(arrays) != set(specs):
            raise StateError(f"{self.entry.file}: a ring prefix must hold exactly its rings")
        for name, a in arrays.items():
            spec = specs[name]
            want = (len(rows), *spec.shape[1:2], a.shape[2], *spec.shape[3:])
            if a.shape != want or a.shape[2] > spec.capacity or \
                    a.dtype != host_dtype(spec.dtype):
                raise StateError(f"{self.entry.file}: ring prefix '{name}' must be "
                                 f"{spec.dtype} {list(want)}, got {a.dtype} {list(a.shape)}")
        for name, a in arrays.items():
            self._ring_stores[name].write_slots(rows, a)

    def set_input(self, name: str, value: np.ndarray) -> None:
        copy_input(self.entry.file, self.inputs, name, value)

    def close(self) -> None:
        pass
