"""Where the TensorRT engine of each graph comes from on this GPU: the model directory's own, or
the per-user cache's.

An engine only runs with the library and version that built it, on the GPU model it was built
on (mainline TensorRT) or the compute capabilities it was built for (TensorRT for RTX:
trt_engine.py), so a model downloaded from the hub, or exported on another machine, may have
none that fits; and the model directory is read-only to the runtime. Engines built on first use
(trt_build.py) therefore go to

    <user cache>/engines/<manifest sha256>/<GPU name>-<memory>GiB-sm<cc>-<library><version>/
        <graph>.engine, ...      written whole or not at all (a temporary, then one rename)
        engines.json             {graph: EngineSpec}, written after its engine, atomically

keyed by exactly what decides whether an engine runs: the model (its manifest's hash), the GPU
(name, memory, compute capability) and the library ("trt" or "rtx", and its version). Another
GPU or library gets a directory of its own; a re-exported model (another manifest) too. The
model directory's own engine wins where it runs on this GPU.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path

from personaplex_edge.atomic import write_text_atomic
from personaplex_edge.contract import EngineSpec
from personaplex_edge.errors import ModelDirError
from personaplex_edge.manifest import GraphEntry, Manifest
from personaplex_edge.manifest import manifest_sha256, verify_files
from personaplex_edge.user_cache import user_cache_dir

from .trt_engine import check_compatible
from .trt_library import MAINLINE, RTX

RECORDS = "engines.json"
_STAMPS = "verified.json"


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


def engine_cache_dir(model_dir: str | Path, target: Target) -> Path:
    """The cache directory of `model_dir`'s engines for `target` (module docstring)."""
    gpu = re.sub(r"[^A-Za-z0-9.]+", "-", target.device_name).strip("-") or "gpu"
    library = "rtx" if target.library == RTX else "trt"
    return user_cache_dir(
        "engines", manifest_sha256(model_dir),
        f"{gpu}-{round(target.device_memory / 2**30)}GiB-"
        f"sm{target.compute_capability.replace('.', '')}-{library}{target.tensorrt_version}")


def read_records(directory: Path) -> dict[str, dict]:
    try:
        records = json.loads((directory / RECORDS).read_text())
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def add_record(directory: Path, graph: str, spec: EngineSpec) -> None:
    """Records a built engine (its file already in place) in the directory's engines.json."""
    records = read_records(directory)
    records[graph] = spec.to_dict()
    write_text_atomic(directory / RECORDS, json.dumps(records, indent=2))


def locate(model_dir: str | Path, manifest: Manifest, names: list[str],
           target: Target) -> tuple[dict[str, Located], list[str]]:
    """The engines of `names` that run on `target` - the model directory's own first, then the
    cache's (their files checked against their sha256, once: stamped) - and the graphs that
    have none."""
    model_dir = Path(model_dir)
    cache = engine_cache_dir(model_dir, target)
    records = read_records(cache)
    found: dict[str, Located] = {}
    missing: list[str] = []
    for name in names:
        entry = manifest.graphs[name]
        own = EngineSpec.from_dict(entry.engine) if entry.engine else None
        if own is not None and target.runs(own, model_dir):
            found[name] = Located(model_dir, entry)
            continue
        spec = _spec(records.get(name))
        if spec is not None and target.runs(spec, model_dir) and _intact(cache, spec):
            found[name] = Located(cache, dataclasses.replace(entry, engine=spec.to_dict()))
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
