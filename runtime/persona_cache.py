"""The persona cache's store: prefilled personas (`Snapshot`s) by key, in memory (an LRU
bounded in bytes) and optionally on disk, one file per persona, written atomically and checked
by hash on load (a damaged or foreign file is ignored with one line, and rebuilt).

What a snapshot holds and why restoring one is exact: runtime/persona.py. This module knows
nothing of models or personas beyond the key it is given, so the loaded model's users can hold
a cache without a circle of imports.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from personaplex_edge.atomic import write_bytes_atomic

from .prompts import Prefill

CACHE_FORMAT = 1


@dataclass
class Snapshot:
    """A row's state after a persona's forced columns: Helium's ring slots 0..forced-1; plus the
    persona's last column, which each conversation samples itself."""

    forced: int  # columns run (= len(plan) - 1)
    rings: dict[str, np.ndarray]  # ring input name -> [1, H, forced, Dh]
    last_column: np.ndarray  # [17]
    last_embedding: np.ndarray | None  # [D]
    pending: np.ndarray  # [17]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.rings.values())

    def plan(self) -> Prefill:
        """The part of the persona's Prefill still to run: only its last column is read."""
        return Prefill(columns=[None] * self.forced + [self.last_column],
                       embeddings=[None] * self.forced + [self.last_embedding],
                       pending=self.pending)

    # -- files --------------------------------------------------------------------------------
    def to_bytes(self, key: str) -> bytes:
        arrays = {f"ring/{k}": v for k, v in self.rings.items()}
        arrays.update(last_column=self.last_column, pending=self.pending)
        if self.last_embedding is not None:
            arrays["last_embedding"] = self.last_embedding
        digest = _digest(arrays)
        header = {"format": CACHE_FORMAT, "key": key, "forced": self.forced, "sha256": digest}
        buf = io.BytesIO()
        np.savez(buf, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, key: str) -> "Snapshot":
        """Raises ValueError for a file that is damaged or belongs to another key."""
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode())
            arrays = {k: z[k] for k in z.files if k != "header"}
        if header.get("format") != CACHE_FORMAT or header.get("key") != key:
            raise ValueError("written for another model or persona")
        if _digest(arrays) != header.get("sha256"):
            raise ValueError("its content does not match its hash")
        rings = {k.removeprefix("ring/"): v for k, v in arrays.items() if k.startswith("ring/")}
        return cls(int(header["forced"]), rings, arrays["last_column"],
                   arrays.get("last_embedding"), arrays["pending"])


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


class PersonaCache:
    """Snapshots by key, in memory (LRU, at most `max_bytes`) and optionally in `directory`."""

    def __init__(self, max_bytes: int = 256 << 20, directory: str | Path | None = None,
                 progress: Callable[[str], None] | None = None):
        self.max_bytes = max_bytes
        self.directory = None if directory is None else Path(directory)
        self.say = progress or (lambda line: None)
        self._items: OrderedDict[str, Snapshot] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def _path(self, key: str) -> Path | None:
        return None if self.directory is None else self.directory / f"persona-{key}.npz"

    @classmethod
    def sized(cls, megabytes: float, directory: str | Path | None = None,
              progress: Callable[[str], None] | None = None) -> "PersonaCache":
        """A cache of at most `megabytes` in memory (the --persona-cache-mb flag and
        pe.load's persona_cache_mb), refused below 0."""
        from personaplex_edge.errors import PersonaPlexError

        if megabytes < 0:
            raise PersonaPlexError("--persona-cache-mb (persona_cache_mb) must be 0 or more")
        return cls(int(megabytes * 2**20), directory, progress)

    def get(self, key: str) -> Snapshot | None:
        with self._lock:
            snap = self._items.get(key)
            if snap is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return snap
        path = self._path(key)
        if path is not None and path.is_file():
            try:
                snap = Snapshot.from_bytes(path.read_bytes(), key)
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
                self.say(f"persona cache: ignoring {path} ({e}); it is rebuilt")
            else:
                self._remember(key, snap)
                self.hits += 1
                return snap
        self.misses += 1
        return None

    def put(self, key: str, snap: Snapshot) -> None:
        self._remember(key, snap)
        path = self._path(key)
        if path is not None:
            try:
                write_bytes_atomic(path, snap.to_bytes(key))
            except OSError as e:
                self.say(f"persona cache: cannot write {path} ({e}); kept in memory only")

    def _remember(self, key: str, snap: Snapshot) -> None:
        if snap.nbytes > self.max_bytes:
            return
        with self._lock:
            if key in self._items:
                self._bytes -= self._items.pop(key).nbytes
            self._items[key] = snap
            self._bytes += snap.nbytes
            while self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.nbytes

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
