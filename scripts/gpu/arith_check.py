"""Stage 3 of the bare GPU check: the exported LM graphs' arithmetic on a device, in each
precision's own dtypes, against onnxruntime CPU float32 on the same history.

The graphs travel as numpy-only dumps (scripts/gpu/onnx_dump.py, made by `gpu_bare_check.py
--prepare` on a machine with onnx) and run through scripts/gpu/onnx_torch.py: the bare GPU machine
has torch with CUDA but no GPU build of onnxruntime and no TensorRT, and bf16 runs nowhere else
(onnxruntime's CPU has no bf16 MatMul).

`DumpLM` drives a (helium_step, depformer_step) dump pair frame by frame as a conversation does
(personaplex_edge.streams.TokenRing; the KV rings on the device, each step's new rows written
at position % T), greedy. The reference is benchmarks/lm_probe's greedy run of the float32
model on onnxruntime CPU; the dump is teacher-forced with the reference's tokens, so every
frame is compared on the same history: text and audio token agreement, and the hidden state's
relative error (lm_probe.hidden_error).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from onnx_torch import DTYPES, TorchGraph

HELIUM, DEPFORMER = "helium_step", "depformer_step"


class DumpLM:
    """A dumped helium/depformer pair on `device`, greedy (zero noise, temperature 1, top_k 0:
    in-graph sampling is then the argmax)."""

    def __init__(self, dump_dir: Path, device: str):
        self.device = torch.device(device)
        self.helium = TorchGraph.load(dump_dir / f"{HELIUM}.npz", device)
        self.depformer = TorchGraph.load(dump_dir / f"{DEPFORMER}.npz", device)
        self.feeds = {g: self._greedy_feeds(g) for g in (self.helium, self.depformer)}
        self.rings = self.helium.spec["rings"]

    def _greedy_feeds(self, graph: TorchGraph) -> dict[str, torch.Tensor]:
        feeds = {}
        for name, meta in graph.inputs.items():
            t = torch.zeros(meta["shape"], dtype=DTYPES[meta["dtype"]], device=self.device)
            if name.endswith("temperature"):
                t.fill_(1)
            feeds[name] = t
        return feeds

    def frame(self, tokens: np.ndarray, position: int) -> tuple[int, np.ndarray, np.ndarray]:
        """tokens [1, 17] -> (text token, agent tokens [8], hidden [D] float32); the step's new
        K/V rows are written into the rings at slot position % T."""
        h, d = self.feeds[self.helium], self.feeds[self.depformer]
        h["tokens"].copy_(torch.as_tensor(tokens).reshape(h["tokens"].shape))
        h["position"].fill_(position)
        out = self.helium.run(h)
        for ring in self.rings:
            buf = h[ring["input"]]  # [B, H, T, Dh]
            slot = position % buf.shape[ring["axis"]]
            buf.select(ring["axis"], slot).copy_(out[ring["output"]].select(ring["axis"], 0))
        d["hidden"].copy_(out["hidden"].to(d["hidden"].dtype))
        d["text_token"].copy_(out["text_token"].reshape(d["text_token"].shape))
        audio = self.depformer.run(d)["audio_tokens"]
        return (int(out["text_token"].reshape(-1)[0]), audio.reshape(-1).cpu().numpy(),
                out["hidden"].float().reshape(-1).cpu().numpy())

    def run(self, cfg, user_codes: np.ndarray, forced: np.ndarray) -> dict:
        """user_codes [frames, 8], forced [frames, 9] (the reference's tokens, fed back) ->
        tokens [frames, 9], hidden [frames, D], ms per frame (after the first)."""
        from lm_probe import drive

        n = len(user_codes)
        tokens = np.zeros((n, 9), np.int64)
        hidden, ms = [], []

        def timed(tokens_in: np.ndarray, position: int):
            t0 = time.perf_counter()
            out = self.frame(tokens_in, position)
            ms.append(1000 * (time.perf_counter() - t0))
            return out

        for t, (text, audio, hid), _ in drive(cfg, user_codes, timed, forced):
            tokens[t, 0], tokens[t, 1:] = text, audio
            hidden.append(hid)
        return {"tokens": tokens, "hidden": np.array(hidden), "ms": float(np.mean(ms[1:]))}


def reference_run(model_dir: Path, frames: int, seed: int = 1):
    """(config, user codes [frames, 8], onnxruntime CPU float32 greedy run) for model_dir."""
    from lm_probe import open_lm

    from personaplex_edge.manifest import load_model_dir

    cfg = load_model_dir(model_dir, need="lm").config
    user = np.random.default_rng(seed).integers(0, cfg.audio_vocab_size, (frames, 8))
    lm = open_lm(model_dir, "ort-cpu", threads=1)
    try:
        ref = lm.run(user)
    finally:
        lm.close()
    return cfg, user, ref


# The stage's verdict: how far from float32 each precision's hidden state may be (relative
# error, teacher-forced on float32's tokens). Several times what the CPU interpreter measures
# (fp32 1.2e-7, fp16 1.3e-4, bf16 1.0e-3, int4 3.9e-2 on the demo model): a device's kernels
# add their own rounding, not orders of magnitude. The float32 control must also choose
# float32's tokens.
HIDDEN_BOUND = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 3e-2, "int4": 0.2}
CONTROL_AGREEMENT = 0.95


def compare(model_dir: Path, dump_dir: Path, device: str, frames: int = 60,
            reference=None, precision: str | None = None) -> dict:
    """One precision's dump on `device` against the float32 reference (module docstring).
    With `precision`, raises AssertionError (the stage fails) where the result is not
    finite or is further from float32 than HIDDEN_BOUND allows."""
    from lm_probe import agreement, hidden_error

    cfg, user, ref = reference or reference_run(model_dir, frames)
    got = DumpLM(dump_dir, device).run(cfg, user, ref.tokens)
    a = agreement(got["tokens"], ref.tokens)
    error = hidden_error(got["hidden"], ref.hidden)
    if precision is not None:
        if not np.isfinite(got["hidden"]).all() or not error <= HIDDEN_BOUND[precision]:
            raise AssertionError(f"{precision}: hidden state {error:.2e} from float32 (bound "
                                 f"{HIDDEN_BOUND[precision]:.0e}), or not finite")
        if precision == "fp32" and min(a["text"], a["audio"]) < CONTROL_AGREEMENT:
            raise AssertionError(f"the float32 control chose other tokens than onnxruntime: "
                                 f"text {a['text']:.1%}, audio {a['audio']:.1%}")
    return {"text_agree": a["text"], "audio_agree": a["audio"],
            "first_difference": a["first_difference"],
            "hidden_rel_error": hidden_error(got["hidden"], ref.hidden),
            "ms_per_frame": got["ms"], "frames": len(user),
            "detail": f"text {a['text']:.1%}, audio {a['audio']:.1%} of tokens equal to "
                      f"onnxruntime CPU float32; hidden rel. error "
                      f"{hidden_error(got['hidden'], ref.hidden):.2e}; {got['ms']:.1f} ms/frame "
                      f"(interpreted, op by op)"}
