"""What the user said, as a conversation hears it: the transcriber's text tokens, one per frame,
turned into pieces, timed words and turns.

The transcriber (Kyutai's STT, personaplex_edge/transcriber.py) writes one text token per 80 ms
frame, `audio_delay_seconds` (0.5 s for the 1B) behind the audio: PAD where nothing is said,
EPAD just before a word starts, then the word's SentencePiece pieces in the frames after it.
Kyutai's own timestamping reads everything between two EPADs as one word, PADs included, and
so does this: a PAD between two pieces does not split their word. So, per frame:

    piece        what a piece adds to the turn's text (a live caption's delta): the piece
                 itself, a space before it where it starts a word but the turn's first, so
                 that a turn's pieces joined are its text
    word         a word whose pieces are done - the next EPAD, a piece that starts the next
                 word (its leading space: an EPAD the model left out) or the turn's end says
                 so: its text, and its start and end in the audio - the frames of its first
                 piece and of the one after its last, less the delay (Kyutai's own timestamps
                 take a word's end from the next EPAD instead, which counts the pause after it)
    turn         the user's turn is over: its words, joined. It ends once the delay's frames
                 have passed since the 2 s VAD head's probability of no voice passed 0.6 (as
                 Kyutai's Unmute decides), or since the app said so (`close_turn`: the text of
                 the audio before it is written by then); without VAD heads, a second after the
                 last piece. Never inside a word: a turn due while a word's pieces are still
                 coming ends after its last.

Every event carries the number of its turn (`item`: 1, 2, ...), so a caption, its words and
its end belong together. Times count from the conversation's first live frame (the persona's
prompt frames are not the user's audio).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from personaplex_edge.transcriber import TURN_THRESHOLD

SILENCE_TURN_SECONDS = 1.0  # without VAD heads: a turn ends this long after its last piece


class Pieces(Protocol):
    """What a stream needs of the transcriber's tokenizer (runtime/words/text.py TextTokenizer)."""

    epad: int  # "a word starts next frame"

    def piece(self, token: int) -> str: ...  # '' for padding


@dataclass(frozen=True)
class Heard:
    """One event of the user's words (module docstring)."""

    kind: str  # "piece", "word" or "turn"
    text: str  # what the piece adds to the turn's text, the word, the turn's text
    start: float  # seconds into the conversation's audio (a piece: its frame's time)
    end: float
    frame: int  # the live frame whose step made the event (0 = the first)
    item: int  # the turn it belongs to: 1, 2, ...

    def to_dict(self) -> dict:
        """The event as the wires send it (JSON): its frame as `step`, times in ms precision."""
        return {"event": self.kind, "text": self.text, "item": self.item, "step": self.frame,
                "start": round(self.start, 3), "end": round(self.end, 3)}


class HeardStream:
    """One conversation's tokens -> Heard events (module docstring). `text` is the
    transcriber's tokenizer: a token's piece, and which token is EPAD."""

    def __init__(self, text: Pieces, frame_seconds: float, delay_seconds: float,
                 delay_frames: int, vad: bool, threshold: float = TURN_THRESHOLD):
        self.text = text
        self.frame_seconds, self.delay = frame_seconds, delay_seconds
        self.flush_frames = delay_frames + 1  # after "the turn is over": its last words
        self.vad, self.threshold = vad, threshold
        self.silence_frames = round(SILENCE_TURN_SECONDS / frame_seconds)
        self.frame = -1  # the last frame fed
        self.item = 1
        self._pieces: list[str] = []  # the open word's
        self._word_start = self._last_piece = -1  # frames
        self._words: list[Heard] = []  # the turn's, done
        self._end_at: int | None = None  # the frame from which the turn may end
        self._holding = False  # the turn is due, but a word's pieces are still coming

    def _time(self, frame: int) -> float:
        return max(0.0, frame * self.frame_seconds - self.delay)

    def _finish_word(self, out: list[Heard]) -> None:
        text = "".join(self._pieces).strip()
        self._pieces = []
        if not text:
            return
        start = self._time(self._word_start)
        word = Heard("word", text, start, max(start, self._time(self._last_piece + 1)),
                     self.frame, self.item)
        self._words.append(word)
        out.append(word)

    def _add_piece(self, piece: str, out: list[Heard]) -> None:
        if piece.startswith(" ") and self._pieces:  # a new word without its EPAD
            self._finish_word(out)
        if not self._pieces:
            self._word_start = self.frame
        before = "".join(self._pieces).strip()
        self._pieces.append(piece)
        self._last_piece = self.frame
        word = "".join(self._pieces).strip()  # grows by appending: `before` is its start
        if before:
            delta = word[len(before):]
        else:  # the word's first text: after a space where it is not the turn's first
            delta = " " + word if word and self._words else word
        if delta:
            out.append(Heard("piece", delta, self._time(self.frame), self._time(self.frame),
                             self.frame, self.item))

    def feed(self, token: int, p_silence: float | None = None) -> list[Heard]:
        """The next frame's token (and, with VAD heads, the turn head's probability of no
        voice) -> the events it completes."""
        self.frame += 1
        out: list[Heard] = []
        piece = self.text.piece(token)
        if self._holding and not (piece and self._pieces and not piece.startswith(" ")):
            out += self.end_turn()  # the word is done: what comes now is the next turn's
        if token == self.text.epad:
            self._finish_word(out)
        elif piece:
            self._add_piece(piece, out)
        if self._end_at is None and (self._words or self._pieces):
            if self.vad:
                if p_silence is not None and p_silence > self.threshold:
                    self._end_at = self.frame + self.flush_frames
            elif self.frame - self._last_piece >= self.silence_frames:
                self._end_at = self.frame
        if self._end_at is not None and self.frame >= self._end_at and not self._holding:
            if piece:  # perhaps inside a word: the next frame tells
                self._holding = True
            else:
                out += self.end_turn()
        return out

    def close_turn(self) -> None:
        """The user's turn is over, as the app knows it (its own voice detector, a button):
        it ends once the delay's frames are written - the text of the audio heard so far -
        whether or not any of it is written yet."""
        if self._end_at is None:
            self._end_at = self.frame + self.flush_frames

    def end_turn(self) -> list[Heard]:
        """Ends the turn now (its last word with it): the "turn" event, or nothing when no
        word was heard since the last."""
        out: list[Heard] = []
        self._finish_word(out)
        self._end_at, self._holding = None, False
        if self._words:
            first, last = self._words[0], self._words[-1]
            out.append(Heard("turn", " ".join(w.text for w in self._words), first.start,
                             last.end, self.frame, self.item))
            self._words = []
            self.item += 1
        return out
