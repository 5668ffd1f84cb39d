"""What a call's model heard, and what `run --greedy` says to exactly that.

Through WebRTC the model hears the client's audio after Opus, a jitter buffer and a resampler,
which no client can reproduce; so the tests record the frames the tick thread steps
(`ModelInput`, wrapping the server's step function) and run `personaplex-edge run` on them,
written as a float wav (bit for bit the frames). A call's transcript is then the run's text up
to the frame the call was answered to: the prefix rule of `prefix_matches`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

RATE = 24000


class ModelInput:
    """Every frame the server's tick thread steps, per conversation, in order."""

    def __init__(self, srv):
        self.frames: dict[int, list[np.ndarray]] = defaultdict(list)
        ticker = srv.state.ticker
        inner = ticker._step_many

        def step_many(batch):
            for conv, frame in batch.items():
                self.frames[id(conv)].append(np.array(frame, np.float32, copy=True))
            return inner(batch)

        ticker._step_many = step_many
        self._ticker, self._inner = ticker, inner

    def only(self) -> np.ndarray:
        """The frames of the one conversation stepped, joined."""
        assert len(self.frames) == 1, f"{len(self.frames)} conversations were stepped"
        return np.concatenate(next(iter(self.frames.values())))

    def close(self) -> None:
        self._ticker._step_many = self._inner


def run_pieces(model_dir, pcm: np.ndarray, workdir: Path, *flags: str
               ) -> tuple[list[str], np.ndarray]:
    """`personaplex-edge run` on float32 `pcm` (written as a float wav, so it reads back
    exactly): its text piece per frame ('' for padding) and its answer (float32)."""
    import soundfile as sf

    from personaplex_edge.cli import main

    workdir.mkdir(parents=True, exist_ok=True)
    wav, out, text = workdir / "heard.wav", workdir / "out.wav", workdir / "text.json"
    sf.write(str(wav), pcm.astype(np.float32), RATE, subtype="FLOAT")
    assert main(["run", "--model", str(model_dir), "--input", str(wav), "--output", str(out),
                 "--text-out", str(text), *flags]) == 0
    pieces = ["" if r in ("PAD", "EPAD") else r for r in json.loads(text.read_text())]
    return pieces, sf.read(str(out), dtype="float32")[0]


def prefix_matches(transcript: str, pieces: list[str], at_least: int) -> int | None:
    """The number of frames k >= at_least whose pieces, joined, are `transcript` (None: no
    such k). A call's transcript covers the frames answered before it ended, and at least
    those whose audio the client heard."""
    text = "".join(pieces[:at_least])
    for k in range(at_least, len(pieces) + 1):
        if text == transcript:
            return k
        if k < len(pieces):
            text += pieces[k]
    return None


def _speech_band(pcm: np.ndarray) -> np.ndarray:
    """150 Hz .. 7.5 kHz: what a speech codec keeps (Opus takes out DC, the demo model's
    answers carry a large one)."""
    spectrum = np.fft.rfft(pcm.astype(np.float64))
    hz = np.fft.rfftfreq(pcm.shape[0], 1.0 / RATE)
    spectrum[(hz < 150) | (hz > 7500)] = 0
    return np.fft.irfft(spectrum, pcm.shape[0])


def waveform_match(heard: np.ndarray, expected: np.ndarray, window: int = 12000,
                   lags: range = range(-1000, 1500, 1)) -> float:
    """The median, over half-second windows a second apart, of the best correlation of the two
    signals' speech bands within `lags` samples (a window may sit a packet or two off: the
    codec's delay, a silent slot)."""
    a, b = _speech_band(heard), _speech_band(expected)
    scores = []
    for start in range(RATE // 2, min(a.shape[0], b.shape[0]) - window - lags.stop, RATE):
        y = b[start:start + window]
        best = max(float(np.corrcoef(a[start + lag:start + lag + window], y)[0, 1])
                   for lag in lags if start + lag >= 0)
        scores.append(best)
    assert scores, "too little audio to compare"
    return float(np.median(scores))
