"""The LM test reference: moshi's LMModel with random weights, saved in the published layout.

Only tests and benchmarks import this. The model keeps PersonaPlex's stream layout (n_q 16,
dep_q 16, delays, per-step depformer weights, SiLU gating, float32 RMSNorm) at any width. Norm
weights are randomised too (moshi leaves them at 1, which would hide a wrong norm). Weights are
rounded through bf16, so the bf16 file and the float32 reference hold the same values.

Generation: with dep_q = 16, moshi's LMGen generates the user's streams too and takes no user
codes. Moshi-7B runs this very layout with dep_q = 8 (agent streams only, user codes fed in), and
that is the schedule this project follows, so `reference_lmgen` runs LMGen on a dep_q = 8 view
of the same weights (steps 8..15 are never run; they are dead compute at inference anyway).
"""

from __future__ import annotations

import os

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import re  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from personaplex_edge.config import PersonaPlexConfig  # noqa: E402
from personaplex_edge.streams import DELAYS, TEXT_PAD  # noqa: E402


def moshi_lm_kwargs(cfg: PersonaPlexConfig) -> dict:
    h, d = cfg.temporal_config, cfg.depformer_config
    # moshi sizes the gated MLP as 2/3 of dim_feedforward (when that is not exactly 4 * dim)
    ff, dep_ff = 3 * h.intermediate_size // 2, 3 * d.intermediate_size // 2
    assert ff != 4 * h.hidden_size and dep_ff != 4 * d.hidden_size
    return {
        "dim": h.hidden_size, "text_card": cfg.text_vocab_size,
        "existing_text_padding_id": TEXT_PAD, "n_q": cfg.num_audio_codebooks, "dep_q": d.dep_q,
        "card": cfg.audio_vocab_size, "num_heads": h.num_attention_heads,
        "num_layers": h.num_hidden_layers, "hidden_scale": ff / h.hidden_size, "causal": True,
        "layer_scale": None, "context": h.max_position_embeddings, "max_period": h.rope_theta,
        "gating": "silu", "norm": "rms_norm_f32", "positional_embedding": "rope",
        "depformer_dim": d.hidden_size, "depformer_dim_feedforward": dep_ff,
        "depformer_num_heads": d.num_attention_heads, "depformer_num_layers": d.num_hidden_layers,
        "depformer_layer_scale": None, "depformer_multi_linear": True,
        "depformer_context": d.dep_q, "depformer_max_period": d.rope_theta,
        "depformer_gating": "silu", "depformer_pos_emb": "none",
        "depformer_weights_per_step": True, "delays": list(DELAYS),
    }


@torch.no_grad()
def reference_lm(cfg: PersonaPlexConfig, seed: int = 0):
    """moshi's LMModel for `cfg` in float32 with random, bf16-representable weights."""
    from moshi.models.lm import LMModel

    torch.manual_seed(seed)
    model = LMModel(**moshi_lm_kwargs(cfg), device="cpu", dtype=torch.float32)
    randomise(model, torch.Generator().manual_seed(seed + 1))
    # moshi's sizing rule must land on the config's MLP widths
    assert model.transformer.layers[0].gating.linear_out.in_features == \
        cfg.temporal_config.intermediate_size
    assert model.depformer.layers[0].gating[0].linear_out.in_features == \
        cfg.depformer_config.intermediate_size
    return model.eval()


@torch.no_grad()
def randomise(model, gen: torch.Generator) -> None:
    """Norm gains in [0.5, 1.5) (moshi leaves them at 1, which would hide a wrong norm), and
    every weight rounded through bf16, so the bf16 file and the float32 model agree."""
    for name, p in model.named_parameters():
        if name.endswith(".alpha"):
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
        p.copy_(p.to(torch.bfloat16).float())


def published_state(model) -> dict[str, torch.Tensor]:
    """moshi's state_dict -> the published layout: per-step attention weights
    (`in_projs.{i}` / `out_projs.{i}`) concatenated over i into `in_proj_weight` /
    `out_proj.weight`, as the released checkpoint stores them."""
    state = model.state_dict()
    packed: dict[str, list[tuple[int, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        m = re.match(r"(.*\.self_attn)\.(in|out)_projs\.(\d+)\.weight$", key)
        if m:
            target = f"{m.group(1)}.in_proj_weight" if m.group(2) == "in" else \
                f"{m.group(1)}.out_proj.weight"
            packed.setdefault(target, []).append((int(m.group(3)), value))
        else:
            out[key] = value
    for target, parts in packed.items():
        out[target] = torch.cat([v for _, v in sorted(parts, key=lambda p: p[0])], dim=0)
    return out


def save_published_lm(model, path: str | Path, dtype=torch.bfloat16) -> Path:
    state = {k: v.detach().to(dtype).contiguous() if v.is_floating_point() else v.contiguous()
             for k, v in published_state(model).items()}
    save_file(state, str(path))
    return Path(path)


class _Recorder:
    """Per-step values of an LMGen run: text logits, normed hidden, sampled tokens."""

    def __init__(self, model):
        self.text_logits, self.hidden, self.text, self.audio = [], [], [], []
        model.out_norm.register_forward_hook(lambda m, i, o: self.hidden.append(o[:, 0].clone()))


@torch.no_grad()
def reference_lmgen(model, user_codes: torch.Tensor, active: int = 8) -> dict[str, torch.Tensor]:
    """Greedy streaming with moshi's LMGen, feeding user_codes [F, 8] one frame per step.
    Returns per step: text_logits [F, V], hidden [F, D], text [F], audio [F, active] (the
    depformer's raw tokens) and outputs [F, 1 + active] (-2 where LMGen returned nothing)."""
    from moshi.models.lm import LMGen

    full_dep_q = model.dep_q
    model.dep_q = active  # the agent-only view (see the module docstring)
    rec = _Recorder(model)
    gen = LMGen(model, use_sampling=False,
                on_text_logits_hook=lambda x: rec.text_logits.append(x[:, 0, 0].clone()),
                on_text_hook=lambda x: rec.text.append(x.clone()),
                on_audio_hook=lambda x: rec.audio.append(x.clone()))
    outputs = []
    try:
        with gen.streaming(1):
            for frame in user_codes:
                out = gen.step(frame[None, :, None])
                outputs.append(torch.full((1 + active,), -2, dtype=torch.long) if out is None
                               else out[0, :, 0])
    finally:
        model.dep_q = full_dep_q
        model.out_norm._forward_hooks.clear()
    return {"text_logits": torch.cat(rec.text_logits), "hidden": torch.cat(rec.hidden),
            "text": torch.cat(rec.text), "audio": torch.cat(rec.audio),
            "outputs": torch.stack(outputs)}
