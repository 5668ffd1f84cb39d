"""Shared, built-once material for the LM tests: the tiny moshi LM, its published checkpoint, a
greedy LMGen run over fixed user codes, the exported graphs, and drivers that run our torch
modules and our ONNX graphs on the project's own token schedule (personaplex_edge.streams).

Not a pytest conftest (tests/conftest.py belongs to the codec tests): test modules import it.
The builders are cached per process, so every LM test module shares one build.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from personaplex_edge.config import PersonaPlexConfig, preset  # noqa: E402

FRAMES = 70  # greedy frames compared; the tiny context (40) wraps well before the end
SEED = 0


@dataclass
class LMBundle:
    cfg: PersonaPlexConfig
    ref: object  # moshi LMModel
    checkpoint: Path
    user_codes: torch.Tensor  # [FRAMES, 8]
    ref_run: dict[str, torch.Tensor]  # see moshi_lm_reference.reference_lmgen
    workdir: Path


@functools.lru_cache(maxsize=None)
def lm_bundle() -> LMBundle:
    from moshi_lm_reference import reference_lm, reference_lmgen, save_published_lm

    cfg = preset("tiny")
    workdir = Path(tempfile.mkdtemp(prefix="lm_tests_"))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    ref = reference_lm(cfg, seed=SEED)
    ckpt = save_published_lm(ref, workdir / "model.safetensors")
    gen = torch.Generator().manual_seed(SEED + 7)
    user = torch.randint(0, cfg.audio_vocab_size, (FRAMES, 8), generator=gen)
    return LMBundle(cfg, ref, ckpt, user, reference_lmgen(ref, user), workdir)


@functools.lru_cache(maxsize=None)
def lm_modules():
    from personaplex_edge.export.lm import load_lm

    b = lm_bundle()
    return load_lm(b.checkpoint, b.cfg)


@functools.lru_cache(maxsize=None)
def lm_graphs() -> tuple[Path, dict]:
    from personaplex_edge.export.lm import export_lm_graphs

    b = lm_bundle()
    out = b.workdir / "graphs"
    return out, export_lm_graphs(b.cfg, b.checkpoint, out)


# ---- drivers ------------------------------------------------------------------------------------

class TorchLM:
    """Our torch modules, one frame at a time, with a torch KV ring."""

    def __init__(self, cfg: PersonaPlexConfig, helium, depformer):
        from personaplex_edge.export.helium import write_rows

        self.cfg, self.helium, self.depformer, self._write = cfg, helium, depformer, write_rows
        shape = helium.kv_shape(1)
        self.ring = [(torch.zeros(shape), torch.zeros(shape)) for _ in helium.layers]

    @torch.no_grad()
    def temporal(self, tokens: np.ndarray, position: int):
        logits, hidden, rows = self.helium.forward_logits(
            torch.from_numpy(tokens), torch.zeros(1, self.cfg.temporal_config.hidden_size),
            torch.tensor([position]), self.ring)
        self._write(self.ring, rows, position, self.helium.context)
        return logits, hidden

    @torch.no_grad()
    def greedy_frame(self, tokens: np.ndarray, position: int):
        logits, hidden = self.temporal(tokens, position)
        text = logits.argmax(-1)  # [1]
        audio, _ = self.depformer.run(hidden, text, lambda k, lg: lg.argmax(-1))
        return text.numpy(), audio.numpy(), logits, hidden


class OrtLM:
    """Our ONNX graphs in onnxruntime; the KV ring is numpy, rows written in place."""

    def __init__(self, cfg: PersonaPlexConfig, graph_dir: Path, k_max: int = 250):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2
        self.cfg, self.k_max = cfg, k_max
        self.helium = ort.InferenceSession(str(graph_dir / "helium_step.onnx"), opts,
                                           providers=["CPUExecutionProvider"])
        self.depformer = ort.InferenceSession(str(graph_dir / "depformer_step.onnx"), opts,
                                              providers=["CPUExecutionProvider"])
        h = cfg.temporal_config
        shape = (1, h.num_attention_heads, h.max_position_embeddings, h.head_dim)
        self.ring = {f"past_key_values.{i}.{kind}": np.zeros(shape, np.float32)
                     for i in range(h.num_hidden_layers) for kind in ("key", "value")}

    def frame(self, tokens: np.ndarray, position: int, text_noise: np.ndarray,
              audio_noise: np.ndarray, temperature=(0.7, 0.8), top_k=(25, 250)):
        h = self.cfg.temporal_config
        feed = {"tokens": tokens.reshape(1, 1, -1),  # one frame of the frames axis
                "extra_embedding": np.zeros((1, 1, h.hidden_size), np.float32),
                "position": np.array([position], np.int64), "text_noise": text_noise,
                "text_temperature": np.array([temperature[0]], np.float32),
                "text_top_k": np.array([top_k[0]], np.int64), **self.ring}
        names = [o.name for o in self.helium.get_outputs()]
        outs = dict(zip(names, self.helium.run(None, feed)))
        slot = position % h.max_position_embeddings
        for name, buf in self.ring.items():
            buf[:, :, slot] = outs[name.replace("past_key_values.", "present.")][:, :, 0]
        audio = self.depformer.run(None, {
            "hidden": outs["hidden"], "text_token": outs["text_token"],
            "audio_noise": audio_noise, "audio_temperature": np.array([temperature[1]], np.float32),
            "audio_top_k": np.array([top_k[1]], np.int64)})[0]
        return outs["text_token"], audio, outs["hidden"]


def run_schedule(cfg: PersonaPlexConfig, user_codes: torch.Tensor, frame_fn):
    """Drives `frame_fn(tokens [1,17], position) -> (text [1], audio [1,8])` on the project's
    token schedule; returns per-frame text [F], audio [F, 8] and outputs [F, 9] (-2 = none)."""
    from lm_probe import drive

    texts, audios, outputs = [], [], []
    for _, (text, audio), ring in drive(cfg, user_codes.numpy(), frame_fn):
        out = ring.output()
        texts.append(np.asarray(text).reshape(1))
        audios.append(np.asarray(audio).reshape(1, -1))
        outputs.append(np.full((1, 9), -2, np.int64) if out is None else out)
    return np.concatenate(texts), np.concatenate(audios), np.concatenate(outputs)
