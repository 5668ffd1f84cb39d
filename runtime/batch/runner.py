"""The batch run: many recordings answered as fast as the machine goes, side by side.

Nothing a conversation computes needs the wall clock, so items are not paced: every tick steps
one frame of each open item in one lockstep call (a model exported with `--batch B` takes B at
once; rows join as items start and leave as they end, whatever their lengths). Each item is a
conversation of its own - its persona (from the persona cache when another item had it), its
seed - so its answer is `run`'s on that file with the same flags, whatever shares its ticks.

    pending items  ->  a free row: read the file, open the conversation, run the persona
                   ->  one frame per tick (step_many)  ->  the last frame: outputs written
                       (codes, text, then the answer, each atomically), the row freed

An item whose file cannot be read, or whose persona is refused, fails alone (one line; no
output), and the run goes on. Ctrl-C ends the run between ticks: finished items keep their
outputs, open ones leave none. The summary (every item's status, frames, seconds, error) is
written at the end either way.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from personaplex_edge.atomic import write_text_atomic
from personaplex_edge.audio import read_audio, write_audio
from personaplex_edge.errors import PersonaPlexError

from ..api import Model
from ..conversation import Conversation, step_many
from ..persona import Persona
from ..response import ResponseBuilder
from ..sampling import SamplingParams
from ..words.text import write_records
from .agent_codes import AgentCodes
from .items import Item
from .progress import BatchProgress


@dataclass
class ItemResult:
    key: str
    input: str
    output: str
    status: str = "pending"  # done, skipped, failed, interrupted or pending
    frames: int = 0
    seconds: float = 0.0  # of audio
    error: str | None = None


@dataclass
class BatchSummary:
    items: list[ItemResult]
    wall_seconds: float = 0.0
    interrupted: bool = False
    batch: int = 1  # the model's rows per tick
    ticks: int = 0  # lockstep ticks run
    row_frames: int = 0  # frames stepped, over every tick's rows
    extra: dict = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.items)

    @property
    def audio_seconds(self) -> float:
        return sum(r.seconds for r in self.items if r.status == "done")

    def to_json(self) -> dict:
        statuses = ("done", "skipped", "failed", "interrupted", "pending")
        return {**self.extra, "wall_seconds": round(self.wall_seconds, 3),
                "interrupted": self.interrupted,
                "counts": {s: self.count(s) for s in statuses},
                "audio_hours": round(self.audio_seconds / 3600, 6),
                "times_real_time": round(self.audio_seconds / max(self.wall_seconds, 1e-9), 3),
                "batch": self.batch, "ticks": self.ticks,
                "rows_busy": round(self.row_frames / max(self.ticks * self.batch, 1), 4),
                "items": [asdict(r) for r in self.items]}

    def write(self, path: Path) -> None:
        write_text_atomic(path, json.dumps(self.to_json(), indent=2, ensure_ascii=False))


class _Open:
    """An item on a row: its conversation, its recording, its next frame."""

    def __init__(self, item: Item, result: ItemResult, conv: Conversation,
                 built: ResponseBuilder):
        self.item, self.result, self.conv, self.built = item, result, conv, built
        self.next = 0


def _audio_seconds(path: Path) -> float:
    """A file's duration from its header (0 where it cannot be read: it fails when it runs)."""
    import soundfile as sf

    try:
        return float(sf.info(str(path)).duration)
    except Exception:  # noqa: BLE001 - libsndfile's errors; the item fails later, alone
        return 0.0


def run_batch(model: Model, items: list[Item], sampling: SamplingParams, persona: Persona, *,
              overwrite: bool = False, codes: bool = False, rows: int | None = None,
              workers: int = 1, progress: BatchProgress | None = None) -> BatchSummary:
    """Answers `items` (module docstring) on `model`: `rows` at a time in lockstep (default:
    the model's batch), by each of `workers` threads (each with its own rows; on a batch-1
    model on the CPU, a thread per core beats one item at a time: see the README). Items
    whose outputs are all there are skipped unless `overwrite`."""
    results = [ItemResult(i.key, str(i.input), str(i.output)) for i in items]
    hearing = model.loaded.transcriber is not None  # the user's words are written too
    todo = []
    for item, result in zip(items, results):
        if not overwrite and item.finished(codes, hearing):
            result.status = "skipped"
        else:
            todo.append((_audio_seconds(item.input), item, result))
    # the longest first: the last ticks, which every row's compute pays for however few rows
    # are left, then step the short items (stable: equal lengths in key order)
    todo.sort(key=lambda entry: -entry[0])
    run = _Run(model, sampling, persona, codes, hearing,
               BatchSummary(results, batch=model.batch),
               progress or BatchProgress(len(todo), sum(seconds for seconds, _, _ in todo)))
    pending = deque((item, result) for _, item, result in todo)
    t0 = time.perf_counter()
    run.busy = max(workers, 1)  # counted before any starts: the wait below sees them all
    try:
        if workers <= 1:
            run.work(pending, rows or model.batch)
        else:
            threads = [threading.Thread(target=run.work, args=(pending, rows or model.batch),
                                        name=f"personaplex-batch-{k}", daemon=True)
                       for k in range(workers)]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():  # joined in slices: Ctrl-C reaches this thread
                    t.join(0.2)
    except KeyboardInterrupt:
        run.interrupt()
    finally:
        run.wait_for_workers()
        run.summary.wall_seconds = time.perf_counter() - t0
        run.progress.close()
    if run.error is not None:
        raise run.error
    return run.summary


