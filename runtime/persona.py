"""Starting a conversation from what a user asks for: a text prompt and a voice (a name from the
model's voice bank, or any audio file), or no persona at all."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .session import SamplingParams, Session

DEFAULT_TEXT_PROMPT = ("You are a wise and friendly teacher. Answer questions or provide advice "
                       "in a clear and engaging way.")  # the reference offline tool's default
DEFAULT_VOICE = "NATF2"
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")


@dataclass(frozen=True)
class Persona:
    text_prompt: str | None = DEFAULT_TEXT_PROMPT
    voice: str | None = None  # bank name, audio file, or None: the bank's default if it has one
    enabled: bool = True


def _voice_kwargs(session: Session, voice: str | None) -> dict:
    """The prefill arguments for a voice: stored embeddings for a bank name, Mimi codes of a
    loudness-normalised recording for an audio file."""
    model_dir, manifest = session.model_dir, session.manifest
    if voice is not None and (Path(voice).suffix.lower() in AUDIO_SUFFIXES or Path(voice).exists()):
        from personaplex_edge.audio import read_audio
        from personaplex_edge.loudness import normalize_loudness

        pcm = read_audio(voice, session.codec.sample_rate)
        pcm = normalize_loudness(pcm, session.codec.sample_rate)
        return {"voice_codes": session.encode_voice(pcm)}
    from personaplex_edge.voices import available_voices, load_voice

    if voice is None:  # the reference's usual voice, where the model's bank has it
        if manifest.voices is None:
            return {}
        names = available_voices(model_dir, manifest)
        if DEFAULT_VOICE not in names:
            return {}
        voice = DEFAULT_VOICE
    prompt = load_voice(model_dir, manifest, voice)
    return {"voice_embeddings": prompt.embeddings, "voice_cache": prompt.cache}


def start_session(model_dir: str | Path, persona: Persona = Persona(),
                  sampling: SamplingParams = SamplingParams(), device: str = "auto",
                  threads: int | None = None, progress=print) -> Session:
    session = Session.load(model_dir, sampling, device, threads, progress)
    if persona.enabled:
        t0 = time.perf_counter()
        frames = session.prefill(persona.text_prompt, **_voice_kwargs(session, persona.voice))
        progress(f"persona: {frames} prompt frames in {time.perf_counter() - t0:.2f} s")
    return session
