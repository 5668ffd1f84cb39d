"""Mimi's encoder/decoder transformer (25 Hz), streaming with an explicit sliding KV window.

Each attention layer keeps its last `window` keys and values in time order, oldest first. A call
with T new steps appends them and keeps the last `window` (`cat(K, k_new)[..., T:]`), exactly what
the reference ring cache holds after writing: once the window is full the first query of a frame
no longer sees the key that the second step's write pushed out. Keys are stored already rotated
(RoPE at their absolute position), so nothing is recomputed. State: `offset` (steps seen so far,
int64 [B]) and per layer `key`/`value` [B, H, window, Dh].
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from personaplex_edge.config import PersonaPlexMimiConfig
from personaplex_edge.manifest import StateSpec

from .streaming import State, Stateful


def rope_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """[Dh/2] angular frequencies, computed as the reference computes them (float32)."""
    ds = torch.arange(head_dim // 2, dtype=torch.float32)
    return torch.exp(ds * (-math.log(theta) * 2 / head_dim))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates interleaved pairs (d0, d1), (d2, d3), ... of x [B, H, T, Dh] by angles whose cos and
    sin are [B, 1, T, Dh/2]."""
    B, H, T, D = x.shape
    pairs = x.reshape(B, H, T, D // 2, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    out = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1)
    return out.reshape(B, H, T, D)


class WindowAttention(Stateful):
    def __init__(self, dim: int, num_heads: int, window: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.window = window
        self.in_proj = nn.Linear(dim, 3 * dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def own_state(self, batch: int) -> list[StateSpec]:
        shape = (batch, self.num_heads, self.window, self.head_dim)
        return [StateSpec(f"{self.state_key}.key", shape, "float32"),
                StateSpec(f"{self.state_key}.value", shape, "float32")]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        B, T, D = x.shape
        H, Dh = self.num_heads, self.head_dim
        qkv = self.in_proj(x).reshape(B, T, 3, H, Dh).permute(2, 0, 3, 1, 4)  # [3, B, H, T, Dh]
        q = apply_rope(qkv[0], cos, sin)
        k = apply_rope(qkv[1], cos, sin)
        keys = torch.cat([state[f"{self.state_key}.key"], k], dim=2)[:, :, T:]  # [B, H, W, Dh]
        values = torch.cat([state[f"{self.state_key}.value"], qkv[2]], dim=2)[:, :, T:]
        scores = torch.matmul(q, keys.transpose(2, 3)) * (Dh ** -0.5)  # [B, H, T, W]
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), values)  # [B, H, T, Dh]
        out = self.out_proj(out.transpose(1, 2).reshape(B, T, D))
        return out, {f"{self.state_key}.key": keys, f"{self.state_key}.value": values}


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class TransformerLayer(nn.Module):
    def __init__(self, cfg: PersonaPlexMimiConfig):
        super().__init__()
        d = cfg.hidden_size
        self.norm1 = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.self_attn = WindowAttention(d, cfg.num_attention_heads, cfg.sliding_window)
        self.layer_scale_1 = LayerScale(d)
        self.norm2 = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.linear1 = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.linear2 = nn.Linear(cfg.intermediate_size, d, bias=False)
        self.layer_scale_2 = LayerScale(d)

    def forward(self, x, cos, sin, mask, state: State) -> tuple[torch.Tensor, State]:
        update, new = self.self_attn(self.norm1(x), cos, sin, mask, state)
        x = x + self.layer_scale_1(update)
        x = x + self.layer_scale_2(self.linear2(F.gelu(self.linear1(self.norm2(x)))))
        return x, new


class MimiTransformer(Stateful):
    """[B, C, T] -> [B, C, T] (conv layout in and out, as between the convolutions)."""

    def __init__(self, cfg: PersonaPlexMimiConfig):
        super().__init__()
        self.window = cfg.sliding_window
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.register_buffer("freqs", rope_frequencies(cfg.head_dim, cfg.rope_theta),
                             persistent=False)

    def own_state(self, batch: int) -> list[StateSpec]:
        return [StateSpec(f"{self.state_key}.offset", (batch,), "int64")]

    def forward(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        B, C, T = x.shape
        offset = state[f"{self.state_key}.offset"]  # [B]
        steps = torch.arange(T, dtype=torch.int64)
        pos_q = offset[:, None] + steps  # [B, T]
        # after the append, window slot j holds the key of step offset + T - W + j
        pos_k = offset[:, None] + (T - self.window) + torch.arange(self.window)  # [B, W]
        mask = (pos_k[:, None, :] >= 0) & (pos_k[:, None, :] <= pos_q[:, :, None])  # [B, T, W]
        mask = mask[:, None]  # [B, 1, T, W]
        angles = pos_q.to(torch.float32)[:, None, :, None] * self.freqs  # [B, 1, T, Dh/2]
        cos, sin = torch.cos(angles), torch.sin(angles)
        h = x.transpose(1, 2)  # [B, T, C]
        new: State = {f"{self.state_key}.offset": offset + T}
        for layer in self.layers:
            h, changed = layer(h, cos, sin, mask, state)
            new.update(changed)
        return h.transpose(1, 2), new
