"""The language model (Helium + depformer): weights from `model.safetensors`, and its two graphs.

Weights come in the published key layout (bf16 in the real file, read as float32), checked
tensor by tensor against the shapes the config implies before anything is built: a config that
disagrees with the checkpoint is a CheckpointError naming each tensor. The depformer's attention
weights are packed over its dep_q steps (`in_proj_weight` [dep_q * 3 * dim, dim]); only the first
num_active_codebooks steps are loaded.

Graphs (fixed shapes, opset 17, one frame each):

    helium_step.onnx    tokens [B,17] i64, extra_embedding [B,D], position [B] i64,
                        text_noise [B,K], text_temperature [B], text_top_k [B] i64,
                        past_key_values.{i}.key / .value [B,H,T,Dh] (the KV ring, read only)
                        -> text_token [B] i64, hidden [B,D], present.{i}.key / .value [B,H,1,Dh]
    depformer_step.onnx hidden [B,D], text_token [B] i64, audio_noise [B,8,K],
                        audio_temperature [B], audio_top_k [B] i64 -> audio_tokens [B,8] i64

The caller owns the ring and writes present.{i}.* into slot position % T after each step.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from personaplex_edge.config import PersonaPlexConfig
from personaplex_edge.manifest import GraphEntry, TensorSpec
from personaplex_edge.streams import NUM_STREAMS, gumbel_noise

from .checkpoint import TensorFile, check_tensors
from .depformer import Depformer, check_depformer_config
from .helium import Helium
from .onnx_export import export_step, verify_step
from .sampling import DEFAULT_K_MAX

Shapes = dict[str, tuple[int, ...]]


# ---- checkpoint layout ---------------------------------------------------------------------------

def _canonical_key(key: str) -> str:
    """Single-step attention weights as moshi's own state_dict names them -> published names."""
    key = re.sub(r"^(transformer\.layers\.\d+\.self_attn)\.in_projs\.0\.weight$",
                 r"\1.in_proj_weight", key)
    return re.sub(r"^(transformer\.layers\.\d+\.self_attn)\.out_projs\.0\.weight$",
                  r"\1.out_proj.weight", key)


def expected_lm_tensors(cfg: PersonaPlexConfig) -> Shapes:
    """Every tensor of `model.safetensors` with the shape `cfg` implies (475 for the 7B)."""
    h, d = cfg.helium, cfg.depformer
    check_depformer_config(d)
    D, dim = h.hidden_size, d.hidden_size
    shapes: Shapes = {}
    for i in range(h.num_hidden_layers):
        p = f"transformer.layers.{i}"
        shapes[f"{p}.self_attn.in_proj_weight"] = (3 * D, D)
        shapes[f"{p}.self_attn.out_proj.weight"] = (D, D)
        shapes[f"{p}.gating.linear_in.weight"] = (2 * h.intermediate_size, D)
        shapes[f"{p}.gating.linear_out.weight"] = (D, h.intermediate_size)
        shapes[f"{p}.norm1.alpha"] = (1, 1, D)
        shapes[f"{p}.norm2.alpha"] = (1, 1, D)
    shapes["out_norm.alpha"] = (1, 1, D)
    for k in range(cfg.num_audio_codebooks):
        shapes[f"emb.{k}.weight"] = (cfg.audio_vocab_size + 1, D)
    shapes["text_emb.weight"] = (cfg.text_embedding_rows, D)
    shapes["text_linear.weight"] = (cfg.text_vocab_size, D)
    for j in range(d.num_hidden_layers):
        p = f"depformer.layers.{j}"
        shapes[f"{p}.self_attn.in_proj_weight"] = (d.dep_q * 3 * dim, dim)
        shapes[f"{p}.self_attn.out_proj.weight"] = (d.dep_q * dim, dim)
        shapes[f"{p}.norm1.alpha"] = (1, 1, dim)
        shapes[f"{p}.norm2.alpha"] = (1, 1, dim)
        for k in range(d.dep_q):
            shapes[f"{p}.gating.{k}.linear_in.weight"] = (2 * d.intermediate_size, dim)
            shapes[f"{p}.gating.{k}.linear_out.weight"] = (dim, d.intermediate_size)
    for k in range(d.dep_q):
        shapes[f"depformer_in.{k}.weight"] = (dim, D)
        shapes[f"linears.{k}.weight"] = (d.card, dim)
    for k in range(d.dep_q - 1):
        shapes[f"depformer_emb.{k}.weight"] = (d.card + 1, dim)
    shapes["depformer_text_emb.weight"] = (cfg.text_embedding_rows, dim)
    return shapes


