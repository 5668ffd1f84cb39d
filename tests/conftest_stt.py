"""Shared, built-once material for the transcriber's tests: a small PersonaPlex checkpoint whose
Mimi (moshi's, randomised, 32 trained codebooks) is also the codec of a small Kyutai STT
checkpoint in stt-1b-en_fr's layout (tests/moshi_stt_reference.py); an input that Mimi encodes
clear of codebook ties; moshi's own transcription of it; and the model directory exported with
the transcriber.

Not a pytest conftest: test modules import it. Builders are cached per process.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import numpy as np  # noqa: E402

from personaplex_edge.config import PRESETS, PersonaPlexConfig  # noqa: E402

FRAMES = 60  # input frames: past the transcriber's context (24) and Mimi's ring (8 frames)
CONTEXT = 24


@dataclass
class SttBundle:
    cfg: PersonaPlexConfig  # the PersonaPlex side (tiny, Mimi with 32 codebooks trained)
    checkpoint: Path  # PersonaPlex's checkpoint directory
    stt_checkpoint: Path  # Kyutai's layout
    stt_config: dict  # its config.json
    pcm: np.ndarray  # [FRAMES * 1920] float32: the user
    reference: dict  # moshi_stt_reference.reference_transcribe on pcm
    workdir: Path


def stt_tiny_config() -> PersonaPlexConfig:
    d = json.loads(json.dumps(PRESETS["tiny"]))
    d["mimi_config"]["num_quantizers"] = 32
    return PersonaPlexConfig.from_dict(d)


SPOKEN = 44  # frames of speech-like sound; then silence, where the VAD ends the turn


def _speech_like(seed: int) -> np.ndarray:
    """Noise under a syllable-rate envelope with short pauses, then silence: something for the
    codes to follow and a turn that ends. PCM16 values, so that a wav written of it reads back
    the same samples."""
    from personaplex_edge.audio import to_pcm16

    rng = np.random.default_rng(seed)
    n = FRAMES * 1920
    t = np.arange(n) / 24000
    envelope = np.clip(np.sin(2 * np.pi * 3.1 * t), 0, None) * (np.sin(2 * np.pi * 0.9 * t) > -0.6)
    envelope[SPOKEN * 1920:] = 0.0
    pcm = (rng.standard_normal(n) * 0.3 * envelope).astype(np.float32)
    return to_pcm16(pcm).astype(np.float32) / 32768


@functools.lru_cache(maxsize=None)
def stt_bundle() -> SttBundle:
    from moshi_reference import reference_mimi, save_published
    from moshi_stt_reference import (clear_input, reference_stt, reference_transcribe,
                                     sparse_codebooks, stt_config, teach_silence,
                                     write_stt_checkpoint)

    from personaplex_edge.export.hub import MIMI_FILE
    from personaplex_edge.export.synthetic import train_tokenizer, write_synthetic_checkpoint

    cfg = stt_tiny_config()
    workdir = Path(tempfile.mkdtemp(prefix="stt_tests_"))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    ckpt = write_synthetic_checkpoint(cfg, workdir / "personaplex")
    mimi = sparse_codebooks(reference_mimi(cfg.mimi_config, seed=3))
    save_published(mimi, ckpt / MIMI_FILE)
    tokenizer = train_tokenizer(workdir / "stt.model", vocab_size=200)
    import sentencepiece as spm

    vocab = spm.SentencePieceProcessor(model_file=str(tokenizer)).get_piece_size()
    config = stt_config(vocab, context=CONTEXT)
    model = reference_stt(config, seed=5)
    mimi.set_num_codebooks(32)
    teach_silence(model, mimi, _speech_like(100), SPOKEN)
    stt = write_stt_checkpoint(workdir / "stt", config, model, ckpt / MIMI_FILE, tokenizer,
                               cfg.mimi_config)
    pcm, ref = clear_input(lambda x: reference_transcribe(stt, x), _speech_like)
    return SttBundle(cfg, ckpt, stt, config, pcm, ref, workdir)


@functools.lru_cache(maxsize=None)
def stt_model_dir() -> Path:
    """The PersonaPlex checkpoint exported with the transcriber (float32)."""
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.transcriber import resolve_transcriber

    b = stt_bundle()
    out = b.workdir / "model_stt"
    export_model(resolve_checkpoint(str(b.checkpoint)), out,
                 transcriber=resolve_transcriber(str(b.stt_checkpoint), progress=lambda s: None),
                 progress=lambda s: None)
    return out


@functools.lru_cache(maxsize=None)
def plain_model_dir() -> Path:
    """The same PersonaPlex checkpoint exported without a transcriber."""
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model

    b = stt_bundle()
    out = b.workdir / "model_plain"
    export_model(resolve_checkpoint(str(b.checkpoint)), out, progress=lambda s: None)
    return out


@functools.lru_cache(maxsize=None)
def builtin_demo_dir() -> Path:
    """The built-in demo model as `--model demo` makes it on first use (into the test run's
    per-user cache, tests/conftest.py): with its transcriber of random weights. (Tests that
    need no transcriber, or a model without one, take conftest.py's demo_model_dir: its
    PersonaPlex alone.)"""
    from personaplex_edge.model_ref import resolve_model

    return resolve_model("demo", progress=lambda s: None)


def heard_of(pcm: np.ndarray, flush: bool = False, end_turn_at: int | None = None) -> list:
    """The Python API's heard events (greedy, no persona) on exactly these frames (float32,
    24 kHz): what a server's transcription must equal for the frames its model stepped
    (tests/call_tap.py records them; a real-time client's audio may arrive late under load,
    and the server's clock then steps silence). `flush`: the input ends there (flush_heard,
    as stdio does at its end); `end_turn_at`: end_turn() before that frame is stepped."""
    import personaplex_edge as pe

    model = pe.load(stt_model_dir(), device="cpu")
    try:
        with model.conversation(persona=False, greedy=True) as conv:
            for i, at in enumerate(range(0, pcm.shape[0] - 1919, 1920)):
                if i == end_turn_at:
                    conv.end_turn()
                conv.step(pcm[at:at + 1920])
            if flush:
                conv.flush_heard()
            return conv.heard_events()
    finally:
        model.close()


def serve_options(model_dir: Path):
    """`serve` on a small model: no persona (its context is short), every frame kept."""
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.serve import ServeOptions

    return ServeOptions(model_dir, port=0, persona=Persona(enabled=False),
                        max_backlog=100_000, max_ahead_s=None)
