"""SEANet convolutional encoder and decoder of Mimi, streaming with explicit state.

Layer indices mirror the checkpoint (`encoder.model.N`, `decoder.model.N`): activations take an
index too, so the weight names line up one for one.
"""

from __future__ import annotations

import torch
from torch import nn

from personaplex_edge.config import PersonaPlexMimiConfig

from .streaming import State, StreamConv1d, StreamConvTranspose1d


def _run(layers: nn.ModuleList, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
    new: State = {}
    for layer in layers:
        if isinstance(layer, (StreamConv1d, StreamConvTranspose1d, ResBlock)):
            x, changed = layer(x, state)
            new.update(changed)
        else:
            x = layer(x)
    return x, new


class ResBlock(nn.Module):
    """ELU -> conv k (dim -> dim/compress) -> ELU -> conv 1 (-> dim), plus identity skip."""

    def __init__(self, dim: int, kernel_size: int, dilation: int, compress: int):
        super().__init__()
        hidden = dim // compress
        self.block = nn.ModuleList([
            nn.ELU(), StreamConv1d(dim, hidden, kernel_size, dilation=dilation),
            nn.ELU(), StreamConv1d(hidden, dim, 1),
        ])

    def forward(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        y, new = _run(self.block, x, state)
        return x + y, new


def _res_blocks(cfg: PersonaPlexMimiConfig, dim: int) -> list[nn.Module]:
    return [ResBlock(dim, cfg.residual_kernel_size, cfg.dilation_growth_rate ** j, cfg.compress)
            for j in range(cfg.num_residual_layers)]


class SEANetEncoder(nn.Module):
    """pcm [B, 1, hop * T] -> latent [B, hidden, T]."""

    def __init__(self, cfg: PersonaPlexMimiConfig):
        super().__init__()
        f = cfg.num_filters
        layers: list[nn.Module] = [StreamConv1d(1, f, cfg.kernel_size)]
        mult = 1
        for ratio in reversed(cfg.upsampling_ratios):
            layers += _res_blocks(cfg, mult * f)
            layers += [nn.ELU(), StreamConv1d(mult * f, 2 * mult * f, 2 * ratio, stride=ratio)]
            mult *= 2
        layers += [nn.ELU(), StreamConv1d(mult * f, cfg.hidden_size, cfg.last_kernel_size)]
        self.model = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        return _run(self.model, x, state)


class SEANetDecoder(nn.Module):
    """latent [B, hidden, T] -> pcm [B, 1, hop * T]."""

    def __init__(self, cfg: PersonaPlexMimiConfig):
        super().__init__()
        f = cfg.num_filters
        mult = 2 ** len(cfg.upsampling_ratios)
        layers: list[nn.Module] = [StreamConv1d(cfg.hidden_size, mult * f, cfg.kernel_size)]
        for ratio in cfg.upsampling_ratios:
            layers += [nn.ELU(),
                       StreamConvTranspose1d(mult * f, mult * f // 2, 2 * ratio, stride=ratio)]
            layers += _res_blocks(cfg, mult * f // 2)
            mult //= 2
        layers += [nn.ELU(), StreamConv1d(f, 1, cfg.last_kernel_size)]
        self.model = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        return _run(self.model, x, state)
