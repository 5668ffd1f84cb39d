"""The Mimi codec of a model directory on its own: encoder and decoder graphs, one 80 ms frame
per call, for the `codec` command and for encoding a voice prompt from a recording. (A
conversation runs the same graphs inside its lockstep batch, runtime/lockstep.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from personaplex_edge.contract import CODES, MIMI_DECODER, MIMI_ENCODER, PCM
from personaplex_edge.errors import AudioError
from personaplex_edge.manifest import Manifest, load_model_dir

from .backends import LoadedGraph, load_graphs
from .pcm_frames import frame_at, frame_count


class Codec:
    """Streaming Mimi over batch row 0 of the graphs. `encode_frame` and `decode_frame` carry
    their own state from call to call; `reset()` starts a new stream."""

    def __init__(self, manifest: Manifest, encoder: LoadedGraph, decoder: LoadedGraph):
        mimi = manifest.config.mimi_config
        self.manifest = manifest
        self.frame_size = mimi.samples_per_frame
        self.sample_rate = mimi.sample_rate
        self.num_codebooks = mimi.num_codebooks
        self.encoder = encoder.bind()
        self.decoder = decoder.bind()
        self._pcm_in = self.encoder.inputs[PCM]  # [B, 1, frame]
        self._codes_in = self.decoder.inputs[CODES]  # [B, n]

    @classmethod
    def load(cls, model_dir: str | Path, device: str = "auto", threads: int | None = None,
             progress: Callable[[str], None] | None = None) -> "Codec":
        manifest = load_model_dir(model_dir, need="codec", progress=progress)
        graphs = load_graphs(model_dir, manifest, (MIMI_ENCODER, MIMI_DECODER), device, threads,
                             progress)
        return cls(manifest, graphs[MIMI_ENCODER], graphs[MIMI_DECODER])

    def reset(self) -> None:
        self.encoder.reset()
        self.decoder.reset()

    def close(self) -> None:
        self.encoder.close()
        self.decoder.close()

    def encode_frame(self, pcm: np.ndarray) -> np.ndarray:
        """pcm: one frame, [frame] float32 -> codes [n] int64 (a view, valid until the next
        call)."""
        if pcm.size != self.frame_size:
            raise AudioError(f"a frame is {self.frame_size} samples at {self.sample_rate} Hz, "
                             f"got {pcm.size}")
        self._pcm_in[0, 0] = pcm.reshape(-1)
        # a model with a transcriber encodes its codebooks too: the first n are the codec's
        return self.encoder.run()[CODES][0, :self.num_codebooks]

    def decode_frame(self, codes: np.ndarray) -> np.ndarray:
        """codes [n] int64 -> pcm [frame] float32 (a view, valid until the next call)."""
        self._codes_in[0] = np.asarray(codes).reshape(-1)
        return self.decoder.run()[PCM][0, 0]

    def encode(self, pcm: np.ndarray) -> np.ndarray:
        """A whole signal [T] -> codes [frames, n]; the last frame is padded with silence."""
        frames = frame_count(pcm.shape[0], self.frame_size)
        codes = np.empty((frames, self.num_codebooks), np.int64)
        for i in range(frames):
            codes[i] = self.encode_frame(frame_at(pcm, i, self.frame_size))
        return codes

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes [frames, n] -> pcm [frames * frame_size]."""
        out = np.empty(codes.shape[0] * self.frame_size, np.float32)
        for i in range(codes.shape[0]):
            out[i * self.frame_size:(i + 1) * self.frame_size] = self.decode_frame(codes[i])
        return out
