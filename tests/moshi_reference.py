"""The test reference: Kyutai's `moshi` package, with random weights, saved in the real layout.

Only tests and benchmarks import this (moshi is a dev dependency installed with --no-deps).
Defaults would make the comparison vacuous: every centroid 0 (every code 0) and layer scales of
0.01 (transformers nearly bypassed). So codebooks, usages and layer scales are randomised too.
"""

from __future__ import annotations

import os

os.environ.setdefault("NO_TORCH_COMPILE", "1")

from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, Iterator  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from personaplex_edge.config import PersonaPlexMimiConfig  # noqa: E402


def moshi_mimi_kwargs(cfg: PersonaPlexMimiConfig) -> dict:
    seanet = {
        "channels": 1, "dimension": cfg.hidden_size, "causal": True,
        "n_filters": cfg.num_filters, "n_residual_layers": cfg.num_residual_layers,
        "activation": "ELU", "compress": cfg.compress, "dilation_base": cfg.dilation_growth_rate,
        "disable_norm_outer_blocks": 0, "kernel_size": cfg.kernel_size,
        "residual_kernel_size": cfg.residual_kernel_size,
        "last_kernel_size": cfg.last_kernel_size, "norm": "none", "pad_mode": "constant",
        "ratios": list(cfg.upsampling_ratios), "true_skip": True,
    }
    transformer = {
        "d_model": cfg.hidden_size, "num_heads": cfg.num_attention_heads,
        "num_layers": cfg.num_hidden_layers, "causal": True, "layer_scale": 0.01,
        "context": cfg.sliding_window, "conv_layout": True, "max_period": cfg.rope_theta,
        "gating": "none", "norm": "layer_norm", "positional_embedding": "rope",
        "dim_feedforward": cfg.intermediate_size, "input_dimension": cfg.hidden_size,
        "output_dimensions": [cfg.hidden_size],
    }
    quantizer = {"dimension": cfg.codebook_dim, "n_q": cfg.num_quantizers,
                 "bins": cfg.card, "input_dimension": cfg.hidden_size,
                 "output_dimension": cfg.hidden_size}
    return {"sample_rate": cfg.sample_rate, "channels": 1, "frame_rate": cfg.frame_rate,
            "seanet": seanet, "quantizer": quantizer, "transformer": transformer}


def reference_mimi(cfg: PersonaPlexMimiConfig, seed: int = 0):
    """moshi's MimiModel for `cfg`, randomised so that codes and transformers matter."""
    from moshi.models.loaders import get_mimi

    torch.manual_seed(seed)
    model = get_mimi(None, moshi_mimi_kwargs(cfg), num_codebooks=cfg.num_codebooks)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_scale_1.scale") or name.endswith("layer_scale_2.scale"):
                p.copy_(torch.rand(p.shape, generator=gen) * 0.5 + 0.25)
        for name, buf in model.named_buffers():
            if name.endswith("embedding_sum"):
                buf.copy_(torch.randn(buf.shape, generator=gen))
            elif name.endswith("cluster_usage"):
                buf.copy_(torch.rand(buf.shape, generator=gen) * 1.5 + 0.5)
            elif name.endswith("_initialized"):
                buf.fill_(1.0)
    draw_codebooks(model, gen)
    return model.eval()


@torch.no_grad()
def draw_codebooks(model, gen: torch.Generator, active: int | None = None,
                   spread: float = 1.0) -> None:
    """Centroids drawn around the latents they quantize, level by level (like a k-means
    initialisation), so that every codebook's codes spread out: `spread` x the residual's
    spread around its mean. With `active`, only the first `active` centroids of each level are
    near it, the others far away (a few clear choices per level)."""
    frame = int(model.sample_rate / model.frame_rate)
    probe = torch.randn(1, 1, 48 * frame, generator=gen)
    probe *= torch.linspace(0.02, 0.6, probe.shape[-1])
    latent = model._encode_to_unquantized_latent(probe)
    for rvq in (model.quantizer.rvq_first, model.quantizer.rvq_rest):
        residual = rvq.input_proj(latent).transpose(1, 2).reshape(-1, rvq.dimension)
        for layer in rvq.vq.layers:
            book = layer._codebook
            mean, std = residual.mean(0), residual.std(0)
            centroids = mean + spread * std * torch.randn(book.embedding_sum.shape,
                                                          generator=gen)
            if active is not None:
                far = torch.randn((centroids.shape[0] - active, centroids.shape[1]),
                                  generator=gen)
                centroids[active:] = mean + 1e3 * std * far
            book.embedding_sum.copy_(centroids * book.cluster_usage[:, None])
            book.register_buffer("_embedding", None, persistent=False)
            residual = residual - book.decode(book.encode(residual))


