"""The persona cache on its own (runtime/persona_cache.PersonaCache): in memory an LRU bounded in
bytes; on disk files keyed by model and persona, checked by hash, a foreign or altered file
ignored with one line and replaced. (That a restore continues exactly as a fresh prefill is
tests/test_conversation.py's.)"""

from __future__ import annotations

import numpy as np

from personaplex_edge.runtime.persona_cache import PersonaCache, Snapshot


def _snapshot(forced: int, seed: int = 0) -> Snapshot:
    rng = np.random.default_rng(seed)
    rings = {f"past_key_values.{i}.{kind}": rng.standard_normal((1, 2, forced, 4)).astype(
        np.float32) for i in range(2) for kind in ("key", "value")}  # [1, H, forced, Dh]
    return Snapshot(forced, rings, rng.integers(0, 9, 17), None, rng.integers(0, 9, 17))


def _same(a: Snapshot, b: Snapshot) -> bool:
    return a.forced == b.forced and all(np.array_equal(a.rings[k], b.rings[k]) for k in a.rings)


def test_memory_is_an_lru_bounded_in_bytes():
    size = _snapshot(10).nbytes  # 4 rings of 2 x 10 x 4 float32
    cache = PersonaCache(max_bytes=3 * size)
    for k in "abc":
        cache.put(k, _snapshot(10, seed=ord(k)))
    assert len(cache) == 3 and cache.nbytes == 3 * size
    assert cache.get("a") is not None  # a is now the most recent: b goes first
    cache.put("d", _snapshot(10, seed=4))
    assert cache.get("b") is None and cache.get("c") is not None
    assert cache.nbytes == 3 * size <= cache.max_bytes
    cache.put("huge", _snapshot(40))  # more than the whole budget: not kept, nothing evicted
    assert cache.get("huge") is None and len(cache) == 3
    assert (cache.hits, cache.misses) == (2, 2)


def test_disk_files_are_checked_and_a_bad_one_is_replaced(tmp_path):
    notes: list[str] = []
    snap = _snapshot(6, seed=1)
    PersonaCache(directory=tmp_path).put("k1", snap)
    fresh = PersonaCache(directory=tmp_path, progress=notes.append)  # a new process
    assert _same(fresh.get("k1"), snap) and not notes

    # a file of another persona under this key's name: refused, not restored
    PersonaCache(directory=tmp_path).put("k2", _snapshot(6, seed=2))
    (tmp_path / "persona-k1.npz").write_bytes((tmp_path / "persona-k2.npz").read_bytes())
    assert PersonaCache(directory=tmp_path, progress=notes.append).get("k1") is None
    assert len(notes) == 1 and "written for another model or persona" in notes[0]

    # the right header over altered numbers: the hash catches it
    with np.load(tmp_path / "persona-k2.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["ring/past_key_values.0.key"] = arrays["ring/past_key_values.0.key"] + 1.0
    with open(tmp_path / "persona-k2.npz", "wb") as f:
        np.savez(f, **arrays)
    cache = PersonaCache(directory=tmp_path, progress=notes.append)
    assert cache.get("k2") is None
    assert len(notes) == 2 and "does not match its hash" in notes[1]

    # what prefills again puts a good file back in its place
    cache.put("k2", snap)
    assert _same(PersonaCache(directory=tmp_path).get("k2"), snap)
    assert not list(tmp_path.glob("*.tmp*")) and len(list(tmp_path.iterdir())) == 2