def open_lm_checkpoint(path: str | Path, cfg: PersonaPlexConfig) -> TensorFile:
    tf = TensorFile(path, rename=_canonical_key)
    check_tensors(tf, expected_lm_tensors(cfg), what="PersonaPlex LM")
    return tf


def _helium_weights(tf: TensorFile, cfg: PersonaPlexConfig) -> dict[str, torch.Tensor]:
    h = cfg.helium
    w = {"text_emb": tf.get("text_emb.weight"),
         "audio_emb": torch.stack([tf.get(f"emb.{k}.weight")
                                   for k in range(cfg.num_audio_codebooks)]),
         "out_norm.alpha": tf.get("out_norm.alpha"),
         "text_linear.weight": tf.get("text_linear.weight")}
    for i in range(h.num_hidden_layers):
        src, dst = f"transformer.layers.{i}", f"layers.{i}"
        w[f"{dst}.self_attn.in_proj.weight"] = tf.get(f"{src}.self_attn.in_proj_weight")
        w[f"{dst}.self_attn.out_proj.weight"] = tf.get(f"{src}.self_attn.out_proj.weight")
        for name in ("gating.linear_in.weight", "gating.linear_out.weight", "norm1.alpha",
                     "norm2.alpha"):
            w[f"{dst}.{name}"] = tf.get(f"{src}.{name}")
    return w


def _depformer_weights(tf: TensorFile, cfg: PersonaPlexConfig) -> dict[str, torch.Tensor]:
    d = cfg.depformer
    dim, steps = d.hidden_size, d.num_active_codebooks
    w = {"text_emb": tf.get("depformer_text_emb.weight")}
    for k in range(steps):
        w[f"depformer_in.{k}.weight"] = tf.get(f"depformer_in.{k}.weight")
        w[f"linears.{k}.weight"] = tf.get(f"linears.{k}.weight")
    for k in range(steps - 1):
        w[f"audio_emb.{k}"] = tf.get(f"depformer_emb.{k}.weight")
    for j in range(d.num_hidden_layers):
        src, dst = f"depformer.layers.{j}", f"layers.{j}"
        in_proj = tf.get(f"{src}.self_attn.in_proj_weight")  # [dep_q * 3 * dim, dim]
        out_proj = tf.get(f"{src}.self_attn.out_proj.weight")  # [dep_q * dim, dim]
        for k in range(steps):
            w[f"{dst}.in_projs.{k}.weight"] = in_proj[k * 3 * dim:(k + 1) * 3 * dim].clone()
            w[f"{dst}.out_projs.{k}.weight"] = out_proj[k * dim:(k + 1) * dim].clone()
            for name in ("linear_in.weight", "linear_out.weight"):
                w[f"{dst}.gating.{k}.{name}"] = tf.get(f"{src}.gating.{k}.{name}")
        del in_proj, out_proj  # the inactive steps' slices are dropped here
        w[f"{dst}.norm1.alpha"] = tf.get(f"{src}.norm1.alpha")
        w[f"{dst}.norm2.alpha"] = tf.get(f"{src}.norm2.alpha")
    return w


def load_lm(path: str | Path, cfg: PersonaPlexConfig) -> tuple[Helium, Depformer]:
    """Helium and the depformer in float32 from a checkpoint, after checking every tensor."""
    tf = open_lm_checkpoint(path, cfg)
    with torch.device("meta"):  # no throwaway initial weights: the loaded tensors are assigned
        helium, depformer = Helium(cfg), Depformer(cfg)
    helium.load_state_dict(_helium_weights(tf, cfg), strict=True, assign=True)
    helium.make_buffers()
    depformer.load_state_dict(_depformer_weights(tf, cfg), strict=True, assign=True)
    return helium.eval(), depformer.eval()


# ---- graphs ----------------------------------------------------------------------------------------

