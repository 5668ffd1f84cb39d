"""The seed's two stages, talker -> code2wav: what a conversation emitted, kept as the agent's
Mimi codes and text tokens of each frame (`batch --codes`), and `decode`, which turns them
back into the audio the batch wrote with the Mimi decoder alone.

A codes file (npz): `codes` int64 [E, 8] (the agent's codebooks of each emitted frame),
`text` int64 [E] (its text token), `samples` (the answer's length), `sample_rate`,
`frame_size`. A conversation without a persona emits no frame at its first step (Moshi's
schedule: its answer is silence), one with a persona emits from the first (the persona's last
frame); so the audio is a frame of silence per step without a frame, then the decoded frames,
cut to `samples`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from personaplex_edge.atomic import write_bytes_atomic
from personaplex_edge.errors import PersonaPlexError

from ..codec import Codec
from ..pcm_frames import frame_count

FORMAT = 1


@dataclass
class AgentCodes:
    codes: np.ndarray  # [E, 8] int64
    text: np.ndarray  # [E] int64
    samples: int
    sample_rate: int
    frame_size: int

    def save(self, path: str | Path) -> None:
        buf = io.BytesIO()
        np.savez(buf, format=FORMAT, codes=self.codes, text=self.text, samples=self.samples,
                 sample_rate=self.sample_rate, frame_size=self.frame_size)
        write_bytes_atomic(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> "AgentCodes":
        path = Path(path)
        if not path.is_file():
            raise PersonaPlexError(f"codes file {path} does not exist")
        try:
            with np.load(path, allow_pickle=False) as z:
                if int(z["format"]) != FORMAT:
                    raise ValueError(f"format {int(z['format'])}, not {FORMAT}")
                return cls(z["codes"].astype(np.int64), z["text"].astype(np.int64),
                           int(z["samples"]), int(z["sample_rate"]), int(z["frame_size"]))
        except (OSError, ValueError, KeyError) as e:
            raise PersonaPlexError(f"{path} is not a codes file written by batch --codes "
                                   f"({e})") from None

    def to_audio(self, codec: Codec) -> np.ndarray:
        """The answer's audio [samples] f32, decoded from a fresh decoder state."""
        if (codec.sample_rate, codec.frame_size) != (self.sample_rate, self.frame_size) or \
                self.codes.shape[1:] != (codec.num_codebooks,):
            raise PersonaPlexError(
                f"these codes were written by a model of {self.sample_rate} Hz, "
                f"{self.frame_size}-sample frames and {self.codes.shape[1]} codebooks; this "
                f"model's codec has {codec.sample_rate} Hz, {codec.frame_size} and "
                f"{codec.num_codebooks}: decode with the model that wrote them")
        codec.reset()
        steps = frame_count(self.samples, self.frame_size)
        silence = np.zeros((steps - self.codes.shape[0]) * self.frame_size, np.float32)
        return np.concatenate([silence, codec.decode(self.codes)])[:self.samples]
