"""The exported model directory: the one contract between export (torch) and runtime (no torch).

A model directory holds `manifest.json` and the files it names. The manifest records the config,
every graph file with its sha256, each graph's inputs and outputs (shape, dtype) and its state
sidecar: every state tensor the runtime must own, with shape, dtype and initial fill value.
State travels as graph input `past.<name>` and comes back as output `present.<name>`.

The runtime calls `load_model_dir` before it runs anything: a missing file, a hash that disagrees,
a manifest of another format version or a state spec that disagrees with the graph's own inputs is
a `ModelDirError` naming the fix, never a crash mid-conversation. Which files were hashed is
remembered in the per-user cache (user_cache.py), never in the model directory, which may be a
hub snapshot or read-only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import __version__
from .atomic import write_text_atomic
from .config import PersonaPlexConfig
from .contract import (CODEC_GRAPHS, KV_INPUT_PREFIX, KV_OUTPUT_PREFIX, MIMI_ENCODER,
                       POSITION, state_input, state_output)
from .errors import ConfigError, ModelDirError
from .transcriber import SUGGESTED_CHECKPOINT, TranscriberConfig
from .user_cache import user_cache_dir

FORMAT = "personaplex-edge-model"
# 2: helium_step takes F frames per call (tokens [B, F, 17]) and configs are in the seed's
# layout; 1 (one frame per call, the earlier config layout) still loads and runs.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"

_CAPABILITIES = {"lm": "language model a conversation needs (export from a checkpoint with "
                       "model.safetensors, without --codec-only)",
                 "codec": "Mimi codec",
                 "transcriber": f"transcriber (export --transcriber {SUGGESTED_CHECKPOINT} "
                                "--out DIR adds one)"}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorSpec":
        return cls(d["name"], tuple(int(s) for s in d["shape"]), d["dtype"])


@dataclass(frozen=True)
class StateSpec:
    """One state tensor a graph reads and returns; the runtime owns its buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    init: float = 0.0  # the buffer is (re)set by filling it with this value

    @property
    def input_name(self) -> str:
        return state_input(self.name)

    @property
    def output_name(self) -> str:
        return state_output(self.name)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "init": self.init}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StateSpec":
        return cls(d["name"], tuple(int(s) for s in d["shape"]), d["dtype"], float(d["init"]))


@dataclass(frozen=True)
class RingSpec:
    """A KV ring the runtime owns: the graph reads all of it (`input_name`, e.g. [B, H, T, Dh])
    and returns only the call's new rows (`output_name`, [B, H, R, Dh]); the runtime then
    writes row r in place at slot (p + r) % T along `axis`, p being the position of the call's
    first row: the value of the graph input or state named by `position` (`past.<state>` for a
    state tensor), read before the call. Nothing is copied but the new rows."""

    input_name: str
    output_name: str
    shape: tuple[int, ...]
    dtype: str
    axis: int = 2
    position: str = POSITION
    rows: int = 1  # rows per call

    @property
    def capacity(self) -> int:
        return self.shape[self.axis]

    @property
    def rows_shape(self) -> tuple[int, ...]:
        return tuple(self.rows if i == self.axis else n for i, n in enumerate(self.shape))

    def write(self, ring, rows, position: int) -> None:
        """ring[..., (position + r) % T, ...] = rows[..., r, ...], in place. Plain slicing on
        both sides: works on numpy arrays and torch tensors alike, with no temporary."""
        target = [slice(None)] * len(self.shape)
        source = [slice(None)] * len(self.shape)
        for r in range(rows.shape[self.axis]):
            target[self.axis] = (position + r) % self.capacity
            source[self.axis] = r
            ring[tuple(target)] = rows[tuple(source)]

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input_name, "output": self.output_name, "shape": list(self.shape),
                "dtype": self.dtype, "axis": self.axis, "position": self.position,
                "rows": self.rows}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RingSpec":
        return cls(d["input"], d["output"], tuple(int(s) for s in d["shape"]), d["dtype"],
                   int(d.get("axis", 2)), d.get("position", POSITION), int(d.get("rows", 1)))


