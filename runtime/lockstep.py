"""B conversations stepped together: one call of each graph per 80 ms tick for every row of a
batch-B model, so a bandwidth-bound GPU reads the weights once for B conversations.

A `Lockstep` owns one bound set of the four graphs (batch B) and, per row, what a conversation
needs beside them: its token ring (personaplex_edge.streams.TokenRing, Moshi's schedule), its
sampling noise, its temperatures and top-k (graph inputs per row). Rows join and leave between
ticks. A tick steps the rows that brought a frame (`tick({row: pcm})`); the others are held:
their state is put back and their KV rows are not written, so a conversation's output depends
on its own audio only, whichever rows shared its ticks. A batch-1 model is the same thing with
one row.

Per tick (rows stepped: A):

    encode      Mimi encoder: each row's 1920 samples -> 8 codes, into its token ring
    temporal    Helium on each row's complete column, at each row's own position -> text
                token, hidden, the new K/V rows (written at each row's slot)
    say         rows with words queued: the sampled text token through the row's SayMachine
                (runtime/words/say.py); skipped while no row of the batch has any
    depformer   hidden + text token -> the agent's 8 codes (on the device, for TensorRT)
    decode      Mimi decoder on the rows whose agent frame is complete -> 1920 samples
    transcribe  with a transcriber: its step on the same encode's codes (all n_q of them;
                PersonaPlex reads the first 8) -> what the user said (runtime/words/transcriber.py)

A `LockstepPool` holds a model's batches: a conversation takes a free row of one (a batch-1
model opens one batch per conversation; a batch-B model fills B rows of a batch before it
opens another) and gives it back. Nothing here knows what a conversation is: a row's owner is
whoever took it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, ContextManager, Mapping

import numpy as np

from personaplex_edge.contract import (AUDIO_NOISE, AUDIO_TEMPERATURE, AUDIO_TOP_K, CODES,
                                       DEPFORMER_STEP, EXTRA_EMBEDDING, HELIUM_STEP,
                                       MIMI_DECODER, MIMI_ENCODER, PCM, POSITION, TEXT_NOISE,
                                       TEXT_TEMPERATURE, TEXT_TOP_K, TOKENS)
from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.streams import (AGENT_FIRST, CODEBOOKS_PER_SPEAKER, TEXT_STREAM,
                                      USER_FIRST, TokenRing)

from .backends import FramedGraph
from .lm_frame import lm_frame
from .metrics import FrameMetrics
from .prompts import Prefill
from .sampling import RowNoise, SamplingParams
from .words.say import SayEvent, SayMachine, Word

if TYPE_CHECKING:
    from .model import LoadedModel


# Persona frames per Helium call while other rows of the group are live: their ticks wait for
# one call at most, and a call of 16 frames still reads the weights once for 16 frames.
PREFILL_CHUNK = 16


class Lockstep:
    """One batch of rows on a model (see the module docstring). Not used directly: a
    LockstepPool hands out its rows."""

    def __init__(self, model: "LoadedModel"):
        g = model.graphs
        self.model = model
        self.encoder = g[MIMI_ENCODER].bind()
        self.decoder = g[MIMI_DECODER].bind()
        self.lm = lm_frame(g[HELIUM_STEP], g[DEPFORMER_STEP])
        self.helium, self.depformer = self.lm.helium, self.lm.depformer
        self.batch = self.helium.batch
        if {self.encoder.batch, self.decoder.batch, self.depformer.batch} != {self.batch}:
            raise PersonaPlexError(f"{model.model_dir}: the graphs disagree on the batch size; "
                                   "export the model again")
        self._h, self._d = self.helium.inputs, self.depformer.inputs
        self.rings = [TokenRing(model.config) for _ in range(self.batch)]
        self.noise: list[RowNoise | None] = [None] * self.batch
        self.members: list[object | None] = [None] * self.batch  # each row's owner
        # [9] per row: text, agent cb0..7 of the frame the row last emitted (None before one)
        self.last_frames: list[np.ndarray | None] = [None] * self.batch
        self._extra_set = np.ones(self.batch, bool)  # the row's extra embedding may be non-zero
        self.say_machines = [SayMachine() for _ in range(self.batch)]  # each row's word queue
        self._saying: set[int] = set()  # rows whose machine runs: the tick steers their text
        self.metrics = FrameMetrics()  # per tick
        self.lock = threading.RLock()  # one tick (or prefill) at a time on these buffers
        self._silence = np.zeros(model.frame_size, np.float32)
        self.transcriber = None  # the user's words, where the model has a transcriber
        if model.transcriber is not None:
            from .words.transcriber import TranscriberRows

            self.transcriber = TranscriberRows(model)

    # -- rows ---------------------------------------------------------------------------------
    def free_row(self) -> int | None:
        return next((b for b, m in enumerate(self.members) if m is None), None)

    @property
    def occupied(self) -> int:
        return sum(m is not None for m in self.members)

    def join(self, owner: object, sampling: SamplingParams) -> int:
        """Gives `owner` a free row, in its initial state."""
        row = self.free_row()
        if row is None:
            raise PersonaPlexError("this lockstep batch is full")
        # refused settings must not take the row
        sampling.check(self._h[TEXT_NOISE].shape[-1], self._d[AUDIO_NOISE].shape[-1])
        self.members[row] = owner
        self.reset_row(row)
        self.set_sampling(row, sampling)
        return row

    def leave(self, row: int) -> None:
        self.members[row] = None
        self.noise[row] = None
        self.say_machines[row] = SayMachine()  # the next owner hears nothing of this one's words
        self._saying.discard(row)

    def reset_row(self, row: int) -> None:
        """A fresh conversation in `row`: codec state and token ring back to the start (the KV
        rings need nothing: their slots are masked by position)."""
        self.encoder.reset([row])
        self.decoder.reset([row])
        self.say_machines[row].reset(self.rings[row].position)
        self._saying.discard(row)
        self.rings[row].reset()
        self.last_frames[row] = None
        self._set_extra(row, None)
        if self.transcriber is not None:
            self.transcriber.reset(row)

    def set_sampling(self, row: int, sampling: SamplingParams) -> None:
        sampling.check(self._h[TEXT_NOISE].shape[-1], self._d[AUDIO_NOISE].shape[-1])
        self._h[TEXT_TEMPERATURE][row] = sampling.temp_text
        self._h[TEXT_TOP_K][row] = sampling.top_k_text
        self._d[AUDIO_TEMPERATURE][row] = sampling.temp
        self._d[AUDIO_TOP_K][row] = sampling.top_k
        self.noise[row] = RowNoise(sampling, self._h[TEXT_NOISE][row], self._d[AUDIO_NOISE][row])

    def _set_extra(self, row: int, extra: np.ndarray | None) -> None:
        buf = self._h[EXTRA_EMBEDDING]
        if extra is not None:
            buf[row] = extra.reshape(buf.shape[1:])
            self._extra_set[row] = True
        elif self._extra_set[row]:  # zeroed once after a voice prompt, not every frame
            buf[row] = 0.0
            self._extra_set[row] = False

    # -- say ------------------------------------------------------------------------------------
    def say(self, row: int, words: list[Word]) -> None:
        """Appends words to `row`'s queue: its next tick steers its text stream."""
        self.say_machines[row].add(words)
        if self.say_machines[row].running:
            self._saying.add(row)

    def cancel_say(self, row: int) -> None:
        self.say_machines[row].cancel(self.rings[row].position)
        if not self.say_machines[row].running:
            self._saying.discard(row)

    def said(self, row: int) -> list[SayEvent]:
        """The row's word events since the last call (the machine's own empty list when none:
        nothing is allocated while nothing is said)."""
        machine = self.say_machines[row]
        events = machine.events
        if events:
            machine.events = []
        return events

    def _steer(self, text: np.ndarray, rows: list[int]) -> None:
        """The sampled text tokens [B] of the rows saying words, through their machines."""
        positions = self._h[POSITION]
        for b in rows:
            machine = self.say_machines[b]
            if machine.running:
                text[b] = machine.feed(int(text[b]), int(positions[b]))
                if not machine.running:
                    self._saying.discard(b)

    # -- persona --------------------------------------------------------------------------------
    @property
    def framed(self) -> bool:
        """Whether Helium here takes several frames in one call (a graph with a frames axis, on
        a backend that binds one): the persona prefill then reads the weights once."""
        return self._h[TOKENS].ndim == 3 and isinstance(self.helium, FramedGraph)

    def prefill_forced(self, row: int, plan: Prefill, frame_by_frame: bool = False,
                       lock: ContextManager = contextlib.nullcontext()) -> None:
        """Runs the persona's teacher-forced columns 0..len-2 of `plan` through Helium for
        `row` (positions 0.., the KV rows land in its ring); nothing is sampled. As few calls
        as `prefill_call` makes, each inside `lock` (a conversation passes the group's lock,
        so the group's other rows tick between calls; without it the caller holds it)."""
        done = 0
        while done < len(plan) - 1:
            with lock:
                done = self.prefill_call(row, plan, done, frame_by_frame)

    def prefill_call(self, row: int, plan: Prefill, done: int,
                     frame_by_frame: bool = False) -> int:
        """One Helium call of the persona's forced columns from column `done` on; returns how
        many are done after it. A graph with a frames axis takes every remaining column in one
        call while `row` is alone in the group, and PREFILL_CHUNK of them while other rows are
        live: the caller takes the group's lock per call, so their ticks go on between calls
        instead of waiting for the whole prompt. Without a frames axis (or with
        `frame_by_frame`): one step per column, as the reference does."""
        forced = len(plan) - 1
        if self.framed and not frame_by_frame:
            count = forced - done if self.occupied <= 1 else min(PREFILL_CHUNK, forced - done)
            tokens = np.zeros((self.batch, count, self._h[TOKENS].shape[-1]), np.int64)
            extra = np.zeros((self.batch, count, self._h[EXTRA_EMBEDDING].shape[-1]),
                             self._h[EXTRA_EMBEDDING].dtype)  # [B, F, D]
            tokens[row] = np.stack(plan.columns[done:done + count])  # [F, 17]
            for f, e in enumerate(plan.embeddings[done:done + count]):
                if e is not None:
                    extra[row, f] = e.reshape(-1)
            self._h[POSITION][row] = done
            self.helium.run_frames({TOKENS: tokens, EXTRA_EMBEDDING: extra}, [row])
            return done + count
        self.rings[row].offset = done  # the position the temporal step runs at
        self._h[TOKENS][row] = plan.columns[done]
        self._set_extra(row, plan.embeddings[done])
        self._h[POSITION][row] = done
        self.helium.run([row])
        return done + 1

    def prefill_last(self, row: int, plan: Prefill) -> None:
        """The last prompt column runs like a live step: its text and agent codebook 0 are the
        first sampled tokens; agent codebooks 1..7 of that column stay the forced ones."""
        ring, slots, last = self.rings[row], self.rings[row].slots, len(plan) - 1
        ring.offset = last
        ring.tokens[:, :, last % slots] = plan.columns[last]
        ring.tokens[:, :, (last + 1) % slots] = plan.pending
        self.noise[row].fill()
        ring.step_input(out=self._h[TOKENS][row])
        self._set_extra(row, plan.embeddings[last])
        self._h[POSITION][row] = last
        text, audio = self.lm.run([row])
        agent = audio[row].copy()  # [8]
        agent[1:] = plan.pending[AGENT_FIRST + 1:USER_FIRST]
        ring.write_generated(text[row:row + 1], agent[None])
        self._set_extra(row, None)

    # -- the tick -------------------------------------------------------------------------------
    def tick(self, frames: Mapping[int, np.ndarray]) -> dict[int, tuple[np.ndarray, int | None]]:
        """Steps the rows in `frames` (row -> pcm [1920] f32 at 24 kHz) one frame: -> row ->
        (pcm [1920], a view valid until the row's next step; the text token of the emitted
        frame, or None before the first complete frame)."""
        rows = sorted(frames)
        m = self.metrics
        m.start_frame()
        pcm_in = self.encoder.inputs[PCM]  # [B, 1, frame]
        for b in rows:
            pcm = frames[b]
            if pcm.size != pcm_in.shape[-1]:
                raise PersonaPlexError(f"a frame is {pcm_in.shape[-1]} samples, got {pcm.size}")
            pcm_in[b, 0] = pcm.reshape(-1)
        codes = self.encoder.run(rows)[CODES]  # [B, 8]
        m.mark("encode")
        tokens, positions = self._h[TOKENS], self._h[POSITION]
        for b in rows:
            ring = self.rings[b]
            self.noise[b].fill()
            ring.write_user(codes[b, :CODEBOOKS_PER_SPEAKER])
            ring.step_input(out=tokens[b])
            positions[b] = ring.position
            self._set_extra(b, None)
        m.mark("host")
        steer = (lambda text: self._steer(text, rows)) if self._saying else None
        text, audio = self.lm.run(rows, m, steer)  # marks temporal and depformer
        out_rows, codes_out = [], self.decoder.inputs[CODES]
        emitted: dict[int, int | None] = {}
        for b in rows:
            ring = self.rings[b]
            ring.write_generated(text[b:b + 1], audio[b][None])
            frame = ring.output()  # [1, 9] or None
            if frame is None:
                emitted[b] = None
                continue
            codes_out[b] = frame[0, AGENT_FIRST:USER_FIRST]
            emitted[b] = int(frame[0, TEXT_STREAM])
            self.last_frames[b] = frame[0]
            out_rows.append(b)
        m.mark("host")
        pcm_out = self.decoder.run(out_rows)[PCM] if out_rows else None  # [B, 1, frame]
        m.mark("decode")
        if self.transcriber is not None:
            self.transcriber.step(rows, codes, frames)  # the encode's codes, as it left them
            m.mark("transcribe")
        m.end_frame()
        return {b: (self._silence if emitted[b] is None else pcm_out[b, 0], emitted[b])
                for b in rows}

    def close(self) -> None:
        for g in (self.encoder, self.decoder, self.lm):
            g.close()
        if self.transcriber is not None:
            self.transcriber.close()


