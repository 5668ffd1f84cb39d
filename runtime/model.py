"""A loaded model: what every conversation on it shares, read-only and loaded once - the
manifest, the four graphs' sessions or engines (the weights), the text tokenizer, the voice bank,
the persona cache - and the lockstep batches its conversations run in.

    model = Model.load("models/personaplex-7b-v1")
    conv = model.open_conversation(SamplingParams(seed=1), Persona(voice="NATF2"))
    conv.prefill()
    pcm_out, token = conv.step(pcm_in)          # per 80 ms frame

Opening a conversation allocates only its state: a row of a lockstep batch (a batch-1 model
opens one batch per conversation; a batch-B model fills B rows of a batch before it opens
another). The sessions are shared, and onnxruntime runs one session from several threads at
once, so conversations on one model can be stepped from different threads.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import numpy as np

from personaplex_edge.contract import (DEPFORMER_STEP, HELIUM_STEP, MIMI_DECODER, MIMI_ENCODER,
                                       TOKENS)
from personaplex_edge.errors import ModelDirError, PersonaPlexError
from personaplex_edge.manifest import Manifest, load_model_dir
from personaplex_edge.streams import initial_tokens

from .backends import load_graphs
from .codec import Codec
from .lockstep import Lockstep
from .persona import Persona, PersonaCache, manifest_digest
from .sampling import SamplingParams
from .text import TextTokenizer

GRAPHS = (MIMI_ENCODER, MIMI_DECODER, HELIUM_STEP, DEPFORMER_STEP)


class Model:
    def __init__(self, model_dir: str | Path, manifest: Manifest, device: str = "auto",
                 threads: int | None = None, progress: Callable[[str], None] | None = None,
                 persona_cache: PersonaCache | None = None):
        self.model_dir = Path(model_dir)
        self.manifest = manifest
        self.config = manifest.config
        self.graphs = load_graphs(model_dir, manifest, GRAPHS, device, threads, progress)
        self.runs_on = sorted({g.runs_on for g in self.graphs.values()})
        self._text = TextTokenizer(model_dir, manifest) if manifest.tokenizer else None
        mimi = self.config.mimi_config
        self.frame_size, self.sample_rate = mimi.samples_per_frame, mimi.sample_rate
        self.context = self.config.temporal_config.max_position_embeddings
        self.batch = manifest.graphs[HELIUM_STEP].inputs[0].shape[0]
        self.initial_tokens = initial_tokens(self.config)  # [17]
        self.manifest_sha256 = manifest_digest(model_dir)
        self.persona_cache = persona_cache if persona_cache is not None else PersonaCache(
            progress=progress)
        self.groups: list[Lockstep] = []
        self._lock = threading.Lock()
        self._voices: list[str] | None = None
        self._closed = False
        tokens = next(t for t in manifest.graphs[HELIUM_STEP].inputs if t.name == TOKENS)
        if len(tokens.shape) not in (2, 3):
            raise PersonaPlexError(f"{model_dir}: helium_step takes tokens {list(tokens.shape)}, "
                                   "which this runtime does not run; export the model again")

    @classmethod
    def load(cls, model_dir: str | Path, device: str = "auto", threads: int | None = None,
             progress: Callable[[str], None] | None = None,
             persona_cache: PersonaCache | None = None) -> "Model":
        manifest = load_model_dir(model_dir, need="lm", progress=progress)
        return cls(model_dir, manifest, device, threads, progress, persona_cache)

    # -- what conversations share ------------------------------------------------------------
    @property
    def text(self) -> TextTokenizer:
        """The text tokenizer; a model directory exported without one is refused here, where
        a front end first needs it (a text prompt, a transcript), with the fix."""
        if self._text is None:
            raise ModelDirError(f"{self.model_dir} has no text tokenizer, which conversations "
                                "need for their prompts and transcripts; export it again from a "
                                "checkpoint that holds tokenizer_spm_32k_3.model")
        return self._text

    def voices(self) -> list[str]:
        """The names of the voice bank (empty without one)."""
        if self._voices is None:
            from personaplex_edge.voices import available_voices

            self._voices = ([] if self.manifest.voices is None
                            else available_voices(self.model_dir, self.manifest))
        return self._voices

    def voice(self, name: str):
        from personaplex_edge.voices import load_voice

        return load_voice(self.model_dir, self.manifest, name)

    def encode_voice(self, pcm: np.ndarray) -> np.ndarray:
        """A voice prompt from audio (24 kHz mono, loudness-normalised) -> the agent codes of
        each frame [V, 8], on a codec of its own (its state comes and goes with it)."""
        codec = Codec(self.manifest, self.graphs[MIMI_ENCODER], self.graphs[MIMI_DECODER])
        try:
            return codec.encode(pcm)
        finally:
            codec.close()

    # -- conversations ---------------------------------------------------------------------------
    def open_conversation(self, sampling: SamplingParams = SamplingParams(),
                          persona: Persona = Persona()) -> "Conversation":
        """A new conversation on a free row (its state only is allocated); call its prefill()
        before its first step."""
        from .conversation import Conversation

        if self._closed:
            raise PersonaPlexError("this model was closed; load it again")
        with self._lock:
            group = next((g for g in self.groups if g.free_row() is not None), None)
            if group is None:
                group = Lockstep(self)
                self.groups.append(group)
            with group.lock:
                conv = Conversation(self, group, sampling, persona)
        return conv

    def release(self, group: Lockstep, row: int) -> None:
        """A conversation left its row. One empty batch is kept for the next conversation (so
        opening one after another allocates nothing); further empty ones let their buffers go."""
        with self._lock:
            with group.lock:
                group.leave(row)
            idle = [g for g in self.groups if g.occupied == 0]
            for extra in idle[1:]:
                self.groups.remove(extra)
                extra.close()

    @property
    def open_conversations(self) -> int:
        return sum(g.occupied for g in self.groups)

    def close(self) -> None:
        """Lets every batch and every session go now (device memory on a GPU backend)."""
        self._closed = True
        with self._lock:
            for group in self.groups:
                group.close()
            self.groups = []
            for g in self.graphs.values():
                g.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
