"""One WebSocket's side of a conversation, whatever its wire protocol: the frames waiting for
the model, the messages waiting for the client, and the counters the client, /metrics and the
logs see. Each protocol subclasses `Session` with its own decoding of the client's audio and
its own encoding of the answers (chat.py: Ogg/Opus; realtime.py: JSON events of PCM16).

Two threads touch a session. The event loop (aiohttp) decodes the client's audio into frames and
pushes them into the backlog, and encodes answers into the send queue. The tick thread
(ticker.py) takes frames from the backlog and hands answers back through the event loop. The
backlog is the bounded-latency rule of `--mic`: when more than `max_backlog` frames wait, the
oldest are dropped and counted, so a session that falls behind hears its recent audio answered,
not audio from seconds ago. The send queue is bounded too: a client that stops reading ends
its own session instead of growing the server's memory.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from aiohttp import WSCloseCode

from personaplex_edge.errors import PersonaPlexError

from ..frame_backlog import FrameBacklog

if TYPE_CHECKING:
    from personaplex_edge.runtime.conversation import Conversation
    from personaplex_edge.runtime.words.heard import Heard
    from personaplex_edge.runtime.words.say import SayEvent

    from .params import ChatParams

log = logging.getLogger("personaplex_edge.serve")
_ids = itertools.count(1)
Job = Callable[["Conversation"], Any]
# seconds of audio a client may send ahead of the clock (a network's burst after a stall) before
# its session ends: further ahead it would take the other sessions' CPU in decoding
MAX_AHEAD_S = 10.0
# commands (say, cancel) a client may send before its conversation is ready; past them its
# session ends, as the backlog and the send queue bound the rest of what a session holds
MAX_WAITING_JOBS = 32


class ClientError(Exception):
    """What a client sent that ends its session; the reason goes to the client (the
    protocol's error message) and to the log."""


class LatencyLog:
    """The most recent per-frame times of a session (ms): how long a frame waited for its tick
    and how long from ready to answered. Written by the tick thread, read for reports."""

    def __init__(self, capacity: int = 4096):
        self._ms = np.zeros((capacity, 2), np.float64)  # [frame, (wait, answer)]
        self.capacity = capacity
        self.frames = 0

    def add(self, wait_ms: float, answer_ms: float) -> None:
        self._ms[self.frames % self.capacity] = (wait_ms, answer_ms)
        self.frames += 1

    def table(self, last: int | None = None) -> np.ndarray:
        n = min(self.frames, self.capacity, last or self.capacity)
        end = self.frames % self.capacity
        return self._ms[np.arange(end - n, end) % self.capacity]

    def percentiles(self, last: int | None = None) -> dict:
        t = self.table(last)
        if t.shape[0] == 0:
            return {}
        p = np.percentile(t, [50, 99], axis=0)
        return {"wait_p50_ms": p[0, 0], "wait_p99_ms": p[1, 0], "frame_p50_ms": p[0, 1],
                "frame_p99_ms": p[1, 1], "frame_max_ms": float(t[:, 1].max())}


class Session:
    """The protocol-neutral part of a session. A subclass turns answers into its messages
    (`_answer`, on the event loop) and calls `receive_frames` with the client's audio."""

    protocol = ""  # the route's name in the logs: "chat", "realtime"

    def __init__(self, peer: str, max_backlog: int, send_queue: int, sample_rate: int,
                 frame_size: int, wake: Callable[[], None],
                 call: Callable[[Callable[[], Any]], Future], piece: Callable[[int], str],
                 max_ahead_s: float | None = None):
        self.id = next(_ids)
        self.peer = peer
        self.params: "ChatParams | None" = None  # known once the protocol has the persona
        self.conv: "Conversation | None" = None
        self.backlog = FrameBacklog(max_backlog, wake)
        self.latency = LatencyLog()
        # messages for the client: bytes go out as binary frames, str as text frames
        self.outbox: asyncio.Queue[bytes | str] = asyncio.Queue(maxsize=send_queue)
        self.loop = asyncio.get_running_loop()
        self.ended = self.loop.create_future()  # set to the reason when the session must end
        self._piece = piece
        self.frames_answered = 0
        self.text_pieces = 0
        self.started = time.monotonic()
        self.max_ahead_s = max_ahead_s  # MAX_AHEAD_S in a server; None: no limit
        self.sample_rate = sample_rate
        self.frame_size = frame_size
        self._received = 0  # samples decoded
        self._first_audio: float | None = None
        self._call = call  # runs a job on the tick thread, between two ticks
        self._waiting: list[tuple[Job, Callable | None]] = []  # jobs before the conversation

    # -- event loop side --------------------------------------------------------------------------
    def receive_frames(self, frames: list[np.ndarray], samples: int) -> int:
        """Whole frames of the client's audio (and the samples its message held) into the
        backlog; returns the frames dropped. ClientError when the audio runs too far ahead of
        the clock."""
        now = time.monotonic()
        if self._first_audio is None:
            self._first_audio = now
        dropped = 0
        for frame in frames:
            dropped += self.backlog.push(frame)
        self._received += samples
        ahead = self._received / self.sample_rate - (now - self._first_audio)
        if self.max_ahead_s is not None and ahead > self.max_ahead_s:
            raise ClientError(
                f"audio arrives faster than real time ({ahead:.0f} s ahead of the clock, "
                f"{self.max_ahead_s:.0f} s allowed): stream at the audio's pace")
        return dropped

    def send(self, message: bytes | str) -> None:
        """Queues a message for the client; a full queue means it stopped reading."""
        if self.ended.done():
            return
        try:
            self.outbox.put_nowait(message)
        except asyncio.QueueFull:
            self.end(f"the client is not reading: {self.outbox.maxsize} messages wait to be "
                     "sent", WSCloseCode.POLICY_VIOLATION)

    def end(self, reason: str | None, code: int = WSCloseCode.OK) -> None:
        """Asks the handler to end the session with `reason` (None: quietly, the client
        left) and the WebSocket close `code`."""
        if not self.ended.done():
            self.ended.set_result((reason, code))

    def _deliver(self, pcm: np.ndarray, token: int | None) -> None:
        if self.ended.done():
            return
        piece = self._piece(token) if token is not None else ""
        if piece:
            self.text_pieces += 1
        self._answer(pcm, piece)

    def _answer(self, pcm: np.ndarray, piece: str) -> None:
        """One answer frame and its text piece ('' for none) -> messages (`send`)."""
        raise NotImplementedError

    # -- words the client has the model say (runtime/words/say.py) ---------------------------------
    def with_conversation(self, job: Job, then: Callable[[Any], None] | None = None) -> None:
        """job(conversation) on the tick thread between two ticks (held until the prefill is
        done), so the event loop never waits for a tick; then(its result) on the event loop,
        or `refused(reason)` when the job refuses what the client asked (PersonaPlexError).
        ClientError past MAX_WAITING_JOBS held for the prefill."""
        if self.conv is None:
            if len(self._waiting) >= MAX_WAITING_JOBS:
                raise ClientError(f"{len(self._waiting)} commands wait for the persona's "
                                  f"prefill, the most a session holds: wait until it is "
                                  "ready")
            self._waiting.append((job, then))
            return
        conv = self.conv
        future = self._call(lambda: job(conv))
        if then is not None:
            future.add_done_callback(lambda f: self._soon(self._job_done, f, then))

    def _job_done(self, future: Future, then: Callable[[Any], None]) -> None:
        if self.ended.done():
            return
        error = future.exception()
        if isinstance(error, PersonaPlexError):  # the client asked for what is not taken
            self.refused(str(error))
        elif error is not None:
            log.warning("session %d: %s", self.id, error)
        else:
            then(future.result())

    def refused(self, reason: str) -> None:
        """A command of the client that a job refused (on the event loop): by default its
        session ends with the protocol's error; a protocol that can refuse one command and go
        on says so instead."""
        self.end(reason, WSCloseCode.POLICY_VIOLATION)

    def conversation_ready(self) -> None:
        """The conversation is prefilled: its word events come to `_word` on the event loop,
        and the jobs that waited for it run."""
        self.conv.on_say = lambda event: self._soon(self._word, event)
        if self.conv.transcribing:  # the user's words, from a model with a transcriber
            self.conv.on_heard = lambda event: self._soon(self._heard, event)
        waiting, self._waiting = self._waiting, []
        for job, then in waiting:
            self.with_conversation(job, then)

    def _word(self, event: "SayEvent") -> None:
        """A word event of a say() (on the event loop): the protocol tells its client."""

    def _heard(self, event: "Heard") -> None:
        """What the user said (runtime/words/heard.py; on the event loop): the protocol tells its
        client, if it asked."""

    def summary(self) -> dict:
        """The whole session's figures (its latency over every kept frame)."""
        out = {"session": self.id, "protocol": self.protocol, "peer": self.peer,
               "frames": self.frames_answered, "dropped": self.backlog.dropped,
               "received": self.backlog.pushed, "text_pieces": self.text_pieces,
               "seconds": round(time.monotonic() - self.started, 2)}
        out.update({k: float(v) for k, v in self.latency.percentiles().items()})
        return out

    def stats(self) -> dict:
        out = {"session": self.id, "frames": self.frames_answered,
               "dropped": self.backlog.dropped, "backlog": len(self.backlog)}
        out.update({k: round(float(v), 2) for k, v in self.latency.percentiles(last=125).items()})
        return out

    # -- tick thread side -------------------------------------------------------------------------
    def answered(self, pcm: np.ndarray, token: int | None, ready: float, tick_start: float,
                 done: float) -> None:
        """An answer frame from the tick thread (pcm is the session's own copy)."""
        self.latency.add(1000.0 * (tick_start - ready), 1000.0 * (done - ready))
        self.frames_answered += 1
        self._soon(self._deliver, pcm, token)

    def failed(self, reason: str) -> None:
        """The tick thread could not step the session."""
        self._soon(self.end, reason, WSCloseCode.INTERNAL_ERROR)

    def _soon(self, fn: Callable, *args) -> None:
        """fn(*args) on the event loop, from another thread."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is gone: the server is stopping
            pass