@dataclass
class GraphEntry:
    file: str
    sha256: str
    inputs: list[TensorSpec]  # the non-state inputs
    outputs: list[TensorSpec]  # the non-state outputs
    state: list[StateSpec] = field(default_factory=list)
    data_files: dict[str, str] = field(default_factory=dict)  # external data file -> sha256
    rings: list[RingSpec] = field(default_factory=list)
    # a TensorRT engine built from this graph: file, sha256, TensorRT version, GPU capability
    engine: dict[str, Any] | None = None
    # how its weights are stored: the codec stays fp32; the LM graphs may differ from each
    # other (e.g. an int4 Helium with an int8 depformer)
    precision: str = "fp32"
    # what the export measured of the graph against its torch module, before any precision
    # conversion: {"how": "full" or "one-layer probe", "calls": N, "outputs": {output: the
    # largest absolute difference (float) or the fraction of elements differing (integer)}}
    check: dict[str, Any] | None = None
    # the float type it computes in outside its weights' products (PrecisionPlan.compute);
    # None where a manifest predates it: that precision's default (`compute_dtype`)
    compute: str | None = None

    @property
    def compute_dtype(self) -> str:
        if self.compute is not None:
            return self.compute
        return {"fp32": "float32", "bf16": "bfloat16"}.get(self.precision, "float16")

    @property
    def float16(self) -> bool:
        """Whether running it takes float16 arithmetic (a WebGPU adapter's shader-f16)."""
        return self.compute_dtype == "float16" or any(
            t.dtype == "float16" for t in (*self.inputs, *self.outputs, *self.state,
                                           *self.rings))

    def to_dict(self) -> dict[str, Any]:
        out = {"file": self.file, "sha256": self.sha256,
               "inputs": [t.to_dict() for t in self.inputs],
               "outputs": [t.to_dict() for t in self.outputs],
               "state": [s.to_dict() for s in self.state],
               "rings": [r.to_dict() for r in self.rings],
               "data_files": dict(self.data_files), "precision": self.precision}
        if self.engine is not None:
            out["engine"] = dict(self.engine)
        if self.check is not None:
            out["check"] = dict(self.check)
        if self.compute is not None:
            out["compute"] = self.compute
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any], default_precision: str = "fp32") -> "GraphEntry":
        return cls(d["file"], d["sha256"], [TensorSpec.from_dict(t) for t in d["inputs"]],
                   [TensorSpec.from_dict(t) for t in d["outputs"]],
                   [StateSpec.from_dict(s) for s in d.get("state", [])],
                   dict(d.get("data_files", {})),
                   [RingSpec.from_dict(r) for r in d.get("rings", [])], d.get("engine"),
                   d.get("precision", default_precision), d.get("check"), d.get("compute"))

    def split_rings(self, input_prefix: str = KV_INPUT_PREFIX,
                    output_prefix: str = KV_OUTPUT_PREFIX,
                    position: str = POSITION) -> "GraphEntry":
        """Moves KV ring inputs (`<input_prefix>X`) and their row outputs (`<output_prefix>X`)
        out of inputs/outputs into `rings`."""
        rings, inputs = [], []
        outputs = {t.name: t for t in self.outputs}
        for t in self.inputs:
            if t.name.startswith(input_prefix):
                row = output_prefix + t.name.removeprefix(input_prefix)
                if row not in outputs:
                    raise ValueError(f"{self.file}: ring {t.name} has no output {row}")
                axis = 2
                rings.append(RingSpec(t.name, row, t.shape, t.dtype, axis, position,
                                      outputs[row].shape[axis]))
                outputs.pop(row)
            else:
                inputs.append(t)
        return dataclasses.replace(self, inputs=inputs, outputs=list(outputs.values()),
                                   rings=rings)