def helium_inputs(cfg: PersonaPlexConfig, batch: int, k_max: int) -> list[TensorSpec]:
    h = cfg.helium
    specs = [TensorSpec("tokens", (batch, NUM_STREAMS), "int64"),
             TensorSpec("extra_embedding", (batch, h.hidden_size), "float32"),
             TensorSpec("position", (batch,), "int64"),
             TensorSpec("text_noise", (batch, k_max), "float32"),
             TensorSpec("text_temperature", (batch,), "float32"),
             TensorSpec("text_top_k", (batch,), "int64")]
    return specs + kv_ring_specs(cfg, batch)


def kv_ring_specs(cfg: PersonaPlexConfig, batch: int) -> list[TensorSpec]:
    """The KV ring inputs of helium_step, in graph order; the runtime owns these buffers
    (zeros at the start; what unwritten slots hold does not matter, they are masked)."""
    h = cfg.helium
    shape = (batch, h.num_attention_heads, h.max_position_embeddings, h.head_dim)
    return [TensorSpec(f"past_key_values.{i}.{kind}", shape, "float32")
            for i in range(h.num_hidden_layers) for kind in ("key", "value")]


def helium_outputs(cfg: PersonaPlexConfig) -> list[str]:
    return ["text_token", "hidden"] + [f"present.{i}.{kind}"
                                       for i in range(cfg.helium.num_hidden_layers)
                                       for kind in ("key", "value")]


def depformer_inputs(cfg: PersonaPlexConfig, batch: int, k_max: int) -> list[TensorSpec]:
    steps = cfg.depformer.num_active_codebooks
    return [TensorSpec("hidden", (batch, cfg.helium.hidden_size), "float32"),
            TensorSpec("text_token", (batch,), "int64"),
            TensorSpec("audio_noise", (batch, steps, k_max), "float32"),
            TensorSpec("audio_temperature", (batch,), "float32"),
            TensorSpec("audio_top_k", (batch,), "int64")]


def example_inputs(specs: list[TensorSpec], cfg: PersonaPlexConfig, seed: int = 0,
                   ) -> dict[str, np.ndarray]:
    """Non-trivial inputs for tracing and for the export check: random ring contents, a position
    past the context (the ring has wrapped), real Gumbel noise, a top-k that masks."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for s in specs:
        if s.name == "tokens":
            vocab = np.array([cfg.text_vocab_size] + [cfg.audio_vocab_size] * (NUM_STREAMS - 1))
            t = rng.integers(0, vocab + 1, size=s.shape)
            t[:, -1] = -1  # one stream contributing nothing
            out[s.name] = t.astype(np.int64)
        elif s.name == "position":
            out[s.name] = np.full(s.shape, cfg.helium.max_position_embeddings + 3, np.int64)
        elif s.name == "text_token":
            out[s.name] = rng.integers(0, cfg.text_vocab_size, size=s.shape).astype(np.int64)
        elif s.name.endswith("noise"):
            out[s.name] = gumbel_noise(rng, s.shape)
        elif s.name.endswith("temperature"):
            out[s.name] = np.full(s.shape, 0.8, np.float32)
        elif s.name.endswith("top_k"):
            out[s.name] = np.full(s.shape, 25, np.int64)  # below K_max: the mask matters
        else:
            out[s.name] = rng.standard_normal(s.shape).astype(np.float32)
    return out


def export_lm_graphs(cfg: PersonaPlexConfig, checkpoint_path: str | Path, out_dir: str | Path,
                     batch: int = 1, k_max: int = DEFAULT_K_MAX, verify: bool = True,
                     ) -> dict[str, GraphEntry]:
    """Writes helium_step.onnx and depformer_step.onnx into `out_dir` and returns their entries.
    With `verify`, each graph is run once in onnxruntime against the torch module."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    helium, depformer = load_lm(checkpoint_path, cfg)
    entries = {}
    jobs = [("helium_step", helium, helium.step, helium_inputs(cfg, batch, k_max),
             helium_outputs(cfg)),
            ("depformer_step", depformer, depformer.step, depformer_inputs(cfg, batch, k_max),
             ["audio_tokens"])]
    for name, owner, fn, specs, outputs in jobs:
        examples = example_inputs(specs, cfg)
        path = out_dir / f"{name}.onnx"
        step = (lambda *args, _fn=fn: (_fn(*args[:-1]), {}))  # no StateSpec state
        entries[name] = export_step(
            owner, step, [(s, torch.from_numpy(examples[s.name])) for s in specs], outputs, [],
            path)
        if verify:
            verify_step(path, step, examples, outputs)
    return entries
