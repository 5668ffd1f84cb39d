"""What the user said, as a conversation hears it: the transcriber's text tokens, one per frame,
turned into pieces, timed words and turns.

The transcriber (Kyutai's STT, personaplex_edge/transcriber.py) writes one text token per 80 ms
frame, `audio_delay_seconds` (0.5 s for the 1B) behind the audio: PAD (3) where nothing is
said, EPAD (0) just before a word starts, then the word's SentencePiece pieces in the frames
after it. So, per frame:

    piece        a piece as it is written (a live caption's delta)
    word         a word whose pieces are done (a PAD or EPAD follows them, or a piece that
                 starts the next word): its text, and its start and end in the audio - the
                 frames of its first piece and of the one after its last, less the delay
                 (Kyutai's own timestamps take a word's end from the next EPAD instead, which
                 counts the pause after it)
    turn         the user's turn is over: the words since the last turn, joined. With the
                 semantic-VAD heads: the 2 s head's probability of no voice passes 0.6 (as
                 Kyutai's Unmute decides), then the delay's frames more so that the last words
                 are written too. Without them: no new piece for a second after the last word.

Every event carries the number of its turn (`item`: 1, 2, ...), so a caption, its words and
its end belong together. Times count from the conversation's first live frame (the persona's
prompt frames are not the user's audio).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from personaplex_edge.transcriber import TURN_THRESHOLD

SILENCE_TURN_SECONDS = 1.0  # without VAD heads: a turn ends this long after its last piece


@dataclass(frozen=True)
class Heard:
    """One event of the user's words (module docstring)."""

    kind: str  # "piece", "word" or "turn"
    text: str  # the piece as written (a leading space starts a word), the word, the turn's text
    start: float  # seconds into the conversation's audio (a piece: its frame's time)
    end: float
    frame: int  # the live frame whose step made the event (0 = the first)
    item: int  # the turn it belongs to: 1, 2, ...

    def to_dict(self) -> dict:
        """The event as the wires send it (JSON): its frame as `step`, times in ms precision."""
        return {"event": self.kind, "text": self.text, "item": self.item, "step": self.frame,
                "start": round(self.start, 3), "end": round(self.end, 3)}


class HeardStream:
    """One conversation's tokens -> Heard events (module docstring). `piece(token)` is the
    transcriber tokenizer's text of a token ('' for padding)."""

    def __init__(self, piece: Callable[[int], str], frame_seconds: float, delay_seconds: float,
                 delay_frames: int, vad: bool, padding: tuple[int, ...] = (3, 0),
                 threshold: float = TURN_THRESHOLD):
        self.piece = piece
        self.frame_seconds, self.delay = frame_seconds, delay_seconds
        self.flush_frames = delay_frames + 1  # after the VAD says "over": the last words
        self.vad, self.padding, self.threshold = vad, padding, threshold
        self.silence_frames = round(SILENCE_TURN_SECONDS / frame_seconds)
        self.frame = -1  # the last frame fed
        self.item = 1
        self._pieces: list[str] = []
        self._word_start = 0
        self._words: list[Heard] = []
        self._last_piece = -1
        self._ending: int | None = None  # frames until the turn ends

    def _time(self, frame: int) -> float:
        return max(0.0, frame * self.frame_seconds - self.delay)

    def _finish_word(self, out: list[Heard]) -> None:
        if not self._pieces:
            return
        text = "".join(self._pieces).strip()
        self._pieces = []
        if not text:
            return
        start = self._time(self._word_start)
        word = Heard("word", text, start, max(start, self._time(self.frame)), self.frame,
                     self.item)
        self._words.append(word)
        out.append(word)

    def feed(self, token: int, p_silence: float | None = None) -> list[Heard]:
        """The next frame's token (and, with VAD heads, the turn head's probability of no
        voice) -> the events it completes."""
        self.frame += 1
        out: list[Heard] = []
        text = "" if token in self.padding else self.piece(token)
        if not text:
            self._finish_word(out)
        else:
            if text.startswith(" ") and self._pieces:  # a new word without its EPAD
                self._finish_word(out)
            if not self._pieces:
                self._word_start = self.frame
            self._pieces.append(text)
            self._last_piece = self.frame
            out.append(Heard("piece", text, self._time(self.frame), self._time(self.frame),
                             self.frame, self.item))
        spoken = bool(self._words or self._pieces)
        if self._ending is None and spoken:
            if self.vad:
                if p_silence is not None and p_silence > self.threshold:
                    self._ending = self.flush_frames
            elif not self._pieces and self.frame - self._last_piece >= self.silence_frames:
                self._ending = 0
        if self._ending is not None:
            if self._ending <= 0:
                out += self.end_turn()
            else:
                self._ending -= 1
        return out

    def close_turn(self) -> None:
        """The user's turn is over, as the app knows it (its own voice detector, a button): it
        ends once the delay's frames are written, as a VAD-detected end does."""
        if self._ending is None and (self._words or self._pieces):
            self._ending = self.flush_frames

    def end_turn(self) -> list[Heard]:
        """Ends the turn now (its last word with it): the "turn" event, or nothing when no
        word was heard since the last."""
        out: list[Heard] = []
        self._finish_word(out)
        self._ending = None
        if self._words:
            first, last = self._words[0], self._words[-1]
            out.append(Heard("turn", " ".join(w.text for w in self._words), first.start,
                             last.end, self.frame, self.item))
            self._words = []
            self.item += 1
        return out
