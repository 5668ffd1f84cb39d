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

import dataclasses
import math
import re
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx
import torch
from torch import nn

from personaplex_edge.config import PersonaPlexConfig
from personaplex_edge.contract import (AUDIO_NOISE, AUDIO_TEMPERATURE, AUDIO_TOKENS, AUDIO_TOP_K,
                                       DEPFORMER_STEP, EXTRA_EMBEDDING, FRAMES_AXIS, HELIUM_STEP,
                                       HIDDEN, KV_INPUT_PREFIX, KV_KINDS, POSITION, TEXT_NOISE,
                                       TEXT_TEMPERATURE, TEXT_TOKEN, TEXT_TOP_K, TOKENS,
                                       TRANSCRIBER_STEP, kv_input, kv_output)
from personaplex_edge.manifest import GraphEntry, TensorSpec
from personaplex_edge.gumbel import gumbel_noise
from personaplex_edge.streams import NUM_STREAMS

from .checkpoint import TensorFile, check_tensors
from .depformer import Depformer
from .frugal import SafetensorsHeader, Segment, WeightPlan
from .helium import Helium
from .lm_weights import (checkpoint_sources, final_graph, made, read_parameter, spot_check,
                         stored_build, write_graph)
from .onnx_export import CHECK_ATOL, export_step, trace_step, verify_step
from .precision_plan import PrecisionPlan
from .sampling import DEFAULT_K_MAX

Shapes = dict[str, tuple[int, ...]]
RING_GRAPHS = (HELIUM_STEP, TRANSCRIBER_STEP)  # the graphs with a KV ring


# ---- checkpoint layout ---------------------------------------------------------------------------

def _canonical_key(key: str) -> str:
    """Single-step attention weights as moshi's own state_dict names them -> published names."""
    key = re.sub(r"^(transformer\.layers\.\d+\.self_attn)\.in_projs\.0\.weight$",
                 r"\1.in_proj_weight", key)
    return re.sub(r"^(transformer\.layers\.\d+\.self_attn)\.out_projs\.0\.weight$",
                  r"\1.out_proj.weight", key)


def temporal_tensors(cfg) -> Shapes:
    """The temporal transformer's tensors, in moshi's names, with the shapes `cfg` implies: its
    layers, the final norm, the audio and text tables and the text head (`cfg` a
    PersonaPlexConfig or a TranscriberConfig)."""
    h = cfg.temporal_config
    D = h.hidden_size
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
    return shapes


def expected_lm_tensors(cfg: PersonaPlexConfig) -> Shapes:
    """Every tensor of `model.safetensors` with the shape `cfg` implies (475 for the 7B)."""
    h, d = cfg.temporal_config, cfg.depformer_config
    D, dim = h.hidden_size, d.hidden_size
    shapes = temporal_tensors(cfg)
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


def helium_plan(cfg: PersonaPlexConfig) -> dict[str, WeightPlan]:
    """What each Helium parameter is made of, in checkpoint terms (module name -> plan)."""
    return temporal_plan(cfg, expected_lm_tensors(cfg))


def temporal_plan(cfg, shapes: Shapes) -> dict[str, WeightPlan]:
    """The plan of a Helium-style temporal transformer whose checkpoint holds `shapes` in
    moshi's names: PersonaPlex's, or a Kyutai STT model's (`cfg` a PersonaPlexConfig or a
    TranscriberConfig)."""
    h = cfg.temporal_config
    n, rows, D = cfg.num_audio_codebooks, cfg.audio_vocab_size + 1, h.hidden_size
    plan = {"text_emb": WeightPlan.whole("text_emb.weight", shapes["text_emb.weight"]),
            # the 16 audio tables stacked [16, card + 1, D]: one after another in memory
            "audio_emb": WeightPlan(tuple(Segment(f"emb.{k}.weight") for k in range(n)),
                                    (n, rows, D))}
    for key in ("out_norm.alpha", "text_linear.weight"):
        plan[key] = WeightPlan.whole(key, shapes[key])
    for i in range(h.num_hidden_layers):
        src, dst = f"transformer.layers.{i}", f"layers.{i}"
        for a, b in (("self_attn.in_proj_weight", "self_attn.in_proj.weight"),
                     ("self_attn.out_proj.weight", "self_attn.out_proj.weight"),
                     ("gating.linear_in.weight", "gating.linear_in.weight"),
                     ("gating.linear_out.weight", "gating.linear_out.weight"),
                     ("norm1.alpha", "norm1.alpha"), ("norm2.alpha", "norm2.alpha")):
            plan[f"{dst}.{b}"] = WeightPlan.whole(f"{src}.{a}", shapes[f"{src}.{a}"])
    return plan