class LockstepPool:
    """The lockstep batches of one loaded model: rows handed out and taken back. One empty
    batch is kept for the next taker (opening one conversation after another allocates
    nothing); further empty ones let their buffers go."""

    def __init__(self, model: "LoadedModel"):
        self.model = model
        self.groups: list[Lockstep] = []
        self._lock = threading.Lock()
        self._closed = False

    def take(self, owner: object, sampling: SamplingParams) -> tuple[Lockstep, int]:
        """A free row for `owner` (a new batch when every row is taken), in its initial state.
        Refused sampling settings take no row."""
        if self._closed:
            raise PersonaPlexError("this model was closed; load it again")
        with self._lock:
            group = next((g for g in self.groups if g.free_row() is not None), None)
            if group is None:
                group = Lockstep(self.model)
                self.groups.append(group)
            with group.lock:
                row = group.join(owner, sampling)
        return group, row

    def release(self, group: Lockstep, row: int) -> None:
        with self._lock:
            with group.lock:
                group.leave(row)
            idle = [g for g in self.groups if g.occupied == 0]
            for extra in idle[1:]:
                self.groups.remove(extra)
                extra.close()

    @property
    def occupied(self) -> int:
        return sum(g.occupied for g in self.groups)

    def close(self) -> None:
        """Lets every batch's buffers go now (device memory on a GPU backend)."""
        with self._lock:
            self._closed = True
            for group in self.groups:
                group.close()
            self.groups = []
