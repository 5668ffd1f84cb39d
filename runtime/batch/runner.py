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
from ..text import write_records
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
              progress: BatchProgress | None = None) -> BatchSummary:
    """Answers `items` (module docstring) on `model`, `rows` at a time (default: the model's
    batch). Items whose outputs are all there are skipped unless `overwrite`."""
    rows = rows or model.batch
    results = [ItemResult(i.key, str(i.input), str(i.output)) for i in items]
    todo = []
    for item, result in zip(items, results):
        if not overwrite and item.finished(codes):
            result.status = "skipped"
        else:
            todo.append((_audio_seconds(item.input), item, result))
    # the longest first: the last ticks, which every row's compute pays for however few rows
    # are left, then step the short items (stable: equal lengths in key order)
    todo.sort(key=lambda entry: -entry[0])
    summary = BatchSummary(results, batch=model.batch)
    progress = progress or BatchProgress(len(todo), sum(seconds for seconds, _, _ in todo))
    pending = deque((item, result) for _, item, result in todo)
    frame_seconds = model.frame_size / model.sample_rate
    open_items: dict[Conversation, _Open] = {}
    t0 = time.perf_counter()

    def start(item: Item, result: ItemResult) -> None:
        try:
            pcm = read_audio(item.input, model.sample_rate)
            conv = model.open_conversation(
                dataclasses.replace(sampling, seed=item.own("seed", sampling.seed)),
                Persona(text_prompt=item.own("text_prompt", persona.text_prompt),
                        voice=item.own("voice", persona.voice), enabled=persona.enabled))
        except PersonaPlexError as e:
            fail(result, e)
            return
        try:
            conv.prefill()
        except PersonaPlexError as e:
            conv.close()
            fail(result, e)
            return
        built = ResponseBuilder(pcm, model.frame_size, model.text, keep_codes=codes)
        result.frames, result.seconds = built.frames, pcm.shape[0] / model.sample_rate
        open_items[conv] = _Open(item, result, conv, built)

    def fail(result: ItemResult, error: Exception) -> None:
        result.status, result.error = "failed", str(error)
        progress.say(f"{result.key}: failed: {error}")
        progress.item_done()

    def finish(entry: _Open) -> None:
        item, built = entry.item, entry.built
        response = built.response()
        try:
            if codes:
                agent, text = built.codes()
                AgentCodes(agent, text, built.samples, model.sample_rate,
                           model.frame_size).save(item.codes)
            if item.text is not None:
                write_records(item.text, response.records)
            write_audio(item.output, response.pcm, model.sample_rate)
        except OSError as e:
            fail(entry.result, PersonaPlexError(f"cannot write {item.output}: {e}"))
            return
        entry.result.status = "done"
        progress.item_done()

    try:
        while pending or open_items:
            while pending and len(open_items) < rows:
                start(*pending.popleft())
            if not open_items:
                continue
            answers = step_many({conv: e.built.frame(e.next) for conv, e in open_items.items()})
            for conv, (pcm, token) in answers.items():
                entry = open_items[conv]
                entry.built.add(entry.next, pcm, token, conv.last_frame)
                entry.next += 1
                if entry.next == entry.built.frames:
                    del open_items[conv]
                    conv.close()
                    finish(entry)
            summary.ticks += -(-len(answers) // model.batch)
            summary.row_frames += len(answers)
            progress.advance(len(answers) * frame_seconds)
    except KeyboardInterrupt:
        summary.interrupted = True
        for entry in open_items.values():
            entry.result.status = "interrupted"
            entry.conv.close()
    finally:
        summary.wall_seconds = time.perf_counter() - t0
        progress.close()
    return summary
