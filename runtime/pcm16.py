"""Raw PCM16 (little-endian, mono, at the model's rate) -> the model's float32 frames, for the
front ends whose peers send bare samples in pieces of any size (`stdio`, OpenAI Realtime's
base64 audio): the pieces are joined and cut into whole frames, and what does not fill one (an
odd byte included) waits for the next piece."""

from __future__ import annotations

import numpy as np

from personaplex_edge.audio import to_pcm16

PCM16_SCALE = 32768.0  # int16 -> [-1, 1)


class Pcm16Framer:
    """Bytes of PCM16 in, whole float32 frames [frame_size] out."""

    def __init__(self, frame_size: int):
        self.frame_size = frame_size
        self._pending = bytearray()  # at most one frame's bytes (and an odd byte) wait here

    def push(self, data: bytes) -> list[np.ndarray]:
        """The frames `data` completes (each a new float32 array), in order."""
        self._pending += data
        frame_bytes = 2 * self.frame_size
        whole = len(self._pending) // frame_bytes
        if whole == 0:
            return []
        samples = np.frombuffer(bytes(self._pending[:whole * frame_bytes]), "<i2")
        del self._pending[:whole * frame_bytes]
        return list((samples.astype(np.float32) / PCM16_SCALE).reshape(whole, -1))  # [n, frame]

    def flush(self) -> np.ndarray | None:
        """The samples still waiting as one last frame padded with silence (None if none); an
        odd trailing byte is half a sample and is let go."""
        samples = len(self._pending) // 2
        frame = np.zeros(self.frame_size, np.float32)
        frame[:samples] = np.frombuffer(bytes(self._pending[:2 * samples]), "<i2") / PCM16_SCALE
        self._pending.clear()
        return frame if samples else None

    @property
    def pending_samples(self) -> int:
        return len(self._pending) // 2


def pcm16_bytes(pcm: np.ndarray) -> bytes:
    """float32 samples -> PCM16 LE bytes, the samples a wav of them holds."""
    return to_pcm16(pcm).astype("<i2", copy=False).tobytes()
