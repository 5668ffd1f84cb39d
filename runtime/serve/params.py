"""The query parameters of `/api/chat` -> one conversation's sampling and persona.

PersonaPlex's web client sends `text_prompt`, `voice_prompt`, `text_temperature`, `text_topk`,
`audio_temperature`, `audio_topk`, `text_seed` and `audio_seed` (moshi's sends the sampling ones
too). A missing one takes the server's default; one this server does not know is ignored; a
value that cannot be used is a ParamError naming the parameter, which ends that session only.

A voice prompt from a client is a name, never a path: a voice of the model's bank ("NATF2" or
the reference's "NATF2.pt"), or a file inside the server's explicit `--voice-dir`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from personaplex_edge.runtime.persona import AUDIO_SUFFIXES, Persona
from personaplex_edge.runtime.sampling import SamplingParams

MAX_TEXT_PROMPT_CHARS = 4000  # far above any persona that fits the 7B's context
_SEED_LIMIT = 1 << 32


class ParamError(Exception):
    def __init__(self, name: str, reason: str):
        super().__init__(f"query parameter {name}: {reason}")
        self.name = name
        self.reason = reason


@dataclass(frozen=True)
class Voices:
    """What a client may name as its voice: the model's bank and the files of --voice-dir."""

    bank: tuple[str, ...]
    directory: Path | None = None

    def files(self) -> list[str]:
        if self.directory is None:
            return []
        return sorted(p.name for p in self.directory.iterdir()
                      if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)

    def names(self) -> list[str]:
        return list(self.bank) + self.files()

    def resolve(self, value: str) -> str:
        """A client's voice_prompt -> a bank name or the absolute path of a --voice-dir file."""
        name = value.strip()
        if "/" in name or "\\" in name or name.startswith(".") or "\x00" in name:
            raise ParamError("voice_prompt", f"{value!r} is not a voice name (a name from "
                             "/api/voices, not a path)")
        stem = name[:-3] if name.lower().endswith(".pt") else name
        if stem in self.bank:
            return stem
        folded = [n for n in self.bank if n.lower() == stem.lower()]
        if len(folded) == 1:
            return folded[0]
        if self.directory is not None:
            root = self.directory.resolve()
            for file in self.files():
                if name in (file, Path(file).stem):
                    path = (root / file).resolve()
                    if path.parent == root:  # a link out of the directory is not served
                        return str(path)
        known = ", ".join(self.names()) or "none (this model has no voice bank)"
        raise ParamError("voice_prompt", f"no voice {value!r}; available: {known}")


@dataclass(frozen=True)
class ChatParams:
    sampling: SamplingParams
    persona: Persona
    stats: bool = False  # the client asked for metadata messages with its session's counters


def _float(query: Mapping[str, str], name: str, default: float) -> float:
    if name not in query:
        return default
    try:
        value = float(query[name])
    except ValueError:
        raise ParamError(name, f"{query[name]!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ParamError(name, f"{query[name]} must be a number above 0")
    return value


def _int(query: Mapping[str, str], name: str, default: int | None, low: int,
         high: int) -> int | None:
    if name not in query:
        return default
    try:
        value = int(query[name])
    except ValueError:
        raise ParamError(name, f"{query[name]!r} is not a whole number") from None
    if not low <= value <= high:
        raise ParamError(name, f"{value} is outside {low}..{high}")
    return value


def parse_params(query: Mapping[str, str], sampling: SamplingParams, persona: Persona,
                 voices: Voices, top_k_max: tuple[int, int]) -> ChatParams:
    """The client's query over the server's defaults (checked against the model when the
    server starts). `top_k_max` is (text, audio): the largest top-k the model's graphs were
    exported with."""
    text_k, audio_k = top_k_max
    seeds = [_int(query, name, None, 0, _SEED_LIMIT - 1) for name in ("text_seed", "audio_seed")]
    seed = sampling.seed
    if seeds[0] is not None and seeds[1] is not None:
        # one generator draws both the text and the audio noise: both seeds make its seed
        seed = seeds[0] * _SEED_LIMIT + seeds[1]
    elif seeds[0] is not None or seeds[1] is not None:
        seed = seeds[0] if seeds[0] is not None else seeds[1]
    sampling = replace(
        sampling, seed=seed,
        temp_text=_float(query, "text_temperature", sampling.temp_text),
        temp=_float(query, "audio_temperature", sampling.temp),
        top_k_text=_int(query, "text_topk", sampling.top_k_text, 1, text_k),
        top_k=_int(query, "audio_topk", sampling.top_k, 1, audio_k))
    if "text_prompt" in query:
        prompt = query["text_prompt"]
        if len(prompt) > MAX_TEXT_PROMPT_CHARS:
            raise ParamError("text_prompt", f"{len(prompt)} characters, over the limit of "
                             f"{MAX_TEXT_PROMPT_CHARS}")
        persona = replace(persona, text_prompt=prompt.strip() or None)
    if query.get("voice_prompt", "").strip():
        persona = replace(persona, voice=voices.resolve(query["voice_prompt"]))
    stats = query.get("stats", "") in ("1", "true", "yes")
    return ChatParams(sampling, persona, stats)
