"""Is there a voice in this 80 ms frame? Silero's voice activity detector (a 2 MB recurrent
network, MIT) through onnxruntime: the choice for a room with music in it, which webrtcvad
takes for speech (benchmarks/bench_vad.py).

The model ships inside the `silero-vad` wheel (pure Python, any platform), whose own code
imports torch; only its data file is read here, so it installs without its dependencies:

    pip install --no-deps silero-vad

It judges 32 ms chunks at 16 kHz (512 samples, each with the previous chunk's last 64 samples
as context) and carries a recurrent state [2, 1, 128] from chunk to chunk. A 24 kHz frame
becomes 1280 samples at 16 kHz (a 2/3 polyphase filter whose history carries across frames),
which is 2.5 chunks: the samples left over wait for the next frame, so a frame completes two
or three chunks. A frame has a voice when any chunk it completes scores at least `threshold`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from personaplex_edge.errors import PersonaPlexError

SILERO_RATE = 16000
CHUNK = 512  # samples a call judges, at 16 kHz
CONTEXT = 64  # samples of the previous chunk each call sees first
STATE_SHAPE = (2, 1, 128)
TAPS = 48  # per output phase of the 24 -> 16 kHz filter (96 in all, at 48 kHz)


def silero_model_path(path: str | Path | None = None) -> Path:
    """`path`, else silero_vad.onnx from the installed silero-vad package (found without
    importing it: its __init__ imports torch)."""
    if path:
        p = Path(path).expanduser()
        if not p.is_file():
            raise PersonaPlexError(f"idle.silero_model: {p} does not exist")
        return p
    spec = importlib.util.find_spec("silero_vad")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            p = Path(root) / "data" / "silero_vad.onnx"
            if p.is_file():
                return p
    raise PersonaPlexError("idle.vad = \"silero\" needs silero's model: pip install --no-deps "
                           "silero-vad (only its ONNX file is read; torch is not needed), or "
                           "set idle.silero_model to a silero_vad.onnx")


class ThirdsDown:
    """24 kHz -> 16 kHz, frame by frame: up by 2, a low-pass at 7.2 kHz, down by 3, as two
    polyphase filters over the input (an even output sample reads input 3q back, an odd one
    3q + 1 back). The last TAPS input samples carry to the next frame."""

    def __init__(self, frame_size: int):
        if frame_size % 3:
            raise PersonaPlexError(f"a frame of {frame_size} samples does not go to 16 kHz "
                                   "in whole samples")
        n = 2 * TAPS
        k = np.arange(n) - (n - 1) / 2
        cutoff = 7200 / 48000  # cycles per 48 kHz sample: below 8 kHz, the new Nyquist
        h = 2 * cutoff * np.sinc(2 * cutoff * k) * np.kaiser(n, 8.0)
        h *= 2 / h.sum()  # the zeros stuffed in halve the level: a gain of 2 restores it
        # phase p of output 2q + p reads input (3q + p) - i with tap h[2i + p]; reversed, so
        # that a window (oldest sample first) meets its taps in order
        self._taps = np.ascontiguousarray(np.stack([h[0::2], h[1::2]])[:, ::-1],
                                          np.float32)  # [2, TAPS]
        self._x = np.zeros(TAPS + frame_size, np.float32)  # [history + frame]
        self._windows = np.lib.stride_tricks.sliding_window_view(self._x, TAPS)  # a view
        # window w covers buffer w .. w + TAPS - 1; output 2q + p ends at input 3q + p of the
        # frame, buffer TAPS + 3q + p: window 3q + p + 1 (a strided view, nothing copied)
        count = frame_size // 3
        self._rows = [self._windows[p + 1:p + 1 + 3 * count:3] for p in (0, 1)]
        self.out = np.zeros(2 * frame_size // 3, np.float32)  # [frame at 16 kHz]
        self._even = self.out[0::2]
        self._odd = self.out[1::2]

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        """frame [frame_size] at 24 kHz -> `out` [2/3 of it] at 16 kHz (valid until the next
        call)."""
        x = self._x
        x[:TAPS] = x[-TAPS:]
        x[TAPS:] = frame
        np.matmul(self._rows[0], self._taps[0], out=self._even)
        np.matmul(self._rows[1], self._taps[1], out=self._odd)
        return self.out


class SileroDetector:
    """`speech(frame)`: frame [frame_size] f32 at 24 kHz -> whether a voice is in it; the
    interface of vad.VoiceDetector. `last_voiced`: chunks of the newest frame at or over the
    threshold."""

    def __init__(self, threshold: float = 0.5, model: str | Path | None = None,
                 rate: int = 24000, frame_size: int = 1920):
        import onnxruntime as ort

        if rate != 24000:
            raise PersonaPlexError(f"silero's detector here takes 24 kHz frames, not {rate} Hz")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # a small recurrent net: one thread is fastest
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(silero_model_path(model)), options,
                                             providers=["CPUExecutionProvider"])
        self.threshold = threshold
        self._down = ThirdsDown(frame_size)
        per_frame = 2 * frame_size // 3
        # 16 kHz samples not yet judged: at most a chunk's worth wait between frames
        self._pending = np.zeros(CHUNK + per_frame, np.float32)
        self._count = 0
        self._input = np.zeros((1, CONTEXT + CHUNK), np.float32)  # [1, context + chunk]
        self._feeds = {"input": self._input, "state": np.zeros(STATE_SHAPE, np.float32),
                       "sr": np.array(SILERO_RATE, np.int64)}
        self.last_voiced = 0
        self.last_score = 0.0  # the newest chunk's probability of speech

    def voiced_blocks(self, frame: np.ndarray) -> int:
        """How many chunks completed by `frame` score a voice."""
        pcm = self._down(frame)
        self._pending[self._count:self._count + pcm.shape[0]] = pcm
        self._count += pcm.shape[0]
        voiced, start = 0, 0
        while self._count - start >= CHUNK:
            self._input[0, :CONTEXT] = self._input[0, -CONTEXT:]
            self._input[0, CONTEXT:] = self._pending[start:start + CHUNK]
            score, state = self._session.run(None, self._feeds)
            self._feeds["state"] = state
            self.last_score = float(score.reshape(-1)[0])
            voiced += self.last_score >= self.threshold
            start += CHUNK
        left = self._count - start
        self._pending[:left] = self._pending[start:self._count]
        self._count = left
        self.last_voiced = voiced
        return voiced

    def speech(self, frame: np.ndarray) -> bool:
        return self.voiced_blocks(frame) >= 1
