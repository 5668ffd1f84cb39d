"""Is there a voice in this 80 ms frame? WebRTC's voice activity detector, torch-free, on the CPU
(the default), or silero's (silero.py: better against music, a model file to install);
`voice_detector` makes the one the config names.

webrtcvad (the `webrtcvad-wheels` package: wheels for x86-64 and aarch64, no model file) judges
10/20/30 ms blocks at 8/16/32/48 kHz. A 24 kHz frame is doubled to 48 kHz by repeating each
sample - the images this makes lie above 20 kHz, and the detector's own decimation to 8 kHz
removes them - which gives exactly four 20 ms blocks per frame and no state to carry between
frames. A frame has a voice when at least `voiced_subframes` of its four blocks do.
Measured on speech, silence, music and the model's own echo: benchmarks/bench_vad.py.
"""

from __future__ import annotations

import numpy as np

from personaplex_edge.errors import PersonaPlexError

VAD_RATE = 48000
BLOCK_MS = 20


def _webrtcvad():
    try:
        import webrtcvad
    except ImportError:
        raise PersonaPlexError("the assistant's voice detector needs webrtcvad: pip install "
                               "'personaplex-edge[assistant]'") from None
    return webrtcvad


class VoiceDetector:
    """`speech(frame)`: frame [frame_size] f32 at `rate` -> whether a voice is in it.
    Nothing is allocated per frame."""

    def __init__(self, aggressiveness: int = 3, voiced_subframes: int = 2, rate: int = 24000,
                 frame_size: int = 1920):
        if VAD_RATE % rate:
            raise PersonaPlexError(f"the voice detector takes {VAD_RATE} Hz divided by a whole "
                                   f"number, not {rate} Hz")
        self._vad = _webrtcvad().Vad(aggressiveness)
        self._up = VAD_RATE // rate
        self._pcm = np.zeros(frame_size * self._up, np.int16)  # [frame at 48 kHz]
        self._wide = self._pcm.reshape(frame_size, self._up)  # [frame, up]: a view
        self._block = VAD_RATE * BLOCK_MS // 1000
        if self._pcm.shape[0] % self._block:
            raise PersonaPlexError(f"a frame of {frame_size} samples is no whole number of "
                                   f"{BLOCK_MS} ms blocks")
        self._scaled = np.zeros(frame_size, np.float32)
        self._view = memoryview(self._pcm).cast("B")
        self.voiced_subframes = voiced_subframes
        self.last_voiced = 0  # voiced blocks of the newest frame

    def voiced_blocks(self, frame: np.ndarray) -> int:
        """How many 20 ms blocks of `frame` hold a voice."""
        scaled = np.clip(frame, -1.0, 32767 / 32768, out=self._scaled)
        scaled *= 32768.0
        self._wide[:] = scaled[:, None]  # each sample twice: 48 kHz
        step = 2 * self._block  # bytes per block
        voiced = 0
        for start in range(0, self._view.nbytes, step):
            voiced += self._vad.is_speech(self._view[start:start + step], VAD_RATE)
        self.last_voiced = voiced
        return voiced

    def speech(self, frame: np.ndarray) -> bool:
        return self.voiced_blocks(frame) >= self.voiced_subframes


ENGINES = ("webrtc", "silero")


def voice_detector(engine: str = "webrtc", aggressiveness: int = 3, voiced_subframes: int = 2,
                   threshold: float = 0.5, silero_model: str | None = None, rate: int = 24000,
                   frame_size: int = 1920):
    """The detector the assistant's idle.* keys name: webrtc (aggressiveness, voiced
    subframes) or silero (threshold, model file); each has `speech(frame) -> bool`."""
    if engine == "silero":
        from .silero import SileroDetector

        return SileroDetector(threshold, silero_model, rate, frame_size)
    if engine != "webrtc":
        raise PersonaPlexError(f"unknown voice detector {engine!r}; use {' or '.join(ENGINES)}")
    return VoiceDetector(aggressiveness, voiced_subframes, rate, frame_size)
