"""A whole recording's answer, as `personaplex-edge run` writes it: the recording cut into
frames (the last padded with silence), one model step per frame, the answers joined and cut
back to the recording's length (so the answer is time-aligned with it), and one text record
per frame. With a transcriber, what the user said too: its record of every frame, then of the
silent frames it steps after the recording to write the words still inside its delay (as
moshi's STT inference pads an input; PersonaPlex's answer is not stepped on them).
`Conversation.respond` steps one recording; `batch` steps many side by side."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from personaplex_edge.streams import AGENT_FIRST, TEXT_STREAM, USER_FIRST

from .words.heard import Heard
from .pcm_frames import frame_at, frame_count
from .words.text import TextTokenizer, Transcript


@dataclass
class Response:
    """A whole recording's answer (`Conversation.respond`), as `personaplex-edge run` writes
    it."""

    pcm: np.ndarray  # [T] float32 at 24 kHz: the input's length, time-aligned with it
    text: str  # what the model said
    records: list[str] = field(default_factory=list)  # per frame: the piece, "PAD" or "EPAD"
    # what the user said, heard by the model's transcriber (empty without one): the text, the
    # transcriber's record per frame (as `records`: the recording's frames, then the silent
    # ones it steps after it; `run --user-text-out`), its words
    heard: str = ""
    heard_records: list[str] = field(default_factory=list)
    heard_words: list[Heard] = field(default_factory=list)


class ResponseBuilder:
    """One recording, stepped frame by frame into its Response: `frame(i)` is the model's
    input for step i, `add(i, pcm, token)` takes its answer. With `keep_codes`, the agent's
    codes and text token of each emitted frame are kept too (without a persona the first
    step emits none): what the Mimi decoder alone turns back into the same audio (batch
    --codes)."""

    def __init__(self, signal: np.ndarray, frame_size: int, text: TextTokenizer,
                 keep_codes: bool = False, heard_text: TextTokenizer | None = None):
        self.samples = signal.shape[0]
        self.frame_size = frame_size
        self.frames = frame_count(self.samples, frame_size)
        self._input = np.asarray(signal, np.float32)  # [T]
        self._output = np.empty(self.frames * frame_size, np.float32)  # [frames * frame]
        self._said = Transcript(text, records=True)
        self._emitted: list[np.ndarray] | None = [] if keep_codes else None  # [9] each
        # the transcriber's (None: the model has none)
        self._heard = None if heard_text is None else Transcript(heard_text, records=True)
        self._heard_words: list[Heard] = []

    @property
    def padding(self) -> int:
        """Samples of silence the last frame was padded with."""
        return self.frames * self.frame_size - self.samples

    @property
    def hearing(self) -> bool:
        """Whether the user's words are kept (the model has a transcriber)."""
        return self._heard is not None

    def frame(self, i: int) -> np.ndarray:
        return frame_at(self._input, i, self.frame_size)

    def add(self, i: int, pcm: np.ndarray, token: int | None,
            emitted: np.ndarray | None = None) -> str:
        """Step i's answer; `emitted` is the conversation's last emitted frame [9] (text,
        agent codebooks), needed with keep_codes. Returns the text piece ('' for none)."""
        self._output[i * self.frame_size:(i + 1) * self.frame_size] = pcm
        if self._emitted is not None and token is not None:
            self._emitted.append(emitted.copy())
        return self._said.add(token)

    def hear(self, tokens: list[int | None], events: list[Heard]) -> None:
        """The transcriber's tokens of a step (one) or of the silence after the recording
        (Conversation.flush_heard), and the events they completed (words, turns)."""
        if self._heard is not None:
            for token in tokens:
                self._heard.add(token)
            self._heard_words += [e for e in events if e.kind == "word"]

    def response(self) -> Response:
        heard = self._heard
        return Response(self._output[:self.samples].copy(), self._said.text, self._said.records,
                        "" if heard is None else heard.text,
                        [] if heard is None else heard.records, self._heard_words)

    def codes(self) -> tuple[np.ndarray, np.ndarray]:
        """The emitted frames' agent codes [E, 8] and text tokens [E]."""
        rows = np.array(self._emitted, np.int64).reshape(-1, USER_FIRST)  # [E, 9]
        return rows[:, AGENT_FIRST:USER_FIRST], rows[:, TEXT_STREAM]
