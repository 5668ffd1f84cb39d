"""What a batch run answers: its items, found in one of three layouts, and the part of them a
shard takes.

    a Full-Duplex-Bench tree   sample folders holding `input.wav` (v1.5: `clean_input.wav`
                               too): each `*input.wav` is answered by `*output.wav` beside it,
                               or at the same relative path under --output
    a folder of audio files    each file (any rate) -> <output>/<relative path>.wav and the
                               per-frame text JSON beside it (`run --text-out`'s); on a
                               model with a transcriber, the user's words too (.user.json,
                               `run --user-text-out`'s)
    a JSONL manifest           one item a line: `input`, and optionally `output`,
                               `text_prompt`, `voice_prompt`, `seed`; relative paths are
                               the manifest's folder's

Items are sorted by their key (the input's path relative to the tree, folder or manifest), so
`--shard K/N` takes the same items on every machine: every N-th from the K-th.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from personaplex_edge.errors import PersonaPlexError

from ..persona import AUDIO_SUFFIXES

FDB_INPUT = "input.wav"  # Full-Duplex-Bench's name for a sample's input (v1.5: clean_input.wav)
FDB_OUTPUT = "output.wav"
MANIFEST_KEYS = frozenset({"input", "output", "text_prompt", "voice_prompt", "seed"})
_UNSET = object()


@dataclass(frozen=True)
class Item:
    key: str  # the input's path relative to the tree, folder or manifest: sorts and shards
    input: Path
    output: Path  # the answer: 24 kHz mono PCM16, the input's length, time-aligned
    text: Path | None  # the per-frame text JSON (None in a Full-Duplex-Bench tree)
    text_prompt: object = _UNSET  # str | None where the manifest gives one; else the flags'
    voice: object = _UNSET
    seed: object = _UNSET

    @property
    def codes(self) -> Path:
        """Where --codes keeps the agent's codes and text tokens (beside the answer)."""
        return self.output.with_name(self.output.stem + ".codes.npz")

    @property
    def user_text(self) -> Path | None:
        """Where a model with a transcriber writes what the user said, a record per frame
        (beside the text JSON; None where there is none)."""
        return None if self.text is None else self.text.with_name(self.text.stem + ".user.json")

    def outputs(self, with_codes: bool, with_user_text: bool = False) -> list[Path]:
        return [p for p in (self.codes if with_codes else None, self.text,
                            self.user_text if with_user_text else None, self.output) if p]

    def finished(self, with_codes: bool, with_user_text: bool = False) -> bool:
        """Every output there: written atomically, the answer last, by a run that finished
        the item."""
        return all(p.is_file() for p in self.outputs(with_codes, with_user_text))

    def own(self, name: str, default):
        """The item's own persona or seed field where the manifest gives one, else `default`."""
        value = getattr(self, name)
        return default if value is _UNSET else value


@dataclass(frozen=True)
class Layout:
    kind: str  # "full-duplex-bench", "folder" or "manifest"
    items: list[Item]
    summary_dir: Path  # where batch-summary.json goes


def find_items(source: str | Path, output: str | Path | None = None) -> Layout:
    """The items of a tree, folder or manifest (module docstring), sorted by key."""
    source = Path(source)
    out = None if output is None else Path(output)
    if source.is_file() and source.suffix == ".jsonl":
        layout = _manifest(source, out)
    elif source.is_dir():
        layout = _fdb_tree(source, out) if _is_fdb_tree(source) else _folder(source, out)
    elif source.exists():
        raise PersonaPlexError(f"--input {source}: give a folder (a Full-Duplex-Bench tree or "
                               "audio files) or a .jsonl manifest")
    else:
        raise PersonaPlexError(f"--input {source} does not exist")
    if not layout.items:
        raise PersonaPlexError(f"no inputs found in {source} (a Full-Duplex-Bench tree holds "
                               "*/input.wav; a folder, audio files; a manifest, one JSON object "
                               "a line)")
    outputs: dict[Path, str] = {}
    for item in layout.items:
        other = outputs.setdefault(item.output.resolve(), item.key)
        if other != item.key:
            raise PersonaPlexError(f"{other} and {item.key} would both be answered in "
                                   f"{item.output}; rename one of them")
    return layout


def _is_fdb_tree(root: Path) -> bool:
    return any(p.is_file() for p in root.rglob(FDB_INPUT))


def _fdb_tree(root: Path, out: Path | None) -> Layout:
    items = []
    for path in sorted(root.rglob(f"*{FDB_INPUT}")):
        if not path.is_file():
            continue
        rel = path.relative_to(root)
        answer = rel.with_name(rel.name[:-len(FDB_INPUT)] + FDB_OUTPUT)
        items.append(Item(rel.as_posix(), path, (out or root) / answer, None))
    return Layout("full-duplex-bench", items, out or root)


def _folder(root: Path, out: Path | None) -> Layout:
    if out is None:
        raise PersonaPlexError(f"--input {root} is a folder of audio files: give --output DIR "
                               "for the answers (the same relative paths, as .wav, with the "
                               "text as .json)")
    inside = out.resolve()
    items = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix.lower() not in AUDIO_SUFFIXES:
            continue
        if inside in path.resolve().parents:
            continue  # earlier answers under an --output inside the input folder
        rel = path.relative_to(root)
        items.append(Item(rel.as_posix(), path, out / rel.with_suffix(".wav"),
                          out / rel.with_suffix(".json")))
    return Layout("folder", items, out)


def _manifest(path: Path, out: Path | None) -> Layout:
    base = path.parent
    items = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            raise PersonaPlexError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("input"), str):
            raise PersonaPlexError(f"{where}: each line is an object with an \"input\" path")
        unknown = sorted(set(entry) - MANIFEST_KEYS)
        if unknown:
            raise PersonaPlexError(f"{where}: unknown field(s) {', '.join(unknown)}; an item "
                                   f"has {', '.join(sorted(MANIFEST_KEYS))}")
        source = base / entry["input"]
        key = Path(entry["input"]).as_posix()
        if any(item.key == key for item in items):
            key = f"{key}@{number}"  # the same recording again (another persona): by its line
        if "output" in entry:
            answer = base / entry["output"]
        elif out is not None:
            answer = out / Path(entry["input"]).with_suffix(".wav")
        else:
            raise PersonaPlexError(f"{where}: no \"output\" for {key}: give one per item, or "
                                   "--output DIR")
        seed = entry.get("seed", _UNSET)
        if seed is not _UNSET and seed is not None and not isinstance(seed, int):
            raise PersonaPlexError(f"{where}: \"seed\" must be an integer")
        items.append(Item(key, source, answer, answer.with_suffix(".json"),
                          entry.get("text_prompt", _UNSET), entry.get("voice_prompt", _UNSET),
                          seed))
    items.sort(key=lambda item: item.key)
    return Layout("manifest", items, out or base)


def parse_shard(spec: str | None) -> tuple[int, int]:
    """'K/N' -> (K, N), 1 <= K <= N; None -> (1, 1)."""
    if spec is None:
        return 1, 1
    try:
        k, n = (int(part) for part in spec.split("/"))
    except ValueError:
        raise PersonaPlexError(f"--shard {spec}: write it K/N, e.g. 2/8 (the second of 8 "
                               "shards)") from None
    if not 1 <= k <= n:
        raise PersonaPlexError(f"--shard {spec}: K must be 1..N")
    return k, n


def shard(items: list[Item], k: int, n: int) -> list[Item]:
    """The K-th of N shards: every N-th item of the sorted items, from the K-th."""
    return items[k - 1::n]
