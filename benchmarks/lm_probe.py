"""The language model of a model directory driven greedily, frame by frame, on any backend:
what precision checks, benchmarks and the GPU checks compare between graphs.

Per frame (Moshi's schedule, personaplex_edge.streams.TokenRing): the user's 8 codes go into the
token ring, helium_step runs on the complete column, its new K/V rows go into the KV ring at the
frame's position, depformer_step turns the hidden state into the agent's 8 tokens. Noise is zero,
so every graph's in-graph sampling is the argmax. The two graphs run as a conversation runs
them, through runtime/lm_frame (HostLM, or DeviceLinkedLM on TensorRT: linked on the device
and replayed as a CUDA graph), so what is measured is the product path.

`forced` tokens (teacher forcing) feed another run's text and audio tokens back instead of the
model's own, so two precisions can be compared frame by frame on the same history: free-running
greedy streams diverge for good after their first different token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from personaplex_edge.manifest import Manifest, load_model_dir
from personaplex_edge.streams import TokenRing

from personaplex_edge.runtime.backends import load_graphs
from personaplex_edge.runtime.lm_frame import HostLM


@dataclass
class GreedyRun:
    tokens: np.ndarray  # [frames, 9] int64: text, agent cb0..7 the model chose each frame
    temporal_ms: np.ndarray  # [frames] helium_step + ring write
    depformer_ms: np.ndarray  # [frames]
    hidden: np.ndarray  # [frames, D] float32: helium's output each frame


class _Marks:
    """The stage marks lm_frame's run() makes (temporal, depformer), as perf_counter times."""

    def __init__(self):
        self.start = time.perf_counter()
        self.at: dict[str, float] = {}

    def mark(self, stage: str) -> None:
        self.at[stage] = time.perf_counter()


class GreedyLM:
    def __init__(self, model_dir: str | Path, manifest: Manifest | None = None,
                 device: str = "auto", threads: int | None = None,
                 opener: Callable[[str], object] | None = None, lm=None):
        """`lm`: an lm_frame object (HostLM, DeviceLinkedLM) to drive; else `opener(graph
        name)` makes the bound graphs (backends.Graph), by default the manifest's backend
        loads and binds them (backends.load_graphs), and HostLM passes the hidden state."""
        self.manifest = manifest or load_model_dir(model_dir, need="lm")
        self.cfg = self.manifest.config
        if lm is None:
            opener = opener or (lambda name: load_graphs(model_dir, self.manifest, [name],
                                                          device, threads)[name].bind())
            lm = HostLM(opener("helium_step"), opener("depformer_step"))
        self.lm = lm
        self.helium, self.depformer = lm.helium, lm.depformer
        for graph in (self.helium, self.depformer):
            greedy_sampling(graph)

    def frame(self, tokens: np.ndarray, position: int) -> tuple[int, np.ndarray, float, float]:
        """tokens [1, 17] -> (text token, agent tokens [8], temporal ms, depformer ms; a
        device-linked frame counts both graphs as temporal); the hidden state stays in
        `self.helium.outputs["hidden"]` until the next frame."""
        self.helium.inputs["tokens"][...] = tokens
        self.helium.inputs["position"][...] = position
        marks = _Marks()
        text, audio = self.lm.run(None, marks)  # also writes the K/V rows at `position`
        t1, t2 = marks.at["temporal"], marks.at["depformer"]
        return (int(text[0]), audio[0].copy(), 1000 * (t1 - marks.start),
                1000 * (t2 - t1))

    def close(self) -> None:
        self.lm.close()

    def run(self, user_codes: np.ndarray, forced: np.ndarray | None = None) -> GreedyRun:
        """user_codes [frames, 8]; forced [frames, 9] or None -> the model's own choices."""
        n = len(user_codes)
        tokens = np.zeros((n, 9), np.int64)
        temporal, depth = np.zeros(n), np.zeros(n)
        hidden = np.zeros((n, self.helium.outputs["hidden"].shape[-1]), np.float32)
        for t, (text, audio, temporal[t], depth[t]), _ in drive(self.cfg, user_codes,
                                                                self.frame, forced):
            tokens[t, 0], tokens[t, 1:] = text, audio
            hidden[t] = self.helium.outputs["hidden"][0]
        return GreedyRun(tokens, temporal, depth, hidden)


def drive(cfg, user_codes: np.ndarray, frame: Callable, forced: np.ndarray | None = None
          ) -> Iterator[tuple[int, tuple, TokenRing]]:
    """The one frame loop of the probes: `frame(tokens [1, 17], position) -> (text, audio [8],
    ...)` over user_codes [frames, 8] on Moshi's schedule (personaplex_edge.streams.TokenRing),
    the frame's own text and audio fed back, or `forced` [frames, 9] (teacher forcing). Yields
    (t, what frame returned, the ring) once frame t's tokens are written."""
    ring = TokenRing(cfg)
    for t, codes in enumerate(user_codes):
        ring.write_user(np.asarray(codes)[None])
        result = frame(ring.step_input(), ring.position)
        text, audio = (result[0], result[1]) if forced is None else (forced[t, :1], forced[t, 1:])
        ring.write_generated(np.asarray(text).reshape(1), np.asarray(audio).reshape(1, -1))
        yield t, result, ring


