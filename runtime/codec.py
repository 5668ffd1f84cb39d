"""The Mimi codec of a model directory: encoder and decoder graphs, one 80 ms frame per call."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from personaplex_edge.errors import AudioError
from personaplex_edge.manifest import Manifest, load_model_dir

from .backends import open_graph


class Codec:
    """Streaming Mimi. `encode_frame` and `decode_frame` carry their own state from call to
    call; `reset()` starts a new stream."""

    def __init__(self, model_dir: str | Path, manifest: Manifest, device: str = "auto",
                 threads: int | None = None):
        self.manifest = manifest
        self.frame_size = manifest.config.mimi_config.samples_per_frame
        self.sample_rate = manifest.config.mimi_config.sample_rate
        self.num_codebooks = manifest.config.mimi_config.num_codebooks
        self.encoder = open_graph(model_dir, manifest, "mimi_encoder", device, threads)
        self.decoder = open_graph(model_dir, manifest, "mimi_decoder", device, threads)
        self._pcm_in = self.encoder.inputs["pcm"]  # [B, 1, frame]
        self._codes_in = self.decoder.inputs["codes"]  # [B, n]

    @classmethod
    def load(cls, model_dir: str | Path, device: str = "auto", threads: int | None = None,
             progress: Callable[[str], None] | None = None) -> "Codec":
        manifest = load_model_dir(model_dir, need="codec", progress=progress)
        return cls(model_dir, manifest, device, threads)

    def reset(self) -> None:
        self.encoder.reset()
        self.decoder.reset()

    def close(self) -> None:
        self.encoder.close()
        self.decoder.close()

    def encode_frame(self, pcm: np.ndarray) -> np.ndarray:
        """pcm: one frame, [frame] or [B, 1, frame] float32 -> codes [B, n] int64 (a view,
        valid until the next call)."""
        if pcm.size != self._pcm_in.size:
            raise AudioError(f"a frame is {self.frame_size} samples at {self.sample_rate} Hz, "
                             f"got {pcm.size}")
        np.copyto(self._pcm_in, pcm.reshape(self._pcm_in.shape))
        return self.encoder.run()["codes"]

    def decode_frame(self, codes: np.ndarray) -> np.ndarray:
        """codes [B, n] (or [n]) int64 -> pcm [B, 1, frame] float32 (a view, valid until the
        next call)."""
        np.copyto(self._codes_in, np.asarray(codes).reshape(self._codes_in.shape))
        return self.decoder.run()["pcm"]

    def encode(self, pcm: np.ndarray) -> np.ndarray:
        """A whole signal [T] -> codes [frames, n]; the last frame is padded with silence."""
        frames = -(-pcm.shape[0] // self.frame_size)
        padded = np.zeros(frames * self.frame_size, np.float32)
        padded[:pcm.shape[0]] = pcm
        codes = np.empty((frames, self.num_codebooks), np.int64)
        for i in range(frames):
            codes[i] = self.encode_frame(padded[i * self.frame_size:(i + 1) * self.frame_size])[0]
        return codes

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes [frames, n] -> pcm [frames * frame_size]."""
        out = np.empty(codes.shape[0] * self.frame_size, np.float32)
        for i in range(codes.shape[0]):
            out[i * self.frame_size:(i + 1) * self.frame_size] = self.decode_frame(codes[i])[0, 0]
        return out
