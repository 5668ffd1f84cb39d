"""One conversation on a shared model: `prefill()` once (the persona), then
`step(pcm_frame) -> (pcm_frame, text_token)` per 80 ms frame, on Moshi's own schedule (the
agent's frame n is heard right after step n + 1; the first step answers silence).

A conversation owns every buffer that changes - a row of a lockstep batch: Mimi state, KV rings,
token ring, sampling noise and parameters - plus its metrics and persona; the model's graphs,
tokenizer and voice bank it only reads. `close()` gives its row back.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from personaplex_edge.errors import PersonaPlexError

from .lockstep import Lockstep, step_many
from .metrics import FrameMetrics
from .persona import Persona, PersonaCache, Snapshot, build_persona
from .sampling import SamplingParams

if TYPE_CHECKING:
    from .model import Model


class Conversation:
    def __init__(self, model: "Model", group: Lockstep, sampling: SamplingParams,
                 persona: Persona):
        self.model = model
        self.group = group
        self.sampling = sampling
        self.persona = persona
        self.metrics = FrameMetrics()
        self.last_frame: np.ndarray | None = None  # [9]: text, agent cb0..7 last emitted
        self.prefill_seconds = 0.0
        self.persona_cached = False
        self._closed = False
        self.row = group.join(self, sampling)

    # -- lifecycle ------------------------------------------------------------------------------
    def check_open(self) -> None:
        if self._closed:
            raise PersonaPlexError("this conversation was closed; open another on the model")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.model.release(self.group, self.row)

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

    def restart(self, sampling: SamplingParams | None = None) -> None:
        """From the start again on the same row (new sampling, or the same seed's noise from its
        beginning); prefill() again before stepping."""
        self.check_open()
        sampling = self.sampling if sampling is None else sampling
        with self.group.lock:
            self.group.set_sampling(self.row, sampling)  # checked first: refused, nothing moved
            self.group.reset_row(self.row)
        self.sampling = sampling
        self.last_frame = None

    # -- persona --------------------------------------------------------------------------------
    def prefill(self, persona: Persona | None = None) -> int:
        """Runs the persona (teacher-forced prompts) from a fresh start, or restores its forced
        part from the model's persona cache; returns the number of prompt frames (0 without a
        persona)."""
        self.check_open()
        if persona is not None:
            self.persona = persona
        self.restart()
        if not self.persona.enabled:
            return 0
        t0 = time.perf_counter()
        model, cache = self.model, self.model.persona_cache
        key = PersonaCache.key(model, self.persona)
        snap = cache.get(key)
        self.persona_cached = snap is not None
        group, row = self.group, self.row
        if snap is None:
            plan = build_persona(model, self.persona)
            group.prefill_forced(row, plan, lock=group.lock)  # the other rows tick between calls
            with group.lock:
                rings = group.helium.ring_prefix([row], len(plan) - 1)
            snap = Snapshot(len(plan) - 1, rings, plan.columns[-1], plan.embeddings[-1],
                            plan.pending)
            cache.put(key, snap)
        else:
            with group.lock:
                group.helium.set_ring_prefix(snap.rings, [row])
        with group.lock:
            group.prefill_last(row, snap.plan())
        self.prefill_seconds = time.perf_counter() - t0
        return snap.forced + 1

    # -- the frame ------------------------------------------------------------------------------
    def step(self, pcm: np.ndarray) -> tuple[np.ndarray, int | None]:
        """pcm [1920] f32 at 24 kHz -> (pcm [1920] f32, the text token of the emitted frame, or
        None before the first complete frame). The returned pcm is a view into a buffer this
        conversation's next step overwrites."""
        return step_many({self: pcm})[self]
