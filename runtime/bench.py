"""`personaplex-edge bench`: N conversations on one model, stepped as a server steps them (one
frame from each per round, in lockstep where the model has batch rows), timed per stage.

What it reports:
    per stream   each conversation's frame time per stage (its share of the ticks it was in)
    per round    the wall time to answer one frame of every stream: what must stay under the
                 80 ms a frame lasts for all N to keep up
    largest N    from this run's cost: ticks are per lockstep group (B rows each; B = 1 runs one
                 tick per conversation), so N streams cost ceil(N / B) ticks per round, and the
                 largest N is B x the ticks that fit in 80 ms at this run's p99 tick time
The JSON keeps every frame's stage times of every stream and every round's time, so a latency
that ramps over a long run shows in it (and in --plot).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from personaplex_edge.errors import PersonaPlexError

from .conversation import step_many
from .metrics import FRAME_BUDGET_MS, FrameMetrics, format_summary
from .api import Model
from .persona import Persona
from .sampling import SamplingParams


def bundled_speech() -> Path:
    """The 6 s speech sample the package carries (personaplex_edge/data/hello.wav)."""
    from importlib.resources import files

    return Path(str(files("personaplex_edge") / "data" / "hello.wav"))


@dataclass
class BenchResult:
    streams: int
    batch: int
    per_stream: list[dict]  # FrameMetrics summaries
    stages: tuple[str, ...]
    frame_ms: np.ndarray  # [streams, frames, stages + 1]: every measured frame
    round_ms: np.ndarray  # [frames]
    ticks: FrameMetrics  # one row per lockstep tick (one call of each graph), per stage
    position: int
    context: int

    @property
    def tick_ms(self) -> np.ndarray:
        """[ticks] ms of each whole tick."""
        return self.ticks.table()[:, -1]

    @property
    def ticks_per_round(self) -> int:
        return math.ceil(self.streams / self.batch)

    def largest_streams(self) -> int:
        """The most streams this model keeps up with at this run's p99 tick time."""
        p99 = float(np.percentile(self.tick_ms, 99))
        return self.batch * int(FRAME_BUDGET_MS // p99) if p99 > 0 else 0

    def to_json(self) -> dict:
        return {"streams": self.streams, "batch": self.batch,
                "position": self.position, "context": self.context,
                "round": _percentiles(self.round_ms), "tick": _percentiles(self.tick_ms),
                "tick_stages": self.ticks.summary(),
                "largest_streams": self.largest_streams(),
                "per_stream": self.per_stream, "stages": list(self.stages) + ["frame"],
                "frames": self.frame_ms.round(3).tolist(),
                "rounds": self.round_ms.round(3).tolist()}

    def report(self) -> str:
        lines = ["per frame" + (" (stream 0):" if self.streams > 1 else ":"),
                 format_summary(self.per_stream[0])]
        for k, s in enumerate(self.per_stream[1:], 1):
            lines.append(f"stream {k}: frame p50 {s['frame']['p50']:.2f} ms, p99 "
                         f"{s['frame']['p99']:.2f} ms, {s['over_budget']} over budget")
        r, t = _percentiles(self.round_ms), _percentiles(self.tick_ms)
        lines.append(f"round (one frame of all {self.streams} streams, {self.ticks_per_round} "
                     f"tick(s) of batch {self.batch}): p50 {r['p50']:.2f} ms, p99 "
                     f"{r['p99']:.2f} ms, {int((self.round_ms > FRAME_BUDGET_MS).sum())} over "
                     f"{FRAME_BUDGET_MS:.0f} ms")
        if self.streams > 1:
            lines += ["per tick (one call of each graph for a lockstep group):",
                      format_summary(self.ticks.summary())]
        lines.append(f"tick: p50 {t['p50']:.2f} ms, p99 {t['p99']:.2f} ms -> at most "
                     f"{self.largest_streams()} streams keep up on this machine (p99 ticks "
                     f"within {FRAME_BUDGET_MS:.0f} ms)")
        return "\n".join(lines)


def _percentiles(a: np.ndarray) -> dict:
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


def run_bench(model: Model, frames: int = 200, warmup: int = 10, streams: int = 1,
              sampling: SamplingParams = SamplingParams(), persona: Persona = Persona(),
              pcm: np.ndarray | None = None, front: Callable | None = None,
              position: int | None = None) -> BenchResult:
    """Runs `streams` conversations for warmup + frames rounds on `pcm` (24 kHz; the bundled
    speech sample looped by default), each with its own seed. `front(conversation)`, when
    given, makes a stream's stage in front of the model (the echo canceller:
    `clean = stage(frame)`, then `stage.played(answer)`). `position` starts each conversation
    that many frames in, after its persona, without stepping there (TokenRing.jump): from the
    context on (`model.context`, 3000 frames = 4 minutes) every KV ring slot is held, the steady
    state of any conversation longer than that. The slots the persona does not write hold
    zeros, written (BoundGraph.fill_rings) so that the ring is in memory as a long
    conversation's is; a step's cost does not depend on the values it attends to."""
    if streams < 1:
        raise PersonaPlexError("--streams must be at least 1")
    if pcm is None:
        from personaplex_edge.audio import read_audio

        pcm = read_audio(bundled_speech())
    frame = model.frame_size
    total = frames + warmup
    pcm = np.tile(pcm, -(-total * frame // pcm.shape[0]))
    convs = []
    for k in range(streams):
        seed = None if sampling.seed is None else sampling.seed + k
        conv = model.open_conversation(dataclasses.replace(sampling, seed=seed), persona)
        if position is not None:
            with conv.group.lock:
                conv.group.helium.fill_rings([conv.row])
        conv.prefill()
        if position is not None:
            if position < conv.position:
                raise PersonaPlexError(f"--position {position} is inside the persona's "
                                       f"{conv.position} frames: start at {conv.position} or "
                                       "later, or with --no-persona")
            conv.ring.jump(position)
        convs.append(conv)
    fronts = [front(conv) if front else None for conv in convs]
    offsets = [(k * 7 * frame) % pcm.shape[0] for k in range(streams)]  # streams differ
    round_ms = np.empty(total)
    ticks = FrameMetrics(convs[0].group.metrics.stages)
    try:
        for i in range(total):
            batch = {}
            for k, conv in enumerate(convs):
                start = (offsets[k] + i * frame) % (pcm.shape[0] - frame)
                x = pcm[start:start + frame]
                batch[conv] = fronts[k](x) if fronts[k] else x
            groups = {id(c.group): c.group for c in convs}
            seen = {key: g.metrics.frames for key, g in groups.items()}
            t0 = time.perf_counter()
            out = step_many(batch)
            round_ms[i] = 1000.0 * (time.perf_counter() - t0)
            if i >= warmup:
                for key, group in groups.items():
                    for row in group.metrics.table(last=group.metrics.frames - seen[key]):
                        ticks.append(row)
            for k, conv in enumerate(convs):
                if fronts[k]:
                    fronts[k].played(out[conv][0])
        per_stream = [c.metrics.summary(last=frames) for c in convs]
        table = np.stack([c.metrics.table(last=frames) for c in convs])
        return BenchResult(streams, model.batch, per_stream, convs[0].metrics.stages, table,
                           round_ms[warmup:], ticks, convs[0].position, model.context)
    finally:
        for conv in convs:
            conv.close()


def plot(result: BenchResult, path: str | Path) -> None:
    """Frame time per stage over the run (stream 0) and the round time, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PersonaPlexError("--plot needs matplotlib: pip install 'personaplex-edge[plot]'"
                               ) from None
    from personaplex_edge.atomic import atomic_file

    fig, ax = plt.subplots(figsize=(10, 4.5))
    t = result.frame_ms[0]  # [frames, stages + 1]
    for j, stage in enumerate(result.stages):
        if t[:, j].any():
            ax.plot(t[:, j], label=stage, linewidth=0.8)
    ax.plot(result.round_ms, label=f"round ({result.streams} streams)", color="black",
            linewidth=1.0)
    ax.axhline(FRAME_BUDGET_MS, color="red", linestyle="--", linewidth=0.8, label="80 ms")
    ax.set_xlabel("frame")
    ax.set_ylabel("ms")
    ax.set_title(f"per-stage frame time, stream 0 of {result.streams} (batch {result.batch})")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    with atomic_file(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
