"""Audio -> the model's float32 frames.

A whole signal: frame i is samples [i * 1920, (i + 1) * 1920), the last one padded with
silence (`frame_count`, `frame_at`) - as `run`, `respond`, `batch`, `stream` and the codec cut
a recording. Raw PCM in pieces (`PcmFrames`), for the front ends whose peers send bare samples
in pieces of any size: `stdio` (PCM16) and OpenAI Realtime's base64 appends (PCM16, or
vllm-omni's float32); the pieces are joined and cut into whole frames, and a partial sample
(an odd byte of PCM16) and a partial frame wait for the next piece."""

from __future__ import annotations

import numpy as np

PCM16 = "pcm16"  # 16-bit little-endian integers
F32 = "pcm_f32le"  # 32-bit little-endian floats (vllm-omni's PersonaPlex input)
SAMPLE_BYTES = {PCM16: 2, F32: 4}
PCM16_SCALE = 32768.0  # as soundfile reads a PCM16 wav: int / 32768


def frame_count(samples: int, frame_size: int) -> int:
    """Frames of a signal of `samples` (the last partial one counts)."""
    return -(-samples // frame_size)


def frame_at(signal: np.ndarray, i: int, frame_size: int) -> np.ndarray:
    """Frame i of a signal [T]: a view, or a padded copy for the last partial frame."""
    frame = signal[i * frame_size:(i + 1) * frame_size]
    if frame.shape[0] == frame_size:
        return frame
    padded = np.zeros(frame_size, np.float32)
    padded[:frame.shape[0]] = frame
    return padded


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
