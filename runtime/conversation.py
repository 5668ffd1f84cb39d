"""One conversation on a shared model: `prefill()` once (the persona), then
`step(pcm_frame) -> (pcm_frame, text_token)` per 80 ms frame, on Moshi's own schedule (the
agent's frame n is heard right after step n + 1; the first step answers silence).

A conversation owns a row of a lockstep batch - Mimi state, KV rings, token ring, sampling noise
and parameters, the queue of words it is to say (runtime/words/say.py), the transcriber's state
where the model has one - plus its metrics, persona, word events and what it heard the user say
(runtime/words/heard.py); the model's graphs, tokenizer and voice bank it only reads. `close()`
gives its row back. This is the token-level conversation the front ends step (`step_many` batches many in one
tick); an app holds runtime/api.py's, which speaks text.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Callable, Mapping

import numpy as np

from personaplex_edge.errors import PersonaPlexError

from .lockstep import LockstepPool
from .metrics import FrameMetrics
from .persona import Persona, build_persona, persona_key
from .persona_cache import PersonaCache, Snapshot
from .sampling import SamplingParams
from .words.heard import Heard
from .words.say import SayEvent, Utterance, check_say_text, script_words

MAX_KEPT_EVENTS = 4096  # word events kept for say_events() when nobody collects them


class Conversation:
    def __init__(self, pool: LockstepPool, sampling: SamplingParams = SamplingParams(),
                 persona: Persona = Persona(), persona_cache: PersonaCache | None = None):
        self.pool = pool
        self.model = pool.model
        self.sampling = sampling
        self.persona = persona
        self.persona_cache = persona_cache
        self.metrics = FrameMetrics()
        self.prefill_seconds = 0.0
        self.persona_cached = False
        self.prompt_frames = 0  # the persona's frames, once prefilled: step 0 comes after them
        self._closed = False
        # word events: handed to on_say (on the stepping thread, after the step that made
        # them) when it is set, else kept for say_events()
        self.on_say: Callable[[SayEvent], None] | None = None
        self._said: deque[SayEvent] = deque(maxlen=MAX_KEPT_EVENTS)
        self._utterances = itertools.count(1)
        # what the user said (a model with a transcriber): events handed to on_heard like
        # on_say's, else kept for heard_events(); the transcriber's token of the last frame
        self.on_heard: Callable[[Heard], None] | None = None
        self._heard: deque[Heard] = deque(maxlen=MAX_KEPT_EVENTS)
        self.heard_token: int | None = None
        self.group, self.row = pool.take(self, sampling)

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            raise PersonaPlexError("this conversation was closed; open another on the model")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.pool.release(self.group, self.row)

    def __enter__(self) -> "Conversation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def position(self) -> int:
        return self.group.rings[self.row].position

    @property
    def ring(self):
        """The conversation's token ring (Moshi's schedule, personaplex_edge.streams)."""
        return self.group.rings[self.row]

    @property
    def last_frame(self) -> np.ndarray | None:
        """[9]: text, agent cb0..7 of the frame last emitted (None before the first)."""
        return self.group.last_frames[self.row]

    def restart(self, sampling: SamplingParams | None = None) -> None:
        """From the start again on the same row (new sampling, or the same seed's noise from its
        beginning); prefill() again before stepping."""
        self.check_open()
        sampling = self.sampling if sampling is None else sampling
        with self.group.lock:
            self.group.set_sampling(self.row, sampling)  # checked first: refused, nothing moved
            self.group.reset_row(self.row)
            self._collect()
        self.sampling = sampling
        self.prompt_frames = 0
        self._hand_over()

    # -- persona --------------------------------------------------------------------------------
    def prefill(self, persona: Persona | None = None) -> int:
        """Runs the persona (teacher-forced prompts) from a fresh start, or restores its forced
        part from the persona cache; returns the number of prompt frames (0 without a
        persona)."""
        self.check_open()
        if persona is not None:
            self.persona = persona
        self.restart()
        if not self.persona.enabled:
            return 0
        t0 = time.perf_counter()
        cache = self.persona_cache
        key = persona_key(self.model, self.persona)
        snap = cache.get(key) if cache is not None else None
        self.persona_cached = snap is not None
        group, row = self.group, self.row
        if snap is None:
            plan = build_persona(self.model, self.persona)
            group.prefill_forced(row, plan, lock=group.lock)  # the other rows tick between calls
            with group.lock:
                rings = group.helium.ring_prefix([row], len(plan) - 1)
            snap = Snapshot(len(plan) - 1, rings, plan.columns[-1], plan.embeddings[-1],
                            plan.pending)
            if cache is not None:
                cache.put(key, snap)
        else:
            with group.lock:
                group.helium.set_ring_prefix(snap.rings, [row])
        with group.lock:
            group.prefill_last(row, snap.plan())
        self.prefill_seconds = time.perf_counter() - t0
        self.prompt_frames = snap.forced + 1
        return self.prompt_frames

    # -- say ------------------------------------------------------------------------------------
    def say(self, text: str) -> Utterance:
        """Queues `text`'s words, after any still queued: from the next step on, the model's
        text stream takes them one by one, when the model asks for a word (runtime/words/say.py).
        Thread-safe; the user speaking does not cancel them. SayError (nothing queued) for a
        text check_say_text refuses or a queue that would pass MAX_QUEUED_WORDS."""
        self.check_open()
        check_say_text(text)
        uid = next(self._utterances)
        words = script_words(text, self.model.text.encode,
                             self.model.sample_rate / self.model.frame_size, uid)
        with self.group.lock:
            self.group.say(self.row, words)
        return Utterance(uid, text, tuple(w.text for w in words if w.tokens))

    def cancel_say(self) -> None:
        """Drops the queued words at once ("cancelled" events); a word being spoken ends at
        its end."""
        self.check_open()
        with self.group.lock:
            self.group.cancel_say(self.row)
            self._collect()
        self._hand_over()

    @property
    def saying(self) -> bool:
        """Whether words steer the text stream (queued, spoken, or the model not yet back)."""
        return self.group.say_machines[self.row].running

    def say_events(self) -> list[SayEvent]:
        """The word events since the last call (when no on_say takes them)."""
        events = []
        while self._said:
            events.append(self._said.popleft())
        return events

    def _collect(self) -> None:
        """The row's new word events into this conversation's (under the group's lock)."""
        events = self.group.said(self.row)
        if events:
            self._said.extend(events)
        transcriber = self.group.transcriber
        if transcriber is not None:
            self.heard_token = transcriber.token[self.row]
            heard = transcriber.take_events(self.row)
            if heard:
                self._heard.extend(heard)

    def _hand_over(self) -> None:
        """The kept events to on_say and on_heard, if set (outside the group's lock: they may
        say again)."""
        while self.on_say is not None and self._said:
            self.on_say(self._said.popleft())
        while self.on_heard is not None and self._heard:
            self.on_heard(self._heard.popleft())

    # -- what the user said ---------------------------------------------------------------------
    @property
    def transcribing(self) -> bool:
        """Whether the model has a transcriber: the user's words are heard."""
        return self.group.transcriber is not None

    def end_turn(self) -> None:
        """The user's turn is over (the app's own voice detector, a push-to-talk button): its
        "turn" event comes once the transcriber has written its last words (heard.py)."""
        self.check_open()
        with self.group.lock:
            if self.group.transcriber is not None:
                self.group.transcriber.streams[self.row].close_turn()

    def flush_heard(self, padding: int = 0) -> list[int]:
        """The user's input is over (a recording's end, stdin's): the transcriber steps on the
        silence moshi's STT inference pads after an input, so the words still inside its delay
        are written, and the turn ends (runtime/words/transcriber.py). PersonaPlex is not stepped.
        `padding`: samples of silence the input's last frame was padded with. -> the
        transcriber's token of each silent frame ([] without one)."""
        self.check_open()
        transcriber = self.group.transcriber
        if transcriber is None:
            return []
        with self.group.lock:
            tokens = transcriber.flush(self.row, padding, self.group.encoder)
            self._collect()
        self._hand_over()
        return tokens

    def heard_events(self) -> list[Heard]:
        """What the user said since the last call (when no on_heard takes it): pieces, timed
        words, turn ends (runtime/words/heard.py)."""
        events = []
        while self._heard:
            events.append(self._heard.popleft())
        return events

    @property
    def heard_vad(self):
        """[heads, classes]: the VAD heads' softmax of the last frame, class 0 the probability
        of no voice within 0.5 / 1 / 2 / 3 s (None without a transcriber with VAD heads)."""
        t = self.group.transcriber
        return None if t is None else t.vad[self.row]

    # -- the frame ------------------------------------------------------------------------------
    def step(self, pcm: np.ndarray) -> tuple[np.ndarray, int | None]:
        """pcm [1920] f32 at 24 kHz -> (pcm [1920] f32, the text token of the emitted frame, or
        None before the first complete frame). The returned pcm is a view into a buffer this
        conversation's next step overwrites."""
        return step_many({self: pcm})[self]


def step_many(frames: Mapping[Conversation, np.ndarray]
              ) -> dict[Conversation, tuple[np.ndarray, int | None]]:
    """One frame for each conversation in `frames` (conversation -> pcm [1920] f32): one
    lockstep tick per batch group, so conversations sharing a batch-B model's group are stepped
    in one call of each graph. -> conversation -> (pcm [1920] view, text token or None)."""
    groups: dict[int, tuple] = {}
    for conv, pcm in frames.items():
        conv.check_open()
        group, rows, owners = groups.setdefault(id(conv.group), (conv.group, {}, {}))
        rows[conv.row], owners[conv.row] = pcm, conv
    out: dict[Conversation, tuple[np.ndarray, int | None]] = {}
    for group, rows, owners in groups.values():
        with group.lock:
            results = group.tick(rows)
            # a copy, under the lock: last() is a view that another thread's next tick of this
            # group overwrites as soon as the lock is free
            tick_ms = group.metrics.last().copy()
            for b in results:
                owners[b]._collect()
        # the rows' owners as they were asked for: a row freed and taken again by another
        # thread since the tick must not credit the newcomer
        for b, result in results.items():
            owners[b].metrics.append(tick_ms)
            owners[b]._hand_over()
            out[owners[b]] = result
    return out