@dataclass
class Manifest:
    config: PersonaPlexConfig
    graphs: dict[str, GraphEntry]
    contents: list[str]  # what the directory can do: "codec", "lm"
    precision: str = "fp32"  # the LM's (Helium's); each graph entry has its own
    backend: str = "onnx"
    tokenizer: str | None = None
    voices: str | None = None
    source: str = ""  # checkpoint it was exported from, for the user's information
    files: dict[str, str] = field(default_factory=dict)  # other files (tokenizer, voices) -> sha256
    package_version: str = __version__
    source_revision: str | None = None  # the hub commit of `source`, when it came from the hub
    # the Mimi weights' file the codec graphs were exported from (sha256): a transcriber may
    # share the encode only with the same codec
    codec_sha256: str | None = None
    transcriber: TranscriberConfig | None = None  # Kyutai's STT beside the LM (transcriber.py)

    @property
    def batch(self) -> int:
        """The conversations one graph call steps (every graph's leading dimension; the codec
        is in every export)."""
        return self.graphs[MIMI_ENCODER].inputs[0].shape[0]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION,
                "package_version": self.package_version, "source": self.source,
                "source_revision": self.source_revision,
                "contents": list(self.contents), "precision": self.precision,
                "backend": self.backend, "tokenizer": self.tokenizer, "voices": self.voices,
                "files": dict(self.files), "config": self.config.to_dict(),
                "graphs": {k: g.to_dict() for k, g in self.graphs.items()},
                "codec_sha256": self.codec_sha256,
                "transcriber": None if self.transcriber is None else self.transcriber.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> "Manifest":
        if d.get("format") != FORMAT:
            raise ModelDirError(f"{where} is not a personaplex-edge model manifest "
                                f"(format {d.get('format')!r}); export one with "
                                "'personaplex-edge export'")
        if d.get("format_version") not in READABLE_VERSIONS:
            raise ModelDirError(
                f"{where} was written by personaplex-edge {d.get('package_version', '?')} in "
                f"format version {d.get('format_version')}; this is {__version__}, which reads "
                f"versions {', '.join(map(str, READABLE_VERSIONS))}. Re-export the model with "
                "this version.")
        try:
            return cls(config=PersonaPlexConfig.from_dict(d["config"], where=f"{where} config"),
                       graphs={k: GraphEntry.from_dict(
                           g, "fp32" if k in CODEC_GRAPHS else d["precision"])
                           for k, g in d["graphs"].items()},
                       contents=list(d["contents"]), precision=d["precision"],
                       backend=d["backend"], tokenizer=d.get("tokenizer"),
                       voices=d.get("voices"), source=d.get("source", ""),
                       files=dict(d.get("files", {})),
                       package_version=d.get("package_version", "?"),
                       source_revision=d.get("source_revision"),
                       codec_sha256=d.get("codec_sha256"),
                       transcriber=None if d.get("transcriber") is None else
                       TranscriberConfig.from_dict(d["transcriber"], f"{where} transcriber"))
        except (KeyError, TypeError, ValueError, ConfigError) as e:
            raise ModelDirError(f"{where} is malformed ({e}); re-export the model") from e


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# Hashing this much is worth a line: the 7B in fp16 takes a minute or more on a board's storage.
HASH_REPORT_BYTES = 512 << 20


def stamp_path(manifest_sha256: str) -> Path:
    """Where the hash stamps of a model live: keyed by its manifest's sha256, so a directory
    keeps them when it is renamed (an export's stage becoming the model) and a re-export
    starts afresh."""
    return user_cache_dir("verified", f"{manifest_sha256}.json")


