"""Where the TensorRT engine of each graph comes from on this GPU: the model directory's own, or
the per-user cache's.

An engine only runs with the library and version that built it, on the GPU model it was built
on (mainline TensorRT) or the compute capabilities it was built for (TensorRT for RTX:
trt_engine.py), so a model downloaded from the hub, or exported on another machine, may have
none that fits; and the model directory is read-only to the runtime. Engines built on first use
(trt_build.py) therefore go to

    <user cache>/engines/<GPU name>-<memory>GiB-sm<cc>-<trt|rtx><version>/
        <graph>-<key>.engine    written whole or not at all (a temporary, then one rename)
        <graph>-<key>.json      its EngineSpec and the model directories that use it, written
                                after its engine, atomically

keyed by exactly what decides an engine: per graph (`graph_key`), the graph itself (the sha256
of its file and of its weights' files), its precision and the longest call its frames axis is
built for; per directory, the GPU (name, memory, compute capability) and the library and its
version. So a model whose manifest changes elsewhere - a transcriber added, a voice bank
replaced - keeps the engines of its unchanged graphs, and two models sharing a graph share its
engine. The model directory's own engine wins where it runs on this GPU.

An engine is kept while a model directory uses it (its record lists them; a model that finds it
is added). After each build into the cache, `prune` removes the engines no model uses any more,
and says which: their model directory is gone, its graph changed (re-exported), or it has a
newer build of the same graph for this GPU and library (another TensorRT version); and the
directories of the layout before this one (<user cache>/engines/<manifest sha256>/: every
graph's engine keyed by the whole manifest), which nothing reads. A record lost to two processes
writing it at once costs a rebuild, never a wrong engine: a file is used only where its record's
sha256 holds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from personaplex_edge.atomic import write_text_atomic
from personaplex_edge.contract import EngineSpec
from personaplex_edge.errors import ModelDirError
from personaplex_edge.manifest import MANIFEST, GraphEntry, Manifest, read_manifest, verify_files
from personaplex_edge.user_cache import user_cache_dir

from .trt_engine import check_compatible
from .trt_library import MAINLINE, RTX

_STAMPS = "verified.json"
_OLD_LAYOUT = re.compile(r"[0-9a-f]{64}")  # <user cache>/engines/<manifest sha256>/


@dataclass(frozen=True)
class Located:
    """A graph's engine: the directory its file is in, and the graph's entry recording it."""

    directory: Path
    entry: GraphEntry


@dataclass(frozen=True)
class Target:
    """What an engine is built by and for: this library (mainline TensorRT or TensorRT for RTX)
    on this GPU."""

    tensorrt_version: str
    compute_capability: str
    device_name: str
    device_memory: int
    library: str = MAINLINE

    def runs(self, spec: EngineSpec, model_dir: Path) -> bool:
        try:
            check_compatible(spec, self.tensorrt_version, self.compute_capability,
                             self.device_name, model_dir, device_memory=self.device_memory,
                             library=self.library)
        except ModelDirError:
            return False
        return True

    @property
    def gpu(self) -> str:
        """The directory name's part before the version: this GPU and library."""
        name = re.sub(r"[^A-Za-z0-9.]+", "-", self.device_name).strip("-") or "gpu"
        return (f"{name}-{round(self.device_memory / 2**30)}GiB-"
                f"sm{self.compute_capability.replace('.', '')}-"
                f"{'rtx' if self.library == RTX else 'trt'}")


def engines_root() -> Path:
    return user_cache_dir("engines")


def engine_cache_dir(target: Target) -> Path:
    """The cache directory of the engines built by and for `target` (module docstring)."""
    return engines_root() / f"{target.gpu}{target.tensorrt_version}"


def max_frames(manifest: Manifest) -> int:
    """The longest call of a graph with a frames axis (helium_step), what its optimization
    profile is built for: a persona prefill runs up to context - 1 frames."""
    return manifest.config.temporal_config.max_position_embeddings - 1


