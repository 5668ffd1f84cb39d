"""The server's Prometheus metrics (`GET /metrics`, the prometheus-client library).

Each server has its own registry, so several servers in one process (the tests) do not share
counts. Times are in seconds, as Prometheus names them; the per-stage histograms are the
conversation's own frame stages (encode, temporal, depformer, decode, host) and the whole
frame, so a dashboard shows where a slow frame went.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (the handler's content type)

from personaplex_edge.runtime.metrics import OPTIONAL_STAGES

# 1 ms .. 1 s, dense around the 80 ms frame budget
_FRAME_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0)


class ServerStats:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.opened = Counter("personaplex_sessions_opened", "Sessions that got the handshake",
                              registry=r)
        self.refused = Counter("personaplex_sessions_refused",
                               "Requests refused before a conversation (busy, "
                               "unauthorized, origin, host, shutting_down)", ["reason"],
                               registry=r)
        self.ended = Counter("personaplex_sessions_ended",
                             "Sessions ended, by cause (client, error, shutdown)", ["cause"],
                             registry=r)
        self.open = Gauge("personaplex_sessions_open", "Sessions holding a slot now", registry=r)
        self.capacity = Gauge("personaplex_sessions_capacity", "--max-sessions", registry=r)
        self.frames = Counter("personaplex_frames", "Frames answered", registry=r)
        self.dropped = Counter("personaplex_dropped_frames",
                               "Input frames dropped because their session was behind",
                               registry=r)
        self.stage = Histogram("personaplex_frame_stage_seconds",
                               "Time of each stage of a frame's step", ["stage"],
                               buckets=_FRAME_BUCKETS, registry=r)
        self.latency = Histogram("personaplex_frame_latency_seconds",
                                 "From a frame decoded to its answer ready (wait + step)",
                                 buckets=_FRAME_BUCKETS, registry=r)
        self.ticks = Histogram("personaplex_tick_seconds", "One step_many call",
                               buckets=_FRAME_BUCKETS, registry=r)
        self.tick_rows = Histogram("personaplex_tick_sessions",
                                   "Sessions stepped by one tick",
                                   buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self.prefill = Histogram("personaplex_prefill_seconds",
                                 "Connect to handshake: the persona prefill (or its cache)",
                                 buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
                                 registry=r)
        self._stage_children: dict[str, object] = {}

    def tick(self, seconds: float, sessions: int) -> None:
        self.ticks.observe(seconds)
        self.tick_rows.observe(sessions)

    def frame(self, metrics, latency_seconds: float) -> None:
        """One answered frame: its stages from the conversation's FrameMetrics."""
        self.frames.inc()
        self.latency.observe(latency_seconds)
        row = metrics.last()  # [stages + total] ms
        for i, name in enumerate(tuple(metrics.stages) + ("frame",)):
            if name in OPTIONAL_STAGES and not row[i]:  # --mic's echo canceller; the
                continue  #                                 transcriber, where the model has one
            child = self._stage_children.get(name)
            if child is None:
                child = self._stage_children[name] = self.stage.labels(stage=name)
            child.observe(row[i] / 1000.0)

    def text(self) -> bytes:
        return generate_latest(self.registry)