class _Run:
    """What the workers of one run share: the model, the flags, the summary and its lock."""

    def __init__(self, model: Model, sampling: SamplingParams, persona: Persona, codes: bool,
                 hearing: bool, summary: BatchSummary, progress: BatchProgress):
        self.model, self.sampling, self.persona, self.codes = model, sampling, persona, codes
        self.hearing = hearing  # the model has a transcriber: the user's words written too
        self.summary, self.progress = summary, progress
        self.frame_seconds = model.frame_size / model.sample_rate
        self.lock = threading.Lock()  # the summary's counters and the progress display
        self.stop = threading.Event()  # Ctrl-C: every worker leaves between two ticks
        self.error: BaseException | None = None
        self.busy = 0  # workers not yet finished
        self._idle = threading.Condition(self.lock)

    def work(self, pending: deque, rows: int) -> None:
        """One worker: items from `pending` onto its rows, a tick at a time, until none is
        left or the run stops (its open items then marked interrupted)."""
        open_items: dict[Conversation, _Open] = {}
        try:
            while not self.stop.is_set():
                while len(open_items) < rows:
                    try:
                        item, result = pending.popleft()  # shared by the workers: atomic
                    except IndexError:
                        break
                    entry = self.start(item, result)
                    if entry is not None:
                        open_items[entry.conv] = entry
                if not open_items:
                    return
                self.tick(open_items)
        except KeyboardInterrupt:  # Ctrl-C in this thread (the only worker): the run stops
            self.interrupt()
        except BaseException as e:  # noqa: BLE001 - raised again by the main thread
            self.stop.set()
            self.error = e
        finally:
            for entry in open_items.values():
                entry.result.status = "interrupted"
                entry.conv.close()
            with self.lock:
                self.busy -= 1
                self._idle.notify_all()

    def interrupt(self) -> None:
        self.summary.interrupted = True
        self.stop.set()

    def wait_for_workers(self) -> None:
        with self.lock:
            while self.busy:
                self._idle.wait()

    def tick(self, open_items: dict[Conversation, _Open]) -> None:
        answers = step_many({conv: e.built.frame(e.next) for conv, e in open_items.items()})
        for conv, (pcm, token) in answers.items():
            entry = open_items[conv]
            entry.built.add(entry.next, pcm, token, conv.last_frame)
            if self.hearing:  # (drained either way: nothing takes them later)
                entry.built.hear([conv.heard_token], conv.heard_events())
            entry.next += 1
            if entry.next == entry.built.frames:
                if entry.built.hearing:  # the last words, inside the transcriber's delay
                    entry.built.hear(conv.flush_heard(entry.built.padding), conv.heard_events())
                del open_items[conv]
                conv.close()
                self.finish(entry)
        with self.lock:
            self.summary.ticks += -(-len(answers) // self.model.batch)
            self.summary.row_frames += len(answers)
            self.progress.advance(len(answers) * self.frame_seconds)

    def start(self, item: Item, result: ItemResult) -> _Open | None:
        """The item's recording read and its conversation open with its persona run; None
        (and the item failed) where either is refused."""
        model, sampling, persona = self.model, self.sampling, self.persona
        try:
            pcm = read_audio(item.input, model.sample_rate)
            conv = model.open_conversation(
                dataclasses.replace(sampling, seed=item.own("seed", sampling.seed)),
                Persona(text_prompt=item.own("text_prompt", persona.text_prompt),
                        voice=item.own("voice", persona.voice), enabled=persona.enabled))
        except PersonaPlexError as e:
            self.fail(result, e)
            return None
        try:
            conv.prefill()
        except BaseException as e:
            conv.close()
            if not isinstance(e, PersonaPlexError):
                raise
            self.fail(result, e)
            return None
        # the user's words kept where the item writes them (a Full-Duplex-Bench tree does not)
        heard_text = model.loaded.heard_text if self.hearing and item.user_text else None
        built = ResponseBuilder(pcm, model.frame_size, model.text, keep_codes=self.codes,
                                heard_text=heard_text)
        result.frames, result.seconds = built.frames, pcm.shape[0] / model.sample_rate
        return _Open(item, result, conv, built)

    def fail(self, result: ItemResult, error: Exception) -> None:
        result.status, result.error = "failed", str(error)
        with self.lock:
            self.progress.say(f"{result.key}: failed: {error}")
            self.progress.item_done()

    def finish(self, entry: _Open) -> None:
        """The item's outputs, each atomically: codes, text, the user's words (a model with a
        transcriber), then the answer (which marks the item finished for a rerun)."""
        item, built, model = entry.item, entry.built, self.model
        response = built.response()
        try:
            if self.codes:
                agent, text = built.codes()
                AgentCodes(agent, text, built.samples, model.sample_rate,
                           model.frame_size).save(item.codes)
            if item.text is not None:
                write_records(item.text, response.records)
            if self.hearing and item.user_text is not None:
                write_records(item.user_text, response.heard_records)
            write_audio(item.output, response.pcm, model.sample_rate)
        except OSError as e:
            self.fail(entry.result, PersonaPlexError(f"cannot write {item.output}: {e}"))
            return
        entry.result.status = "done"
        with self.lock:
            self.progress.item_done()