def _stamp_key(st, digest: str) -> list:
    """A file as last hashed: size, mtime and inode (a copy of the directory is another file
    and is hashed in its turn), and the digest it then had."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, digest]


class HashMismatch(ModelDirError):
    """A model file whose bytes disagree with its sha256 in the manifest."""

    def __init__(self, model_dir: Path, rel: str, expected: str, actual: str):
        super().__init__(f"{model_dir}: '{rel}' does not match its sha256 in {MANIFEST} "
                         f"(expected {expected[:12]}..., found {actual[:12]}...): the file was "
                         "changed or corrupted; export the model again")
        self.file = rel


def verify_files(model_dir: Path, expected: dict[str, str], stamps_at: Path,
                  progress: Callable[[str], None] | None = None) -> None:
    """Hashes the files of `expected` not hashed since they last changed, remembering them in
    `stamps_at` (Remembering is best effort: a cache that cannot be written means hashing
    again next time, not an error)."""
    try:
        stamps = json.loads(stamps_at.read_text())
    except (OSError, json.JSONDecodeError):
        stamps = {}
    todo = []  # (rel, digest, stamp key) of the files not verified since they last changed
    for rel, digest in expected.items():
        path = model_dir / rel
        if not path.is_file():
            raise ModelDirError(f"{model_dir}: '{rel}' named in {MANIFEST} is missing; the "
                                "directory is incomplete, export it again")
        key = _stamp_key(path.stat(), digest)
        if stamps.get(rel) != key:
            todo.append((rel, digest, key))
    total = sum(key[0] for _, _, key in todo)
    if progress is not None and total >= HASH_REPORT_BYTES:
        progress(f"checking {total / 1e9:.1f} GB of model files against their sha256 in "
                 f"{MANIFEST} (once: remembered in {stamps_at.parent})")
    for rel, digest, key in todo:
        actual = sha256_file(model_dir / rel)
        if actual != digest:
            raise HashMismatch(model_dir, rel, digest, actual)
        stamps[rel] = key
    if todo:
        try:
            write_text_atomic(stamps_at, json.dumps(stamps))
        except OSError:
            pass


def expected_files(manifest: Manifest, where: str | Path = MANIFEST) -> dict[str, str]:
    """Every file the manifest (read from `where`) names, with its sha256: graphs, their
    weights, engines, the tokenizer and the voice bank. Each must lie inside the directory:
    a manifest may come from a hub repository of anyone's."""
    files: dict[str, str] = dict(manifest.files)
    for g in manifest.graphs.values():
        files[g.file] = g.sha256
        files.update(g.data_files)
        if g.engine:
            files[g.engine["file"]] = g.engine["sha256"]
    outside = sorted(rel for rel in files if Path(rel).is_absolute() or ".." in Path(rel).parts)
    if outside:
        raise ModelDirError(f"{where} names files outside its directory ({', '.join(outside)}); "
                            "it is not a model this runtime exported")
    return files


def manifest_sha256(model_dir: str | Path) -> str:
    """The sha256 of a model directory's manifest.json: the model's identity in the caches."""
    return hashlib.sha256((Path(model_dir) / MANIFEST).read_bytes()).hexdigest()


def read_manifest(path: Path) -> tuple[Manifest, bytes]:
    """The manifest at `path`, and its bytes (whose sha256 is the model's identity)."""
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelDirError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise ModelDirError(f"{path} is not a personaplex-edge model manifest")
    return Manifest.from_dict(data, str(path)), raw


def load_model_dir(model_dir: str | Path, need: str | None = None,
                   progress: Callable[[str], None] | None = None) -> Manifest:
    """Reads and checks a model directory; `need` names a capability it must have. Files are
    hashed the first time (reported through `progress` when that is a long read) and after any
    change of size, mtime or inode."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelDirError(f"model directory {model_dir} does not exist; create one with "
                            "'personaplex-edge export --checkpoint ... --out DIR'")
    path = model_dir / MANIFEST
    if not path.is_file():
        raise ModelDirError(f"{model_dir} has no {MANIFEST}: it is not an exported model (or "
                            "its export did not finish); run 'personaplex-edge export' again")
    manifest, raw = read_manifest(path)
    if need is not None and need not in manifest.contents:
        raise ModelDirError(f"{model_dir} holds only the {' and '.join(manifest.contents)}, "
                            f"not the {_CAPABILITIES.get(need, need)}")
    verify_files(model_dir, expected_files(manifest, path),
                  stamp_path(hashlib.sha256(raw).hexdigest()), progress)
    return manifest


def write_manifest(model_dir: Path, manifest: Manifest) -> None:
    write_text_atomic(model_dir / MANIFEST, json.dumps(manifest.to_dict(), indent=2))