def published_key(key: str) -> str:
    """moshi's state_dict names -> the names in the published checkpoints."""
    key = key.replace(".self_attn.in_projs.0.weight", ".self_attn.in_proj_weight")
    return key.replace(".self_attn.out_projs.0.weight", ".self_attn.out_proj.weight")


def save_published(model: torch.nn.Module, path: str | Path, dtype=None) -> Path:
    state = {}
    for k, v in model.state_dict().items():
        v = v.detach().contiguous()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        state[published_key(k)] = v
    save_file(state, str(path))
    return Path(path)


@torch.no_grad()
def reference_stream(model, pcm: torch.Tensor, frame_size: int):
    """Streaming encode then decode, frame by frame: (codes [F, n], pcm out [F * frame])."""
    codes, outs = [], []
    frames = pcm.shape[-1] // frame_size
    with model.streaming(1):
        for i in range(frames):
            c = model.encode(pcm[None, None, i * frame_size:(i + 1) * frame_size])
            codes.append(c[0, :, 0])
    with model.streaming(1):
        for i in range(frames):
            outs.append(model.decode(codes[i][None, :, None])[0, 0])
    return torch.stack(codes), torch.cat(outs)


# ---- inputs without codebook near-ties ----------------------------------------------------------
# Random codebooks put some latents almost exactly between two centroids. The reference takes the
# nearest by a float32 cdist, we by our own float32 arithmetic: where the two distances agree to
# 1e-6 or so, the order of float32 rounding (which differs between CPUs' kernels) picks the code,
# and every later token of a conversation follows that choice. Such an input tests the CPU, not
# the port, so parity tests use inputs whose every codebook decision has a clear winner.
# (second nearest - nearest) / nearest. A flip was seen at 2.3e-6 (tiny Mimi, one CPU against
# another); at real size (256-dim codebooks) gaps run smaller, and above 1e-4 none of 40 inputs
# passed.
MIN_CODEBOOK_MARGIN = 1e-5


@contextmanager
def codebook_margins() -> Iterator[list[float]]:
    """Records, for every nearest-centroid decision moshi's codebooks make inside the block, the
    relative gap between the nearest and second-nearest centroid (in float64)."""
    from moshi.quantization.core_vq import EuclideanCodebook

    gaps: list[float] = []
    original = EuclideanCodebook._quantize

    def quantize(self, x):
        d = torch.cdist(x[None].double(), self.embedding[None].double())[0]  # [N, bins]
        two = torch.topk(d, 2, dim=-1, largest=False).values  # [N, 2]
        gaps.append(float(((two[:, 1] - two[:, 0]) / two[:, 0].clamp(min=1e-12)).min()))
        return original(self, x)

    EuclideanCodebook._quantize = quantize
    try:
        yield gaps
    finally:
        EuclideanCodebook._quantize = original


def tie_free(run: Callable[[np.ndarray], object], make_input: Callable[[int], np.ndarray],
             tries: int = 12):
    """(input, run(input)) for the first seed whose input `run` (anything that encodes it with a
    moshi Mimi) quantizes with every decision clear of a tie (MIN_CODEBOOK_MARGIN)."""
    worst = 0.0
    for seed in range(tries):
        pcm = make_input(seed)
        with codebook_margins() as gaps:
            result = run(pcm)
        margin = min(gaps)
        if margin >= MIN_CODEBOOK_MARGIN:
            return pcm, result
        worst = max(worst, margin)
    raise AssertionError(f"no input of {tries} quantizes clear of ties (best margin {worst:.2g})")
