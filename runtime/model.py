"""A loaded model: what every conversation on it shares, read-only and loaded once - the
manifest, the four graphs' sessions or engines (the weights), the text tokenizer, the voice
bank. The bottom of the runtime's core: it imports no persona, lockstep or conversation.

    persona, persona_cache, lockstep   above it: a persona's prefill, the rows of a batch
    conversation                       above them: one conversation on a row
    api                                on top: what an app holds (`pe.load`, `model.conversation`)

The sessions are shared, and onnxruntime runs one session from several threads at once, so
conversations on one model can be stepped from different threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from personaplex_edge.contract import (DEPFORMER_STEP, HELIUM_STEP, MIMI_DECODER, MIMI_ENCODER,
                                       TOKENS, TRANSCRIBER_STEP)
from personaplex_edge.errors import ModelDirError, PersonaPlexError
from personaplex_edge.manifest import Manifest, load_model_dir, manifest_sha256
from personaplex_edge.streams import initial_tokens

from .backends import describe_device, load_graphs
from .codec import Codec
from .words.text import TextTokenizer

GRAPHS = (MIMI_ENCODER, MIMI_DECODER, HELIUM_STEP, DEPFORMER_STEP)


class LoadedModel:
    def __init__(self, model_dir: str | Path, manifest: Manifest, device: str = "auto",
                 threads: int | None = None, progress: Callable[[str], None] | None = None):
        self.model_dir = Path(model_dir)
        self.manifest = manifest
        self.config = manifest.config
        tokens = next(t for t in manifest.graphs[HELIUM_STEP].inputs if t.name == TOKENS)
        if len(tokens.shape) not in (2, 3):
            raise PersonaPlexError(f"{model_dir}: helium_step takes tokens {list(tokens.shape)}, "
                                   "which this runtime does not run; export the model again")
        # Kyutai's STT beside the LM, where the export added one (runtime/words/transcriber.py)
        self.transcriber = manifest.transcriber
        graphs = GRAPHS + ((TRANSCRIBER_STEP,) if self.transcriber is not None else ())
        self.graphs = load_graphs(model_dir, manifest, graphs, device, threads, progress)
        self.runs_on = sorted({g.runs_on for g in self.graphs.values()})
        self.device = describe_device(self.graphs)
        self._text = TextTokenizer(model_dir, manifest) if manifest.tokenizer else None
        self.heard_text = None if self.transcriber is None else TextTokenizer(
            model_dir, manifest, self.transcriber.tokenizer, self.transcriber.text_padding_id,
            self.transcriber.end_of_padding_id)
        mimi = self.config.mimi_config
        self.frame_size, self.sample_rate = mimi.samples_per_frame, mimi.sample_rate
        self.context = self.config.temporal_config.max_position_embeddings
        self.batch = manifest.batch
        self.initial_tokens = initial_tokens(self.config)  # [17]
        self.manifest_sha256 = manifest_sha256(model_dir)
        self._voices: list[str] | None = None

    @classmethod
    def load(cls, model_dir: str | Path, device: str = "auto", threads: int | None = None,
             progress: Callable[[str], None] | None = None) -> "LoadedModel":
        manifest = load_model_dir(model_dir, need="lm", progress=progress)
        return cls(model_dir, manifest, device, threads, progress)

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

    def close(self) -> None:
        """Lets the sessions go now (device memory on a GPU backend)."""
        for g in self.graphs.values():
            g.close()
