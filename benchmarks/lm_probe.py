"""The language model of a model directory driven greedily, frame by frame, on any backend:
what precision checks, benchmarks and the GPU check compare between graphs.

Per frame (Moshi's schedule, personaplex_edge.streams.TokenRing): the user's 8 codes go into the
token ring, helium_step runs on the complete column, its new K/V rows go into the KV ring at the
frame's position, depformer_step turns the hidden state into the agent's 8 tokens. Noise is zero,
so every graph's in-graph sampling is the argmax.

`forced` tokens (teacher forcing) feed another run's text and audio tokens back instead of the
model's own, so two precisions can be compared frame by frame on the same history: free-running
greedy streams diverge for good after their first different token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from personaplex_edge.manifest import Manifest, load_model_dir
from personaplex_edge.streams import TokenRing

from personaplex_edge.runtime.backends import load_graphs


@dataclass
class GreedyRun:
    tokens: np.ndarray  # [frames, 9] int64: text, agent cb0..7 the model chose each frame
    temporal_ms: np.ndarray  # [frames] helium_step + ring write
    depformer_ms: np.ndarray  # [frames]
    hidden: np.ndarray  # [frames, D] float32: helium's output each frame


class GreedyLM:
    def __init__(self, model_dir: str | Path, manifest: Manifest | None = None,
                 device: str = "auto", threads: int | None = None,
                 opener: Callable[[str], object] | None = None):
        """`opener(graph name)` makes the bound graph objects (backends.Graph); by default the
        manifest's backend loads and binds them (backends.load_graphs)."""
        self.manifest = manifest or load_model_dir(model_dir, need="lm")
        self.cfg = self.manifest.config
        opener = opener or (lambda name: load_graphs(model_dir, self.manifest, [name], device,
                                                      threads)[name].bind())
        self.helium = opener("helium_step")
        self.depformer = opener("depformer_step")
        for graph in (self.helium, self.depformer):
            greedy_sampling(graph)

    def frame(self, tokens: np.ndarray, position: int) -> tuple[int, np.ndarray, float, float]:
        """tokens [1, 17] -> (text token, agent tokens [8], temporal ms, depformer ms); the
        hidden state stays in `self.helium.outputs["hidden"]` until the next frame."""
        h, d = self.helium, self.depformer
        h.inputs["tokens"][...] = tokens
        h.inputs["position"][...] = position
        t0 = time.perf_counter()
        out = h.run()  # also writes the step's K/V rows into the ring, at `position`
        t1 = time.perf_counter()
        d.inputs["hidden"][...] = out["hidden"]
        d.inputs["text_token"][...] = out["text_token"]
        audio = d.run()["audio_tokens"]
        t2 = time.perf_counter()
        return int(out["text_token"][0]), audio[0].copy(), 1000 * (t1 - t0), 1000 * (t2 - t1)

    def run(self, user_codes: np.ndarray, forced: np.ndarray | None = None) -> GreedyRun:
        """user_codes [frames, 8]; forced [frames, 9] or None -> the model's own choices."""
        ring = TokenRing(self.cfg)
        n = len(user_codes)
        tokens = np.zeros((n, 9), np.int64)
        temporal, depth = np.zeros(n), np.zeros(n)
        hidden = np.zeros((n, self.helium.outputs["hidden"].shape[-1]), np.float32)
        for t in range(n):
            ring.write_user(user_codes[t][None])
            text, audio, temporal[t], depth[t] = self.frame(ring.step_input(), ring.position)
            tokens[t, 0], tokens[t, 1:] = text, audio
            hidden[t] = self.helium.outputs["hidden"][0]
            fed = tokens[t] if forced is None else forced[t]
            ring.write_generated(fed[:1], fed[None, 1:])
        return GreedyRun(tokens, temporal, depth, hidden)


def greedy_sampling(graph) -> None:
    """Sets a graph's sampling inputs for greedy decoding: temperature 1 and top_k 0 (= all of
    K_max); with zero noise the in-graph sampling is then the argmax."""
    for name, buf in graph.inputs.items():
        if name.endswith("temperature"):
            buf[...] = 1.0
        elif name.endswith("top_k"):
            buf[...] = 0


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