def graph_key(manifest: Manifest, name: str) -> str:
    """What an engine of graph `name` is built from, as a short hash (module docstring)."""
    g = manifest.graphs[name]
    what = {"graph": g.sha256, "weights": sorted(g.data_files.values()),
            "precision": g.precision, "max_frames": max_frames(manifest)}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def cached_engine(target: Target, manifest: Manifest, name: str) -> Path:
    """Where the cache keeps the engine of graph `name` built by and for `target`."""
    return engine_cache_dir(target) / f"{name}-{graph_key(manifest, name)}.engine"


def _user(model_dir: str | Path) -> str:
    return str(Path(model_dir).resolve())


def _read(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write(path: Path, record: dict) -> None:
    """Best effort: a record that cannot be written means a rebuild next time."""
    try:
        write_text_atomic(path, json.dumps(record, indent=2))
    except OSError:
        pass


def add_engine(engine: Path, graph: str, spec: EngineSpec, model_dir: str | Path) -> None:
    """Records an engine just built into the cache (its file already in place) as used by
    `model_dir`."""
    _write(engine.with_suffix(".json"), {"graph": graph, "engine": spec.to_dict(),
                                         "used_by": [_user(model_dir)], "built": time.time()})


def locate(model_dir: str | Path, manifest: Manifest, names: list[str],
           target: Target) -> tuple[dict[str, Located], list[str]]:
    """The engines of `names` that run on `target` - the model directory's own first, then the
    cache's (their files checked against their sha256, once: stamped; the model added to their
    users) - and the graphs that have none."""
    model_dir = Path(model_dir)
    found: dict[str, Located] = {}
    missing: list[str] = []
    for name in names:
        entry = manifest.graphs[name]
        own = EngineSpec.from_dict(entry.engine) if entry.engine else None
        if own is not None and target.runs(own, model_dir):
            found[name] = Located(model_dir, entry)
            continue
        path = cached_engine(target, manifest, name)
        record = _read(path.with_suffix(".json"))
        spec = _spec(record.get("engine"))
        if spec is not None and target.runs(spec, model_dir) and _intact(path.parent, spec):
            found[name] = Located(path.parent, dataclasses.replace(entry, engine=spec.to_dict()))
            users = record.get("used_by") or []
            if _user(model_dir) not in users:
                _write(path.with_suffix(".json"), {**record, "used_by": [*users,
                                                                          _user(model_dir)]})
        else:
            missing.append(name)
    return found, missing


def _spec(record) -> EngineSpec | None:
    try:
        return EngineSpec.from_dict(record)
    except (KeyError, TypeError, ValueError):  # none, or a record an older version wrote
        return None


def _intact(cache: Path, spec: EngineSpec) -> bool:
    """The cached engine file is there with its recorded sha256 (else it is built again: the
    cache is ours to repair)."""
    try:
        verify_files(cache, {spec.file: spec.sha256}, cache / _STAMPS)
    except ModelDirError:
        return False
    return True


# ---- pruning ------------------------------------------------------------------------------------

class _Users:
    """Whether a model directory still uses an engine: its manifest read once per prune."""

    def __init__(self):
        self._manifests: dict[str, Manifest | None] = {}

    def manifest(self, user: str) -> Manifest | None:
        if user not in self._manifests:
            try:
                self._manifests[user] = read_manifest(Path(user) / MANIFEST)[0]
            except Exception:  # noqa: BLE001 - gone, or anything but a model now: unused
                self._manifests[user] = None
        return self._manifests[user]

    def why_not(self, user: str, graph: str, key: str) -> str | None:
        """Why `user` no longer uses the engine of `graph` built from `key`; None: it does."""
        manifest = self.manifest(user)
        if manifest is None:
            return f"{user} is gone"
        if graph not in manifest.graphs or graph_key(manifest, graph) != key:
            return f"{graph} of {user} changed"
        return None


def prune(progress: Callable[[str], None] | None = print) -> list[str]:
    """Removes what no model uses from the engine cache (module docstring); says it through
    `progress` and returns one line per engine or directory removed."""
    root = engines_root()
    if not root.is_dir():
        return []
    removed: list[str] = []
    freed = 0
    for directory in sorted(p for p in root.iterdir() if p.is_dir()):
        if _OLD_LAYOUT.fullmatch(directory.name):
            size = _size(directory)
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(f"{directory.name[:12]}... ({size / 1e6:.0f} MB): the layout before "
                           "this version (engines keyed by the whole manifest)")
            freed += size
    users = _Users()
    records = [(p, _read(p)) for p in sorted(root.glob("*/*.json")) if p.name != _STAMPS]
    newest = _newest(records)
    emptied: set[Path] = set()  # the directories engines were removed from
    for path, record in records:
        graph, spec = record.get("graph"), _spec(record.get("engine"))
        key = path.stem[len(graph) + 1:] if isinstance(graph, str) else ""
        if spec is None or not path.stem.startswith(f"{graph}-"):
            continue  # not ours to judge (another version's record): left alone
        kept, why = [], []
        for user in record.get("used_by") or []:
            reason = users.why_not(user, graph, key)
            if reason is None and newest.get((_gpu_of(path.parent), graph, key, user),
                                             path) != path:
                reason = f"a newer build of {graph} of {user} for this GPU"
            (why if reason else kept).append(reason or user)
        if kept:
            if len(kept) < len(record.get("used_by") or []):
                _write(path, {**record, "used_by": kept})
            continue
        engine = path.parent / spec.file
        size = engine.stat().st_size if engine.is_file() else 0
        engine.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        _forget_runtime_cache(spec)
        removed.append(f"{path.parent.name}/{spec.file} ({size / 1e6:.0f} MB): "
                       + ("; ".join(why) or "no model uses it"))
        freed += size
        emptied.add(path.parent)
    for directory in emptied:  # (never one another process has just made for its build)
        if not any(p.name != _STAMPS for p in directory.iterdir()):
            shutil.rmtree(directory, ignore_errors=True)  # left with its stamps alone
        else:
            _tidy_stamps(directory)
    if removed and progress is not None:
        progress(f"removed from the engine cache {root} ({freed / 1e6:.0f} MB):\n  "
                 + "\n  ".join(removed))
    return removed


def _newest(records: list[tuple[Path, dict]]) -> dict[tuple, Path]:
    """(GPU and library, graph, key, user) -> the record of the latest build among the
    library's versions."""
    newest: dict[tuple, tuple[float, Path]] = {}
    for path, record in records:
        graph = record.get("graph")
        if not isinstance(graph, str):
            continue
        gpu = _gpu_of(path.parent)
        key = path.stem[len(graph) + 1:]
        for user in record.get("used_by") or []:
            built = float(record.get("built") or 0)
            at = (gpu, graph, key, user)
            if at not in newest or built > newest[at][0]:
                newest[at] = (built, path)
    return {at: path for at, (_, path) in newest.items()}


def _tidy_stamps(directory: Path) -> None:
    """The hash stamps of the files still there (verify_files keeps one per file it hashed)."""
    stamps = _read(directory / _STAMPS)
    kept = {name: stamp for name, stamp in stamps.items() if (directory / name).is_file()}
    if len(kept) < len(stamps):
        _write(directory / _STAMPS, kept)


def _gpu_of(directory: Path) -> str:
    """A cache directory's GPU and library (Target.gpu): its name less the version."""
    m = re.match(r"(.*-(?:trt|rtx))", directory.name)
    return m.group(1) if m else directory.name


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _forget_runtime_cache(spec: EngineSpec) -> None:
    """TensorRT for RTX's runtime cache of a removed engine (trt_library.RuntimeCache: named
    by the engine's sha256) goes with it."""
    if spec.library == RTX:
        for path in user_cache_dir("tensorrt-rtx").glob(f"{spec.sha256[:32]}-*.cache"):
            path.unlink(missing_ok=True)
