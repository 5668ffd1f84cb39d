"""Who the model is in a conversation: a text prompt and a voice (a name from the model's voice
bank, or a recording to imitate), turned into the prefill the reference runs, and a cache of
prefilled personas so a second conversation with the same persona starts at once.

A persona's prefill is teacher-forced: nothing in it depends on the conversation's seed until
its last column, which is sampled like a live step. So the cache keeps the state after the
forced columns - the first slots of Helium's KV rings (the forced columns touch nothing else:
the codec and the token ring are still as a fresh row has them) - and each
conversation runs the last column itself, with its own noise. Restoring is exact: the rings
hold bit for bit what the forced columns would have written.

The cache lives in memory (an LRU bounded in bytes) and optionally on disk: one file per
persona, written atomically, named by a key over the model's manifest and the persona, and
checked by hash on load (a damaged or foreign file is ignored with one line, and rebuilt).
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
from typing import TYPE_CHECKING, Callable

import numpy as np

from personaplex_edge.atomic import write_bytes_atomic
from personaplex_edge.errors import PersonaPlexError, VoiceError
from personaplex_edge.manifest import MANIFEST

from .prompts import Prefill, build_prefill, prompt_frames, wrap_text_prompt

if TYPE_CHECKING:
    from .model import Model

DEFAULT_TEXT_PROMPT = ("You are a wise and friendly teacher. Answer questions or provide advice "
                       "in a clear and engaging way.")  # the reference offline tool's default
DEFAULT_VOICE = "NATF2"
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
CACHE_FORMAT = 1


@dataclass(frozen=True)
class Persona:
    text_prompt: str | None = DEFAULT_TEXT_PROMPT
    voice: str | None = None  # bank name, audio file, or None: the bank's default if it has one
    enabled: bool = True


def is_voice_file(voice: str | None) -> bool:
    """A recording (an audio file name, or a path to a file) rather than a bank name: a bare
    name is the bank's even where a file of that name sits in the working directory."""
    return voice is not None and (Path(voice).suffix.lower() in AUDIO_SUFFIXES
                                  or (Path(voice).name != voice and Path(voice).is_file()))


def bank_voice(model: "Model", voice: str | None) -> str | None:
    """The bank name a persona's voice stands for (None: no voice prompt)."""
    from personaplex_edge.voices import available_voices, resolve_voice

    if voice is None:  # the reference's usual voice, where the model's bank has it
        return DEFAULT_VOICE if DEFAULT_VOICE in model.voices() else None
    # no bank: available_voices says so, with what to do instead
    names = model.voices() or available_voices(model.model_dir, model.manifest)
    return resolve_voice(voice, names, model.model_dir)


def voice_identity(model: "Model", persona: Persona) -> str:
    """What the voice of a persona is, for the cache key: a bank name, or a recording's hash."""
    if not persona.enabled:
        return "none"
    if is_voice_file(persona.voice):
        try:
            data = Path(persona.voice).read_bytes()
        except OSError as e:
            raise VoiceError(f"cannot read the voice prompt {persona.voice}: {e}") from None
        return "file:" + hashlib.sha256(data).hexdigest()
    return "bank:" + str(bank_voice(model, persona.voice))


def build_persona(model: "Model", persona: Persona) -> Prefill:
    """The persona's prefill columns, in the reference's order (see runtime/prompts.py): voice
    prompt (stored embeddings for a bank voice, or the Mimi codes of a loudness-normalised
    recording), silence, the text prompt, silence."""
    voice_codes = voice_embeddings = voice_cache = None
    if is_voice_file(persona.voice):
        from personaplex_edge.audio import read_audio
        from personaplex_edge.loudness import normalize_loudness

        pcm = normalize_loudness(read_audio(persona.voice, model.sample_rate), model.sample_rate)
        voice_codes = model.encode_voice(pcm)
    else:
        name = bank_voice(model, persona.voice)
        if name is not None:
            prompt = model.voice(name)
            voice_embeddings, voice_cache = prompt.embeddings, prompt.cache
    tokens = model.text.encode(wrap_text_prompt(persona.text_prompt)) \
        if persona.text_prompt else []
    frames = prompt_frames(tokens, voice_codes)
    plan = build_prefill(model.initial_tokens, frames, voice_embeddings, voice_cache)
    if len(plan) + 1 > model.context:
        raise PersonaPlexError(
            f"the persona prompts take {len(plan)} frames, more than this model's context of "
            f"{model.context} frames ({model.context / 12.5:.0f} s); shorten the text or voice "
            "prompt")
    return plan


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

    @staticmethod
    def key(model: "Model", persona: Persona) -> str:
        # the engines too: a TensorRT model run with --device cpu computes other last bits
        # than its engines, and a restore must continue exactly as its own prefill would
        ident = {"manifest": model.manifest_sha256, "runs_on": model.runs_on,
                 "text": persona.text_prompt or "",
                 "voice": voice_identity(model, persona), "format": CACHE_FORMAT}
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]

    def _path(self, key: str) -> Path | None:
        return None if self.directory is None else self.directory / f"persona-{key}.npz"

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


def manifest_digest(model_dir: str | Path) -> str:
    return hashlib.sha256((Path(model_dir) / MANIFEST).read_bytes()).hexdigest()