def depformer_plan(cfg: PersonaPlexConfig) -> dict[str, WeightPlan]:
    """The same for the depformer's active steps: step k's attention weights are rows
    k * 3 * dim .. (k + 1) * 3 * dim of the packed `in_proj_weight` (and k * dim .. of
    `out_proj.weight`); the inactive steps' rows are never read."""
    d, shapes = cfg.depformer_config, expected_lm_tensors(cfg)
    dim, steps = d.hidden_size, d.num_active_codebooks
    plan = {"text_emb": WeightPlan.whole("depformer_text_emb.weight",
                                         shapes["depformer_text_emb.weight"])}
    for k in range(steps):
        for key in (f"depformer_in.{k}.weight", f"linears.{k}.weight"):
            plan[key] = WeightPlan.whole(key, shapes[key])
    for k in range(steps - 1):
        key = f"depformer_emb.{k}.weight"
        plan[f"audio_emb.{k}"] = WeightPlan.whole(key, shapes[key])
    for j in range(d.num_hidden_layers):
        src, dst = f"depformer.layers.{j}", f"layers.{j}"
        for k in range(steps):
            plan[f"{dst}.in_projs.{k}.weight"] = WeightPlan(
                (Segment(f"{src}.self_attn.in_proj_weight", k * 3 * dim, (k + 1) * 3 * dim),),
                (3 * dim, dim))
            plan[f"{dst}.out_projs.{k}.weight"] = WeightPlan(
                (Segment(f"{src}.self_attn.out_proj.weight", k * dim, (k + 1) * dim),),
                (dim, dim))
            for name in ("linear_in.weight", "linear_out.weight"):
                key = f"{src}.gating.{k}.{name}"
                plan[f"{dst}.gating.{k}.{name}"] = WeightPlan.whole(key, shapes[key])
        for name in ("norm1.alpha", "norm2.alpha"):
            plan[f"{dst}.{name}"] = WeightPlan.whole(f"{src}.{name}", shapes[f"{src}.{name}"])
    return plan


def _materialize(tf: TensorFile, plans: dict[str, WeightPlan]) -> dict[str, torch.Tensor]:
    """Every plan as a float32 tensor read through safetensors (the in-memory path)."""
    out, last = {}, (None, None)  # the packed depformer tensors are sliced step after step
    for name, plan in plans.items():
        parts = []
        for s in plan.segments:
            if last[0] != s.key:
                last = (s.key, tf.get(s.key))
            parts.append(last[1][s.start:s.stop])
        # clone: a slice would keep the whole packed tensor alive
        out[name] = (torch.cat(parts) if len(parts) > 1 else parts[0].clone()).reshape(plan.shape)
    return out


def load_lm(path: str | Path, cfg: PersonaPlexConfig) -> tuple[Helium, Depformer]:
    """Helium and the depformer in float32 from a checkpoint, after checking every tensor."""
    tf = open_lm_checkpoint(path, cfg)
    with torch.device("meta"):  # no throwaway initial weights: the loaded tensors are assigned
        helium, depformer = Helium(cfg), Depformer(cfg)
    helium.load_state_dict(_materialize(tf, helium_plan(cfg)), strict=True, assign=True)
    helium.make_buffers()
    depformer.load_state_dict(_materialize(tf, depformer_plan(cfg)), strict=True, assign=True)
    return helium.eval(), depformer.eval()


# ---- graphs ----------------------------------------------------------------------------------------

def sampler_k_max(k_max: int, vocab: int) -> int:
    """The sampler's largest top-k for a vocabulary: `k_max`, or the whole vocabulary where it
    is smaller (a small checkpoint's text vocabulary)."""
    return min(k_max, vocab)


