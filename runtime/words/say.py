"""Words an app decides, spoken through the model's own inner monologue.

Moshi-family models speak what their text stream says. Kyutai's TTS drives that stream with a
small state machine (kyutai-labs/moshi, `moshi/models/tts.py`): the model decides *when* a word
starts, the machine decides *which* word. This is the same machine, torch-free, for one row of a
lockstep batch; Lockstep applies it to the sampled text token between Helium and the depformer,
and what it returns is what the depformer and the token ring get, exactly as a sampled token.

Per step, while words are queued (t = the step's position):

    sampled token   EPAD (0) asks for a word; anything else counts as PAD
    a word's pieces still to feed   -> the next piece, whatever was sampled
    forced padding left (the first 2 steps, a break)   -> PAD
    PADs allowed in a row used up (6)   -> a word is taken, as if EPAD was sampled
    a word taken   -> EPAD now, its pieces on the next steps ("started" at t; "done" at the
                      step of its last piece)
    a word asked for after the last one   -> PAD, and the model's own text resumes next step

`script_words` splits text as moshi's `script_to_entries` does for one speaker: on whitespace
and `<break time="1.5s"/>` (PADs forced for that long), after the same replacements of
punctuation the TTS was trained without.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.streams import TEXT_EPAD, TEXT_PAD

MAX_PADDING = 6  # PADs the model may take in a row before a word is forced on it (480 ms)
INITIAL_PADDING = 2  # PADs forced before the first word (160 ms), so its start is not cut
# One text to say, on every surface (SAY, the assistant's say, a Realtime assistant item, `run
# --say`, conv.say): more is an app's bug, not speech to queue, and would hold the stepping
# thread while it is split and encoded.
MAX_SAY_CHARS = 4096
# Entries (words and breaks) one conversation holds queued: some ten minutes of speech. Past it
# a say is refused, so a client saying faster than the model speaks cannot grow the queue.
MAX_QUEUED_WORDS = 2048
MAX_BREAK_S = 60.0  # the longest `<break time="..."/>`

# `<break time="2s"/>` (the slash optional) or a run of whitespace: where words end
_SPLIT = re.compile(r'<break\s+time="([0-9]+(?:\.[0-9]*)?)s"\s*/?>|\s+')
# characters the TTS's text normalisation replaces before splitting
_REPLACE = str.maketrans({"\u2019": "'", ":": " ", "(": None, ")": None})


class SayError(PersonaPlexError):
    """Words a conversation does not take (the reason names the limit and what to do)."""


def check_say_text(text: object, what: str = "the text to say") -> str:
    """`text` if a conversation takes it: a string with something to say, at most
    MAX_SAY_CHARS characters; SayError naming `what` otherwise. Every surface asks this before
    it queues anything, so a refusal is the same everywhere."""
    if not isinstance(text, str):
        raise SayError(f"{what} is a string, not {type(text).__name__}")
    if len(text) > MAX_SAY_CHARS:
        raise SayError(f"{what} has {len(text)} characters, over the limit of {MAX_SAY_CHARS}; "
                       "say it in parts (each is queued after the last)")
    if not text.strip():
        raise SayError(f"{what} is empty: give the words to say")
    return text


@dataclass(frozen=True)
class Word:
    """One entry of the queue: a word and its SentencePiece pieces, or a break (no pieces)."""

    text: str
    tokens: tuple[int, ...]  # () for a break
    padding: int = 0  # PADs forced once it is taken (a break's frames)
    utterance: int = 0  # the say() call it came from
    index: int = -1  # its place among that call's words (-1 for a break)


@dataclass(frozen=True)
class SayEvent:
    """What happened to a word: "started" (its EPAD was fed at `step`), "done" (its last piece
    was fed at `step`) or "cancelled" (dropped from the queue at `step`, never spoken). `last`:
    no word of its utterance is left after this one."""

    kind: str
    word: str
    utterance: int
    index: int
    step: int  # the conversation's position (frames since its start, persona included)
    last: bool

    def to_dict(self, first_step: int = 0) -> dict:
        """The event as the wires send it, its step counted from `first_step` (a front end
        passes the persona's frames: the client's first frame is step 0)."""
        return {"event": self.kind, "word": self.word, "utterance": self.utterance,
                "index": self.index, "step": self.step - first_step, "last": self.last}


@dataclass(frozen=True)
class Utterance:
    """One say() call: its id (in its events) and the words queued from it, in order."""

    id: int
    text: str
    words: tuple[str, ...]


def script_words(text: str, encode: Callable[[str], list[int]], frame_rate: float,
                 utterance: int = 0) -> list[Word]:
    """`text` -> the queue's entries: words (their pieces from `encode`) and breaks, in order.
    One pass over the text (the pieces between the separators are sliced once each)."""
    words: list[Word] = []
    index = itertools.count()

    def word(chunk: str) -> None:
        tokens = tuple(encode(chunk))
        words.append(Word(chunk, tokens, 0, utterance, next(index) if tokens else -1))

    text = text.translate(_REPLACE)
    at = 0
    for m in _SPLIT.finditer(text):
        if m.start() > at:
            word(text[at:m.start()])
        at = m.end()
        if m.group(1):
            seconds = float(m.group(1))
            if seconds > MAX_BREAK_S:
                raise SayError(f"a break of {m.group(1)} s, over the limit of {MAX_BREAK_S:g} s")
            words.append(Word("", (), int(round(seconds * frame_rate)), utterance))
    if at < len(text):
        word(text[at:])
    return words


def arrival_step(seconds: float, frame_rate: float) -> int:
    """The first step at or after `seconds` (step 0 at 0 s): ceil(seconds x frame_rate), with
    decimal seconds that land on a frame (0.08 s) taken as that frame."""
    if seconds < 0 or not math.isfinite(seconds):
        raise PersonaPlexError(f"words timed at {seconds} s: give seconds from the start, >= 0")
    return max(0, math.ceil(round(seconds * frame_rate, 9)))


def said_line(events: Iterable[SayEvent], first_step: int = 0) -> str:
    """One line of what was said: each word at its step (counted from `first_step`), and the
    words never reached."""
    events = list(events)
    started = [f"{e.word} @{e.step - first_step}" for e in events if e.kind == "started"]
    lost = sum(e.kind == "cancelled" for e in events)
    return ("said: " + (", ".join(started) or "nothing")
            + (f" ({lost} word(s) not reached)" if lost else ""))


class SayPlan:
    """Texts timed in seconds from step 0 (`run --say TEXT --say-at S`, `respond(say=...)`),
    each handed out once, at the step it arrives."""

    def __init__(self, says: Iterable[tuple[float, str]], frame_rate: float):
        self._due = deque(sorted(((arrival_step(s, frame_rate), t) for s, t in says),
                                 key=lambda st: st[0]))

    def say_due(self, step: int, say: Callable[[str], object]) -> None:
        """say(text) for each text due at or before `step` not handed out yet, in time order
        (before that step is stepped)."""
        while self._due and self._due[0][0] <= step:
            say(self._due.popleft()[1])


class SayMachine:
    """One row's word queue and the state machine over its text stream (module docstring).
    Idle it costs nothing: the lockstep steers only rows whose machine is `running`."""

    def __init__(self, max_padding: int = MAX_PADDING, initial_padding: int = INITIAL_PADDING):
        self.max_padding, self.initial_padding = max_padding, initial_padding
        self.words: deque[Word] = deque()  # entries not taken yet
        self.pieces: deque[int] = deque()  # the taken word's pieces still to feed
        self.speaking: Word | None = None  # the word those pieces belong to
        self.running = False  # steering the text stream (from a say() to the machine's end)
        self.remaining_padding = 0  # PADs the model may still take before a word is forced
        self.forced_padding = 0  # PADs still forced
        self.stopping = False  # cancelled: the word being spoken is the last
        self.events: list[SayEvent] = []  # for the conversation to collect after the step
        self._left: dict[int, int] = {}  # utterance -> its words not yet done or cancelled

    def add(self, words: Sequence[Word]) -> None:
        """Appends words; an idle machine starts, with its initial padding. SayError, nothing
        queued, when they would take the queue past MAX_QUEUED_WORDS."""
        if not words:
            return
        if len(self.words) + len(words) > MAX_QUEUED_WORDS:
            raise SayError(f"{len(self.words)} words are still queued and {len(words)} more "
                           f"would pass the limit of {MAX_QUEUED_WORDS}: wait for their events "
                           "or cancel them")
        if not self.running:
            self.running = True
            self.remaining_padding = self.forced_padding = self.initial_padding
        self.stopping = False
        self.words.extend(words)
        for w in words:
            if w.tokens:
                self._left[w.utterance] = self._left.get(w.utterance, 0) + 1

    def feed(self, token: int, step: int) -> int:
        """The token sampled at `step` -> the token the model gets instead (see the module
        docstring). Only called while `running`."""
        new_word = token == TEXT_EPAD
        if self.pieces or self.forced_padding > 0:
            new_word = False
        elif self.remaining_padding <= 0:
            new_word = True
        if new_word:
            if not self.words:  # asked for a word after the last: the machine's end
                self._stop()
                return TEXT_PAD
            word = self.words.popleft()
            self.forced_padding = word.padding
            if word.tokens:
                self.pieces.extend(word.tokens)
                self.speaking = word
                self.remaining_padding = self.max_padding
                self._event("started", word, step)
                return TEXT_EPAD
            # a break: this step is a PAD like any other
        if self.remaining_padding > 0:
            self.remaining_padding -= 1
        if self.forced_padding > 0:
            self.forced_padding -= 1
        if not self.pieces:
            return TEXT_PAD
        piece = self.pieces.popleft()
        if not self.pieces:
            self._event("done", self.speaking, step)
            self.speaking = None
            if self.stopping:
                self._stop()
        return piece

    def cancel(self, step: int) -> None:
        """Drops the words not started; a word being spoken ends at its end, then the model's
        own text resumes (at once when none is)."""
        for w in self.words:
            if w.tokens:
                self._event("cancelled", w, step)
        self.words.clear()
        self.forced_padding = 0
        if self.pieces:
            self.stopping = True
        elif self.running:
            self._stop()

    def reset(self, step: int) -> None:
        """A fresh conversation on the row: every word left, spoken or not, is cancelled."""
        self.cancel(step)
        if self.speaking is not None:
            self._event("cancelled", self.speaking, step)
        self.pieces.clear()
        self.speaking = None
        self._stop()

    def _stop(self) -> None:
        self.running = self.stopping = False
        self.remaining_padding = self.forced_padding = 0

    def _event(self, kind: str, word: Word, step: int) -> None:
        last = False
        if kind != "started":
            left = self._left[word.utterance] - 1
            last = left == 0
            if last:
                del self._left[word.utterance]
            else:
                self._left[word.utterance] = left
        self.events.append(SayEvent(kind, word.text, word.utterance, word.index, step, last))