def greedy_sampling(graph) -> None:
    """Sets a graph's sampling inputs for greedy decoding: temperature 1 and top_k 0 (= all of
    K_max); with zero noise the in-graph sampling is then the argmax."""
    for name, buf in graph.inputs.items():
        if name.endswith("temperature"):
            buf[...] = 1.0
        elif name.endswith("top_k"):
            buf[...] = 0


def open_lm(model_dir: str | Path, backend: str, threads: int | None = None) -> GreedyLM:
    """A GreedyLM on `backend`:
        ort-cpu     onnxruntime on the CPU (OrtGraph)
        ort-cuda    onnxruntime's CUDA provider, buffers and KV rings on the device
                    (OrtCudaGraph), both graphs on one stream
        ort-cuda-graph  the same, each graph's run captured by onnxruntime as a CUDA graph
                    and replayed (one per state parity)
        trt         TensorRT engines, each graph through the host (TrtGraph, HostLM)
        trt-linked  TensorRT, the depformer reading Helium's device outputs, eager
        trt-graph   the same replayed as CUDA graphs: what a conversation runs
                    (runtime/lm_frame.DeviceLinkedLM)"""
    import dataclasses

    manifest = load_model_dir(model_dir, need="lm")
    if backend == "ort-cpu":
        return GreedyLM(model_dir, dataclasses.replace(manifest, backend="onnx"), device="cpu",
                        threads=threads)
    if backend in ("ort-cuda", "ort-cuda-graph"):
        from personaplex_edge.runtime.backends.cuda_runtime import Stream
        from personaplex_edge.runtime.backends.ort_cuda import OrtCudaModelGraph

        stream = Stream()
        return GreedyLM(model_dir, manifest, opener=lambda name: OrtCudaModelGraph(
            model_dir, manifest.graphs[name], stream=stream,
            cuda_graph=backend == "ort-cuda-graph").bind())
    trt = dataclasses.replace(manifest, backend="tensorrt")
    if backend == "trt":
        return GreedyLM(model_dir, trt)
    if backend in ("trt-linked", "trt-graph"):
        from personaplex_edge.runtime.backends.trt import TrtEngine
        from personaplex_edge.runtime.lm_frame import DeviceLinkedLM

        lm = DeviceLinkedLM(TrtEngine(model_dir, trt, trt.graphs["helium_step"]),
                            TrtEngine(model_dir, trt, trt.graphs["depformer_step"]),
                            capture=backend == "trt-graph")
        if backend == "trt-graph" and lm.sequence is None:
            raise RuntimeError(f"CUDA graph capture failed: {lm.capture_error}")
        return GreedyLM(model_dir, trt, lm=lm)
    raise ValueError(f"unknown backend {backend!r}")


def linked_frame(model_dir: str | Path, manifest: Manifest):
    """(helium, depformer) as TrtGraphs on one stream, set for greedy decoding, the depformer
    reading helium's hidden state and text token on the device (runtime/lm_frame's
    DeviceLinkedLM, the product path, without its capture): a frame that
    cuda_graphs.CapturedSequence([helium, depformer]) can capture whole."""
    from personaplex_edge.runtime.backends.trt import TrtEngine
    from personaplex_edge.runtime.lm_frame import DeviceLinkedLM

    lm = DeviceLinkedLM(TrtEngine(model_dir, manifest, manifest.graphs["helium_step"]),
                        TrtEngine(model_dir, manifest, manifest.graphs["depformer_step"]),
                        capture=False)
    for graph in (lm.helium, lm.depformer):
        greedy_sampling(graph)
    return lm.helium, lm.depformer


def agreement(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Two [frames, 9] token arrays: fraction of equal text tokens, of equal audio tokens, of
    frames equal in all 9, and the first frame that differs (frames when none)."""
    same = a == b
    rows = same.all(axis=1)
    return {"text": float(same[:, 0].mean()), "audio": float(same[:, 1:].mean()),
            "frames": float(rows.mean()),
            "first_difference": int(np.argmin(rows)) if not rows.all() else len(rows)}


def hidden_error(a: np.ndarray, b: np.ndarray) -> float:
    """Median over frames of |a - b| / |b| for hidden states [frames, D] (b the reference): how
    far a precision moves the temporal transformer's output, independent of how flat the
    logits after it are."""
    num = np.linalg.norm(a - b, axis=-1)
    den = np.maximum(np.linalg.norm(b, axis=-1), 1e-12)
    return float(np.median(num / den))
