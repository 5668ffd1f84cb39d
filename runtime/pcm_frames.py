"""Raw PCM (mono, at the model's rate) -> the model's float32 frames, for the front ends whose
peers send bare samples in pieces of any size: `stdio` (PCM16) and OpenAI Realtime's base64
appends (PCM16, or vllm-omni's float32). The pieces are joined and cut into whole frames; a
partial sample (an odd byte of PCM16) and a partial frame wait for the next piece."""

from __future__ import annotations

import numpy as np

PCM16 = "pcm16"  # 16-bit little-endian integers
F32 = "pcm_f32le"  # 32-bit little-endian floats (vllm-omni's PersonaPlex input)
SAMPLE_BYTES = {PCM16: 2, F32: 4}
PCM16_SCALE = 32768.0  # as soundfile reads a PCM16 wav: int / 32768


class PcmFrames:
    def __init__(self, frame_size: int):
        self.frame_size = frame_size
        self._bytes = b""  # the start of a sample
        self._samples = np.zeros(0, np.float32)  # the start of a frame

    def reset(self) -> None:
        self._bytes, self._samples = b"", np.zeros(0, np.float32)

    def feed(self, data: bytes, fmt: str = PCM16) -> tuple[list[np.ndarray], int]:
        """-> (the whole frames completed, each a new [frame_size] array; the samples `data`
        held)."""
        width = SAMPLE_BYTES[fmt]
        data = self._bytes + data
        whole = len(data) // width * width
        self._bytes = data[whole:]
        if fmt == PCM16:
            new = np.frombuffer(data[:whole], "<i2").astype(np.float32) / PCM16_SCALE
        else:
            new = np.frombuffer(data[:whole], "<f4").astype(np.float32)
            # not a sample the model can take (NaN, inf): silence, as a microphone never sends
            new = np.nan_to_num(np.clip(new, -1.0, 1.0), nan=0.0)
        pcm = np.concatenate([self._samples, new]) if self._samples.size else new
        n = pcm.shape[0] // self.frame_size
        frames = [pcm[i * self.frame_size:(i + 1) * self.frame_size].copy() for i in range(n)]
        self._samples = pcm[n * self.frame_size:].copy()
        return frames, new.shape[0]

    def flush(self) -> np.ndarray | None:
        """The samples still waiting, as one last frame padded with silence (None if none);
        a partial sample is let go."""
        waiting = self._samples
        self.reset()
        if not waiting.size:
            return None
        frame = np.zeros(self.frame_size, np.float32)
        frame[:waiting.shape[0]] = waiting
        return frame

    @property
    def pending_samples(self) -> int:
        return int(self._samples.shape[0])