def helium_inputs(cfg: PersonaPlexConfig, batch: int, k_max: int) -> list[TensorSpec]:
    h = cfg.temporal_config
    k_max = sampler_k_max(k_max, cfg.text_vocab_size)
    specs = [TensorSpec(TOKENS, (batch, 1, NUM_STREAMS), "int64"),  # [B, F, 17]
             TensorSpec(EXTRA_EMBEDDING, (batch, 1, h.hidden_size), "float32"),  # [B, F, D]
             TensorSpec(POSITION, (batch,), "int64"),
             TensorSpec(TEXT_NOISE, (batch, k_max), "float32"),
             TensorSpec(TEXT_TEMPERATURE, (batch,), "float32"),
             TensorSpec(TEXT_TOP_K, (batch,), "int64")]
    return specs + kv_ring_specs(cfg, batch)


def kv_ring_specs(cfg: PersonaPlexConfig, batch: int) -> list[TensorSpec]:
    """The KV ring inputs of helium_step, in graph order; the runtime owns these buffers
    (zeros at the start; what unwritten slots hold does not matter, they are masked)."""
    h = cfg.temporal_config
    shape = (batch, h.num_attention_heads, h.max_position_embeddings, h.head_dim)
    return [TensorSpec(kv_input(i, kind), shape, "float32")
            for i in range(h.num_hidden_layers) for kind in KV_KINDS]


def frames_axes(cfg: PersonaPlexConfig) -> dict[str, dict[int, str]]:
    """helium_step's free frames axis: the tokens and extra embedding of F frames in, F new
    K/V rows per layer out. The manifest records the live step's F = 1."""
    axes = {TOKENS: {1: FRAMES_AXIS}, EXTRA_EMBEDDING: {1: FRAMES_AXIS}}
    for i in range(cfg.temporal_config.num_hidden_layers):
        for kind in KV_KINDS:
            axes[kv_output(i, kind)] = {2: FRAMES_AXIS}
    return axes


def with_frames(specs: list[TensorSpec], frames: int) -> list[TensorSpec]:
    """helium_step's input specs for a call over `frames` frames."""
    return [TensorSpec(s.name, (s.shape[0], frames, *s.shape[2:]), s.dtype)
            if s.name in (TOKENS, EXTRA_EMBEDDING) else s for s in specs]


def helium_outputs(cfg: PersonaPlexConfig) -> list[str]:
    return [TEXT_TOKEN, HIDDEN] + [kv_output(i, kind)
                                   for i in range(cfg.temporal_config.num_hidden_layers)
                                   for kind in KV_KINDS]


def depformer_inputs(cfg: PersonaPlexConfig, batch: int, k_max: int) -> list[TensorSpec]:
    steps = cfg.depformer_config.num_active_codebooks
    k_max = sampler_k_max(k_max, cfg.audio_vocab_size)
    return [TensorSpec(HIDDEN, (batch, cfg.temporal_config.hidden_size), "float32"),
            TensorSpec(TEXT_TOKEN, (batch,), "int64"),
            TensorSpec(AUDIO_NOISE, (batch, steps, k_max), "float32"),
            TensorSpec(AUDIO_TEMPERATURE, (batch,), "float32"),
            TensorSpec(AUDIO_TOP_K, (batch,), "int64")]


def trace_inputs(specs: list[TensorSpec], cfg: PersonaPlexConfig,
                 ) -> list[tuple[TensorSpec, torch.Tensor]]:
    """What a graph is traced on: example_inputs, but each KV ring a zero expanded to its shape
    (no memory: a trace records shapes, not values; the 7B's ring is 3.1 GB of float32)."""
    examples = example_inputs([s for s in specs if not s.name.startswith(KV_INPUT_PREFIX)], cfg)
    return [(s, torch.from_numpy(examples[s.name]) if s.name in examples
             else torch.zeros((), dtype=torch.float32).expand(s.shape)) for s in specs]


