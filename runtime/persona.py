"""Who the model is in a conversation: a text prompt and a voice (a name from the model's voice
bank, or a recording to imitate), turned into the prefill the reference runs, and the key under
which the persona cache (runtime/persona_cache.py) keeps it prefilled.

A persona's prefill is teacher-forced: nothing in it depends on the conversation's seed until
its last column, which is sampled like a live step. So the cache keeps the state after the
forced columns - the first slots of Helium's KV rings (the forced columns touch nothing else:
the codec and the token ring are still as a fresh row has them) - and each
conversation runs the last column itself, with its own noise. Restoring is exact: the rings
hold bit for bit what the forced columns would have written.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from personaplex_edge.errors import PersonaPlexError, VoiceError

from .persona_cache import CACHE_FORMAT
from .prompts import Prefill, build_prefill, prompt_frames, wrap_text_prompt

if TYPE_CHECKING:
    from .model import LoadedModel

DEFAULT_TEXT_PROMPT = ("You are a wise and friendly teacher. Answer questions or provide advice "
                       "in a clear and engaging way.")  # the reference offline tool's default
DEFAULT_VOICE = "NATF2"
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")


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


def bank_voice(model: "LoadedModel", voice: str | None) -> str | None:
    """The bank name a persona's voice stands for (None: no voice prompt)."""
    from personaplex_edge.voices import available_voices, resolve_voice

    if voice is None:  # the reference's usual voice, where the model's bank has it
        return DEFAULT_VOICE if DEFAULT_VOICE in model.voices() else None
    # no bank: available_voices says so, with what to do instead
    names = model.voices() or available_voices(model.model_dir, model.manifest)
    return resolve_voice(voice, names, model.model_dir)


def voice_identity(model: "LoadedModel", persona: Persona) -> str:
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


def build_persona(model: "LoadedModel", persona: Persona) -> Prefill:
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


def persona_key(model: "LoadedModel", persona: Persona) -> str:
    """The persona cache's key: the model's manifest and engines, the text and the voice."""
    # the engines too: a TensorRT model run with --device cpu computes other last bits
    # than its engines, and a restore must continue exactly as its own prefill would
    ident = {"manifest": model.manifest_sha256, "runs_on": model.runs_on,
             "text": persona.text_prompt or "",
             "voice": voice_identity(model, persona), "format": CACHE_FORMAT}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
