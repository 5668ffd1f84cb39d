"""The one thread that runs the model for every session.

Whenever frames are ready it takes one frame from each session that has one and steps them all
with one `step_many` call: a batch-1 model steps each conversation in turn, a batch-B model
steps up to B conversations of one lockstep group in one call of each graph; sessions without a
frame wait for a later tick. Between ticks it runs the jobs other threads hand it (closing a
conversation), so nothing else touches a conversation while it is being stepped.

It never waits on a clock: a tick starts as soon as a frame is ready, so a frame's latency is
its wait for the tick already running plus its own tick. Under load, frames that arrive during
a tick are stepped together in the next one, which is where a batch-B model gains.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .session import Session
    from .stats import ServerStats

log = logging.getLogger("personaplex_edge.serve")


class Ticker:
    def __init__(self, step_many: Callable, stats: "ServerStats | None" = None):
        self._step_many = step_many
        self._stats = stats
        self._sessions: list["Session"] = []
        self._jobs: list[tuple[Callable[[], object], Future]] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="personaplex-tick", daemon=True)
        self.ticks = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Runs the jobs already handed over, then ends the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join()

    # -- other threads --------------------------------------------------------------------------
    def wake(self) -> None:
        """A session has a frame ready."""
        with self._cond:
            self._cond.notify()

    def attach(self, session: "Session") -> None:
        with self._cond:
            self._sessions.append(session)
            self._cond.notify()

    def call(self, fn: Callable[[], object]) -> Future:
        """Runs `fn` on the tick thread between two ticks; its result or error in the Future."""
        fut: Future = Future()
        with self._cond:
            if self._stop and not self._thread.is_alive():
                fut.set_exception(RuntimeError("the tick thread has stopped"))
                return fut
            self._jobs.append((fn, fut))
            self._cond.notify()
        return fut

    def detach(self, session: "Session") -> Future:
        """Takes the session out of the ticks and closes its conversation between two ticks;
        the Future is done when its row is free."""
        def close() -> None:
            if session in self._sessions:
                self._sessions.remove(session)
            if session.conv is not None:
                session.conv.close()
        return self.call(close)

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    # -- the thread -------------------------------------------------------------------------------
    def _ready(self) -> bool:
        return bool(self._jobs) or self._stop or any(len(s.backlog) for s in self._sessions)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(self._ready)
                jobs, self._jobs = self._jobs, []
                stopping = self._stop
            for fn, fut in jobs:
                try:
                    fut.set_result(fn())
                except BaseException as e:  # handed to whoever waits on the job
                    fut.set_exception(e)
            if stopping:
                with self._cond:
                    if not self._jobs:
                        return
                continue
            try:
                self._tick()
            except Exception:  # the thread must outlive any one tick's fault
                log.exception("the tick thread caught an error; it goes on")

    def _tick(self) -> None:
        batch: dict = {}
        for session in self._sessions:
            item = session.backlog.take()
            if item is not None:
                batch[session.conv] = (session, item)
        if not batch:
            return
        t0 = time.perf_counter()
        try:
            results = self._step_many({conv: frame for conv, (_, (frame, _)) in batch.items()})
        except Exception as e:  # a fault of the model or runtime, not of any client's input
            log.exception("a tick of %d session(s) failed", len(batch))
            for session, _ in batch.values():
                session.failed(f"internal error while stepping the model: {e}")
            return
        t1 = time.perf_counter()
        self.ticks += 1
        if self._stats is not None:
            self._stats.tick(t1 - t0, len(batch))
        for conv, (pcm, token) in results.items():
            session, (_, ready) = batch[conv]
            # the view is valid only until this conversation's next step: the session keeps
            # its own copy for the event loop to encode
            session.answered(pcm.copy(), token, ready, t0, t1)
            if self._stats is not None:
                self._stats.frame(conv.metrics, t1 - ready)
