"""Per-frame, per-stage timings, kept in a preallocated table (no allocation per frame).

A frame's stages are aec (the echo canceller, live only), encode, temporal (Helium step),
depformer, decode and host (everything else the runtime does for that frame). The summary
gives p50/p90/p99/max per stage and for the whole frame, the frames over the 80 ms budget and
the real-time factor.
"""

from __future__ import annotations

import time

import numpy as np

STAGES = ("aec", "encode", "temporal", "depformer", "decode", "transcribe", "host")
# stages only some front ends or models run (the echo canceller: --mic; the transcriber's
# step: a model exported with one): left out of a summary that never recorded them
OPTIONAL_STAGES = ("aec", "transcribe")
FRAME_BUDGET_MS = 80.0


class FrameMetrics:
    def __init__(self, stages: tuple[str, ...] = STAGES, capacity: int = 1 << 16,
                 budget_ms: float = FRAME_BUDGET_MS):
        self.stages = stages
        self.budget_ms = budget_ms
        self.capacity = capacity
        self._ms = np.zeros((capacity, len(stages) + 1), np.float64)  # [frame, stage + total]
        self.frames = 0
        self._row = self._ms[0]
        self._t_frame = 0.0
        self._t_mark = 0.0
        self._index = {s: i for i, s in enumerate(stages)}
        self._before = np.zeros(len(stages), np.float64)  # ms spent before start_frame

    # -- recording (the worker calls these once per frame) ----------------------------------
    def start_frame(self) -> None:
        self._row = self._ms[self.frames % self.capacity]
        self._row[:] = 0.0
        self._t_frame = self._t_mark = time.perf_counter()
        self._t_frame -= self._take_before(self._row) / 1000.0

    def _take_before(self, row: np.ndarray) -> float:
        """Adds what add_before charged to `row`'s stages; returns its ms (then forgotten)."""
        if not self._before.any():
            return 0.0
        row[:-1] += self._before
        ms = float(self._before.sum())
        self._before[:] = 0.0
        return ms

    def mark(self, stage: str) -> float:
        """Charges the time since the last mark to `stage`; returns it (ms)."""
        now = time.perf_counter()
        ms = 1000.0 * (now - self._t_mark)
        self._row[self._index[stage]] += ms
        self._t_mark = now
        return ms

    def add_before(self, stage: str, ms: float) -> None:
        """Charges `ms` measured by someone else to `stage` of the next frame (and to its
        total): the duplex loop's echo canceller runs before the step starts its frame."""
        self._before[self._index[stage]] += ms

    def end_frame(self) -> float:
        now = time.perf_counter()
        total = 1000.0 * (now - self._t_frame)
        row = self._row
        accounted = row[:-1].sum()
        if "host" in self._index:
            row[self._index["host"]] += max(0.0, total - accounted)
        row[-1] = total
        self.frames += 1
        return total

    def append(self, row: np.ndarray) -> None:
        """Records a frame measured elsewhere ([stages + 1] ms, as `last()` returns it): a
        conversation's copy of the lockstep tick it took part in."""
        self._ms[self.frames % self.capacity] = row
        self._ms[self.frames % self.capacity, -1] += self._take_before(
            self._ms[self.frames % self.capacity])
        self.frames += 1

    def last(self) -> np.ndarray:
        """[stages + 1] ms of the newest frame (a view, valid until the next frame)."""
        return self._ms[(self.frames - 1) % self.capacity]

    # -- reading ----------------------------------------------------------------------------
    def table(self, last: int | None = None) -> np.ndarray:
        """[frames, stages + 1] ms of the most recent `last` frames (all kept frames if None)."""
        n = min(self.frames, self.capacity)
        if last is not None:
            n = min(n, last)
        end = self.frames % self.capacity
        idx = (np.arange(end - n, end)) % self.capacity
        return self._ms[idx]

    def summary(self, last: int | None = None, skip: int = 0) -> dict:
        t = self.table(last)[skip:]
        out: dict = {"frames": int(t.shape[0])}
        if t.shape[0] == 0:
            return out
        for i, name in enumerate(self.stages + ("frame",)):
            col = t[:, i]
            if name in OPTIONAL_STAGES and not col.any():
                continue
            out[name] = {"p50": float(np.percentile(col, 50)), "p90": float(np.percentile(col, 90)),
                         "p99": float(np.percentile(col, 99)), "max": float(col.max()),
                         "mean": float(col.mean())}
        out["over_budget"] = int((t[:, -1] > self.budget_ms).sum())
        out["real_time_factor"] = float(t[:, -1].mean() / self.budget_ms)
        return out


def format_summary(s: dict) -> str:
    if s.get("frames", 0) == 0:
        return "no frames"
    lines = [f"{'stage':10}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}  (ms, {s['frames']} frames)"]
    for name, v in s.items():
        if isinstance(v, dict):
            lines.append(f"{name:10}{v['p50']:8.2f}{v['p90']:8.2f}{v['p99']:8.2f}{v['max']:8.2f}")
    lines.append(f"over the 80 ms budget: {s['over_budget']} frames; real-time factor "
                 f"{s['real_time_factor']:.3f} (below 1 keeps up)")
    return "\n".join(lines)