def example_inputs(specs: list[TensorSpec], cfg: PersonaPlexConfig, seed: int = 0,
                   ) -> dict[str, np.ndarray]:
    """Non-trivial inputs for tracing and for the export check: random ring contents, a position
    past the context (the ring has wrapped), real Gumbel noise, a top-k that masks."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for s in specs:
        if s.name == TOKENS:
            vocab = np.array([cfg.text_vocab_size] + [cfg.audio_vocab_size] * (s.shape[-1] - 1))
            t = rng.integers(0, vocab + 1, size=s.shape)
            t[..., -1] = -1  # one stream contributing nothing
            out[s.name] = t.astype(np.int64)
        elif s.name == POSITION:
            past_context = cfg.temporal_config.max_position_embeddings + 3  # the ring wrapped
            out[s.name] = np.full(s.shape, past_context, np.int64)
        elif s.name == TEXT_TOKEN:
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
    jobs = [(HELIUM_STEP, helium, helium.step, helium_inputs(cfg, batch, k_max),
             helium_outputs(cfg)),
            (DEPFORMER_STEP, depformer, depformer.step, depformer_inputs(cfg, batch, k_max),
             [AUDIO_TOKENS])]
    for name, owner, fn, specs, outputs in jobs:
        examples = example_inputs(specs, cfg)
        path = out_dir / f"{name}.onnx"
        step = (lambda *args, _fn=fn: (_fn(*args[:-1]), {}))  # no StateSpec state
        entries[name] = export_step(
            owner, step, [(s, torch.from_numpy(examples[s.name])) for s in specs], outputs, [],
            path, dynamic_axes=frames_axes(cfg) if name == HELIUM_STEP else None)
        if verify:
            for more in _frame_counts(name):
                verify_step(path, step, example_inputs(with_frames(specs, more), cfg), outputs)
    return entries


def _frame_counts(graph: str) -> tuple[int, ...]:
    """The calls each graph is checked at: helium_step live (1 frame) and as a prefill (3)."""
    return (1, 3) if graph == HELIUM_STEP else (1,)


# ---- the memory-frugal export --------------------------------------------------------------------
# The graphs are traced on modules whose parameters are placeholders of the right shape that share
# one buffer (placeholder_lm), then each weight is written from the checkpoint into the
# graph's external data (frugal.py). The check against torch runs the real weights through the
# same modules, loading each Helium layer just before it runs and dropping it after, while
# onnxruntime holds the one full copy.

def _set_parameter(module: nn.Module, name: str, value: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    setattr(module.get_submodule(owner) if owner else module, leaf,
            nn.Parameter(value, requires_grad=False))


def placeholder_lm(cfg: PersonaPlexConfig) -> tuple[Helium, Depformer]:
    """Helium and the depformer with placeholder weights (placeholder_modules)."""
    helium, depformer = placeholder_modules([lambda: Helium(cfg), lambda: Depformer(cfg)])
    return helium, depformer


def placeholder_modules(factories: list[Callable[[], nn.Module]]) -> list[nn.Module]:
    """Modules with placeholder weights: traceable, with the real shapes, in the memory of the
    largest one. Every placeholder is a zero view of one shared buffer; contiguous on purpose:
    the tracer keeps alive the contiguous copy an op makes of a strided weight (an expanded
    scalar, say), which would add up to the whole model."""
    with torch.device("meta"):
        modules = [make() for make in factories]
    for module in modules:
        if isinstance(module, Helium):
            module.make_buffers()
        params = list(module.named_parameters())
        buffer = torch.zeros(max(p.numel() for _, p in params))
        for name, p in params:
            _set_parameter(module, name, buffer[:p.numel()].view(p.shape))
    return [m.eval() for m in modules]


@contextmanager
def streamed_weights(module: nn.Module, plans: dict[str, WeightPlan], header: SafetensorsHeader,
                     streamed: list[str]) -> Iterator[None]:
    """Real weights in a placeholder module for the duration of a call. Parameters of the
    submodules named in `streamed` are loaded just before each runs and dropped after; the
    others for the whole call. Placeholders are back afterwards."""
    placeholders = dict(module.named_parameters())

    def load(names):
        for n in names:
            _set_parameter(module, n, read_parameter(plans[n], header))

    def drop(names):
        for n in names:
            _set_parameter(module, n, placeholders[n])

    groups = {sub: [n for n in plans if n.startswith(sub + ".")] for sub in streamed}
    resident = [n for n in plans if not any(n in g for g in groups.values())]
    hooks = []
    for sub, names in groups.items():
        m = module.get_submodule(sub)
        hooks.append(m.register_forward_pre_hook(lambda _m, _a, names=names: load(names)))
        hooks.append(m.register_forward_hook(lambda _m, _a, _o, names=names: drop(names)))
    try:
        load(resident)
        yield
    finally:
        for h in hooks:
            h.remove()
        drop(list(plans))


@contextmanager
def shared_weights(module: nn.Module, arrays: dict[str, np.ndarray]) -> Iterator[None]:
    """The arrays a traced graph is fed (`owner.<parameter name>` -> float32) as a placeholder
    module's parameters for the duration of a call, shared, not copied; placeholders are back
    afterwards."""
    placeholders = dict(module.named_parameters())
    try:
        for n in placeholders:
            _set_parameter(module, n, torch.from_numpy(arrays[f"owner.{n}"]))
        yield
    finally:
        for n, p in placeholders.items():
            _set_parameter(module, n, p)


def _streamed_parts(cfg: PersonaPlexConfig) -> tuple[list[str], list[str]]:
    """Submodules the check loads only while they run: each Helium layer and the text head;
    each depformer step's own projections and MLP (every one runs once per frame). Embedding
    tables and norms stay loaded for the call."""
    steps = range(cfg.depformer_config.num_active_codebooks)
    helium = [f"layers.{i}" for i in range(cfg.temporal_config.num_hidden_layers)] + ["text_linear"]
    depformer = [f"{kind}.{k}" for kind in ("depformer_in", "linears") for k in steps] + [
        f"layers.{j}.{kind}.{k}" for j in range(cfg.depformer_config.num_hidden_layers)
        for kind in ("in_projs", "out_projs", "gating") for k in steps]
    return helium, depformer


def lm_jobs(cfg: PersonaPlexConfig, batch: int, k_max: int = DEFAULT_K_MAX):
    """(name, module, step, input specs, output names, plans, streamed) per LM graph."""
    helium, depformer = placeholder_lm(cfg)
    h_streamed, d_streamed = _streamed_parts(cfg)
    return [(HELIUM_STEP, helium, helium.step, helium_inputs(cfg, batch, k_max),
             helium_outputs(cfg), helium_plan(cfg), h_streamed),
            (DEPFORMER_STEP, depformer, depformer.step, depformer_inputs(cfg, batch, k_max),
             [AUDIO_TOKENS], depformer_plan(cfg), d_streamed)]


def _check_bytes(plans: dict[str, WeightPlan], specs: list[TensorSpec],
                 streamed: list[str]) -> int:
    """Memory the full check of one graph needs: onnxruntime's copy of the weights, the example
    inputs (the KV ring), the resident weights and the largest streamed group on the torch
    side, and ~1 GB for the interpreter, placeholders and transients."""
    groups = [sum(p.nbytes for n, p in plans.items() if n.startswith(sub + "."))
              for sub in streamed]
    resident = sum(p.nbytes for n, p in plans.items()
                   if not any(n.startswith(sub + ".") for sub in streamed))
    inputs = sum(8 * math.prod(s.shape) if s.dtype == "int64" else 4 * math.prod(s.shape)
                 for s in specs)
    return sum(p.nbytes for p in plans.values()) + inputs + resident + max(groups, default=0) \
        + (1 << 30)


def full_check_fits(job) -> tuple[bool, int, int | None]:
    """Whether the full check of an LM graph (check_lm_graph) fits in the memory available
    now: (fits, bytes it needs, bytes available or None where unknown)."""
    _, _, _, specs, _, plans, streamed = job
    need, have = _check_bytes(plans, specs, streamed), available_memory()
    return have is None or need <= have, need, have


def checked_header(path: str | Path, expected: Shapes, what: str) -> SafetensorsHeader:
    """A checkpoint's header in moshi's names, every tensor's name and shape checked against
    `expected` and the file against its declared length (nothing read but the header)."""
    header = SafetensorsHeader(path, rename=_canonical_key)
    check_tensors(header, expected, what=what)
    header.check_complete()
    return header


def open_lm_header(checkpoint_path: str | Path, cfg: PersonaPlexConfig) -> SafetensorsHeader:
    return checked_header(checkpoint_path, expected_lm_tensors(cfg), "PersonaPlex LM")


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), None elsewhere."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _probe_config(cfg):
    """The same model with one layer in each transformer: every kind of weight at full width."""
    if not isinstance(cfg, PersonaPlexConfig):  # a transcriber: one transformer
        return dataclasses.replace(cfg, temporal_config=dataclasses.replace(
            cfg.temporal_config, num_hidden_layers=1))
    d = cfg.to_dict()
    d["temporal_config"]["num_hidden_layers"] = 1
    d["depformer_config"]["num_hidden_layers"] = 1
    return PersonaPlexConfig.from_dict(d)


def _ring_names(name: str, cfg: PersonaPlexConfig) -> tuple[list[str], list[str]]:
    """(ring inputs, row outputs) of an LM graph: the KV ring of helium_step (and of the
    transcriber's step), none elsewhere."""
    if name not in RING_GRAPHS:
        return [], []
    layers = range(cfg.temporal_config.num_hidden_layers)
    return ([kv_input(i, kind) for i in layers for kind in KV_KINDS],
            [kv_output(i, kind) for i in layers for kind in KV_KINDS])


def _export_graph(job, header: SafetensorsHeader, out_dir: Path, cfg: PersonaPlexConfig,
                  check: bool, progress: Callable[[str], None],
                  plan: PrecisionPlan | None = None) -> tuple[GraphEntry, onnx.ModelProto]:
    """Traces one graph on placeholders and writes it with its weights in `plan`'s precision
    (None: float32), straight from the checkpoint (lm_weights.py). With `check`, the float32
    graph first runs once in onnxruntime beside the torch module, its weights fed from memory.
    Returns its entry (KV rings split out, in the plan's dtype) and the weightless trace."""
    from .precision import planned_entry

    name, owner, fn, specs, outputs, plans, streamed = job
    path = out_dir / f"{name}.onnx"
    sources = checkpoint_sources(plans, header)
    rings = _ring_names(name, cfg)
    kept: dict = {}
    t0 = time.perf_counter()

    def weights(p):
        trace = kept["trace"] = onnx.load(str(p))  # small: the parameters are inputs
        progress(f"  {name}.onnx: traced ({time.perf_counter() - t0:.0f} s)")
        if check:
            t1 = time.perf_counter()
            kept["check"] = check_lm_graph(p, job, header, cfg, weights=made(sources))
            progress(f"  {name}.onnx: the float32 graph checked in onnxruntime against torch "
                     f"({time.perf_counter() - t1:.0f} s)")
        g = final_graph(trace, p, sources, plan, rings)
        what = "fp32" if plan is None else plan.precision
        progress(f"  {name}.onnx: writing its {g.stored_bytes() / 1e9:.2f} GB of weights "
                 f"({what}) from the checkpoint")
        t1 = time.perf_counter()
        files = write_graph(g, p, progress)
        progress(f"  {name}.onnx: written ({time.perf_counter() - t1:.0f} s)")
        return files

    def traced(*args):
        return fn(*args[:-1]), {}  # no StateSpec state

    entry = export_step(owner, traced, trace_inputs(specs, cfg), outputs, [], path,
                        weights=weights,
                        dynamic_axes=frames_axes(cfg) if name == HELIUM_STEP else None)
    entry.check = kept.get("check")
    entry = entry.split_rings()
    if plan is not None:
        entry = planned_entry(entry, plan, path, entry.data_files)
    return entry, kept["trace"]


def check_lm_graph(path: Path, job, header: SafetensorsHeader, cfg: PersonaPlexConfig,
                   atol: float | None = CHECK_ATOL,
                   weights: dict[str, np.ndarray] | None = None) -> dict:
    """The check of an LM graph against the torch module of `job` (lm_jobs): run in
    onnxruntime beside it, live (1 frame) and as a prefill (3 frames), on the seeded example
    inputs. A graph written at `path` with its weights runs beside the module with the
    checkpoint's weights streamed in through torch's own conversion (verify --checkpoint); a
    graph traced there without its weights runs on `weights` (onnx_export.verify_step), which
    the module then shares (no second copy: the export's spot check ties the written weights
    to torch's conversion). Returns the record of what it measured (GraphEntry.check); raises
    ExportMismatch beyond `atol`."""
    name, owner, fn, specs, outputs, plans, streamed = job

    def checked(*args):
        with (shared_weights(owner, weights) if weights is not None
              else streamed_weights(owner, plans, header, streamed)):
            return fn(*args[:-1]), {}

    measured: dict[str, float] = {}
    for frames in _frame_counts(name):
        figures = verify_step(path, checked, example_inputs(with_frames(specs, frames), cfg),
                              outputs, low_memory=True, atol=atol, weights=weights)
        for output, value in figures.items():
            measured[output] = max(measured.get(output, 0.0), value)
    return {"how": "full", "calls": len(_frame_counts(name)), "outputs": measured}


def spot_check_weights(path: str | Path, plans: dict[str, WeightPlan],
                       header: SafetensorsHeader, build=None) -> int:
    """Three output channels (the first, a middle and the last row) of every weight stored in
    the LM graph at `path`, made again from the checkpoint, against the graph's data file
    (lm_weights.spot_check). `build` makes the graph's weights from sources (lm_weights.
    final_graph for a converted graph); by default the graph is float32 as traced. Catches a
    wrong offset, order, slice or conversion in any tensor without reading the weights again.
    Returns the parameter rows compared."""
    return spot_check(path, build or stored_build(path), plans, header)


def export_lm_graphs_frugal(cfg: PersonaPlexConfig, checkpoint_path: str | Path,
                            out_dir: str | Path, batch: int = 1, k_max: int = DEFAULT_K_MAX,
                            verify: bool | str = "auto",
                            progress: Callable[[str], None] = lambda s: None,
                            precisions: dict[str, PrecisionPlan] | None = None,
                            jobs: Callable = lm_jobs, open_header: Callable = open_lm_header,
                            ) -> dict[str, GraphEntry]:
    """export_lm_graphs' graphs, written without holding the model in memory and without a
    float32 copy on disk: each weight goes from the checkpoint to `<graph>.onnx.data` in its
    final precision (`precisions`: graph name -> PrecisionPlan, precision_plan.lm_plans; float32
    where absent), tensor by tensor (lm_weights.py). Returns the entries, rings split out.

    The check (`verify`) of each graph, before anything is returned:
      "full" (or True)  the float32 graph runs once in onnxruntime beside the torch modules on
                        the real weights, fed from memory and shared with torch (peak memory:
                        one float32 copy of the graph and the example KV ring), then every
                        written weight is spot-checked
      "reduced"         for a graph too large to run in this machine's memory: a one-layer
                        probe of the same graph (every kind of weight, at full width) is checked
                        the same way, and every written weight is spot-checked
                        (spot_check_weights)
      "auto"            "full" where it fits in the available memory, else "reduced"
      "off" (or False)  nothing

    `jobs` and `open_header` say which graphs and checkpoint: the LM's by default, the
    transcriber's (export/transcriber.py) otherwise.
    """
    mode = {True: "full", False: "off"}.get(verify, verify)
    if mode not in ("full", "reduced", "auto", "off"):
        raise ValueError(f"verify={verify!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header = open_header(checkpoint_path, cfg)
    precisions = precisions or {}
    entries = {}
    for job in jobs(cfg, batch, k_max):
        name, plans = job[0], job[5]
        check = mode
        if mode == "auto":
            fits, need, have = full_check_fits(job)
            check = "full" if fits else "reduced"
            if check == "reduced":
                progress(f"  {name}: a full check needs ~{need / 1e9:.1f} GB, "
                         f"{have / 1e9:.1f} GB is available: checking a one-layer probe "
                         "and spot-checking every weight instead")
        if check == "reduced":
            t0 = time.perf_counter()
            progress(f"  {name}: checking a one-layer probe in onnxruntime against torch")
            probe_cfg = _probe_config(cfg)
            probe = next(j for j in jobs(probe_cfg, batch, k_max) if j[0] == name)
            with tempfile.TemporaryDirectory(prefix=f".probe_{name}", dir=out_dir) as tmp:
                probed = _check_only(probe, header, Path(tmp), probe_cfg)
            progress(f"  {name}: probe checked ({time.perf_counter() - t0:.0f} s)")
        entries[name], trace = _export_graph(job, header, out_dir, cfg, check == "full",
                                             progress, precisions.get(name))
        if check == "off":
            continue
        path = out_dir / entries[name].file
        rows = spot_check_weights(path, plans, header, build=lambda sources: final_graph(
            trace, path, sources, precisions.get(name), _ring_names(name, cfg)))
        if check == "full":
            entries[name].check["weight_rows_compared"] = rows
            progress(f"  {name}.onnx: checked in onnxruntime against torch, {rows} weight rows "
                     "spot-checked against the checkpoint")
        else:
            entries[name].check = {**probed, "how": "one-layer probe",
                                   "weight_rows_compared": rows}
            progress(f"  {name}.onnx: one-layer probe checked in onnxruntime against torch, "
                     f"{rows} weight rows spot-checked against the checkpoint")
    return entries


def trace_weightless(job, cfg: PersonaPlexConfig, out_dir: Path) -> Path:
    """The graph of `job` traced into `out_dir` with its parameters as inputs (small: no
    weights), as the export traces it first."""
    name, owner, fn, specs, outputs = job[:5]
    path = out_dir / f"{name}.onnx"
    trace_step(owner, lambda *args: (fn(*args[:-1]), {}), trace_inputs(specs, cfg), outputs, [],
               path, weightless=True,
               dynamic_axes=frames_axes(cfg) if name == HELIUM_STEP else None)
    return path


def _check_only(job, header: SafetensorsHeader, out_dir: Path, cfg: PersonaPlexConfig) -> dict:
    """The in-memory check of a graph that is not written (the one-layer probe): traced
    weightless into `out_dir`, run fed from memory beside its torch module."""
    path = trace_weightless(job, cfg, out_dir)
    return check_lm_graph(path, job, header, cfg,
                          weights=made(checkpoint_sources(job[5], header)))


def converted_weights_check(job, path: Path, plan: PrecisionPlan, header: SafetensorsHeader,
                            cfg: PersonaPlexConfig) -> dict:
    """A graph stored in `plan`'s precision (an export's, or convert_model_dir's) against the
    checkpoint: the graph traced again without its weights, its weights laid out by `plan`
    (nothing made yet) and, where that is the stored layout, every stored weight spot-checked
    against what the checkpoint makes through the same conversion (spot_check_weights).
    Returns a record with "compared": False and the reason where the layouts differ (another
    block size than this version writes, or a torch that traces other names); raises
    ExportMismatch where a weight differs."""
    name, plans = job[0], job[5]
    stored = {t.name: (t.data_type, list(t.dims))
              for t in onnx.load(str(path), load_external_data=False).graph.initializer}
    with tempfile.TemporaryDirectory(prefix=f".trace_{name}") as tmp:
        trace = onnx.load(str(trace_weightless(job, cfg, Path(tmp))))
    rings = _ring_names(name, cfg)
    unmade = {key: (lambda: None) for key in checkpoint_sources(plans, header)}
    layout = final_graph(trace, path, unmade, plan, rings)
    want = {n: (layout.inits[n].data_type, list(layout.inits[n].dims)) for n in layout.lazy}
    differ = sorted(n for n in want if stored.get(n) != want[n])
    if differ:
        return {"how": "weight spot check", "calls": 0, "compared": False,
                "detail": f"not compared: {len(differ)} of its {len(want)} weights are not "
                f"laid out as this version writes {plan.precision} (e.g. {differ[0]}: stored "
                f"{stored.get(differ[0])}, made {want[differ[0]]})"}
    rows = spot_check_weights(path, plans, header, build=lambda sources: final_graph(
        trace, path, sources, plan, rings))
    return {"how": f"weight spot check in {plan.precision}", "calls": 0,
            "weight_rows_compared": rows}
