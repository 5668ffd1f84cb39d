"""Mimi's encoder/decoder transformer (25 Hz), streaming with explicit state and KV rings.

Each attention layer reads a ring of `window` keys and values (slot = position % window, keys
already rotated by RoPE at their absolute position) and returns only the call's T new rows,
which the runtime writes into the ring afterwards; the ring itself is never copied. The mask
reproduces the reference's ring cache, which writes the T new rows before attending: the call
sees the last `window` keys after the append, so once the window is full the first query of a
frame no longer sees the key that the second step's write pushes out. State: `offset` (steps seen
so far, int64 [B]); rings: per layer `key`/`value` [B, H, window, Dh].
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn
from torch.nn import functional as F

from personaplex_edge.config import PersonaPlexMimiConfig
from personaplex_edge.contract import KV_KINDS, MIMI_RING_PREFIX, MIMI_ROWS_PREFIX, state_input
from personaplex_edge.manifest import RingSpec, StateSpec

from .ring_slots import newest_positions
from .streaming import State, Stateful


def rope_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """[Dh/2] angular frequencies, computed as the reference computes them (float32)."""
    ds = torch.arange(head_dim // 2, dtype=torch.float32)
    return torch.exp(ds * (-math.log(theta) * 2 / head_dim))


def rope_tables(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """angles [..., Dh/2] -> (cos, sin) [..., Dh] laid out for interleaved pairs: each pair's
    cos twice, and its sin negated on the pair's first element. Built once per call of a
    transformer, shared by every layer."""
    cos, sin = torch.cos(angles), torch.sin(angles)
    return (torch.stack([cos, cos], dim=-1).flatten(-2),
            torch.stack([-sin, sin], dim=-1).flatten(-2))


@functools.lru_cache(maxsize=None)
def _pair_swap(head_dim: int) -> torch.Tensor:
    """[1, 0, 3, 2, ...]: exchanges the two elements of each interleaved pair."""
    return torch.arange(head_dim).reshape(-1, 2).flip(-1).reshape(-1)  # [Dh]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates interleaved pairs (re, im) of x [B, H, T, Dh] by the angles whose rope_tables
    are cos/sin [B, 1, T, Dh]. x * cos + swap(x) * sin forms re*cos + im*(-sin) and
    im*cos + re*sin: the same products and sums as (re*cos - im*sin, re*sin + im*cos), so the
    same bits, in 4 graph ops instead of a dozen slices, squeezes and stacks per call."""
    return x * cos + torch.index_select(x, -1, _pair_swap(x.shape[-1])) * sin




class WindowAttention(Stateful):
    def __init__(self, dim: int, num_heads: int, window: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.window = window
        self.in_proj = nn.Linear(dim, 3 * dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def own_state(self, batch: int) -> list[StateSpec]:
        return []

    def own_rings(self, batch: int, rows: int, position: str) -> list[RingSpec]:
        shape = (batch, self.num_heads, self.window, self.head_dim)
        return [RingSpec(f"{MIMI_RING_PREFIX}{self.state_key}.{kind}",
                         f"{MIMI_ROWS_PREFIX}{self.state_key}.{kind}", shape, "float32", 2,
                         position, rows) for kind in KV_KINDS]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                ring_visible: torch.Tensor, new_visible: torch.Tensor,
                state: State) -> tuple[torch.Tensor, State]:
        B, T, D = x.shape
        H, Dh = self.num_heads, self.head_dim
        qkv = self.in_proj(x).reshape(B, T, 3, H, Dh).permute(2, 0, 3, 1, 4)  # [3, B, H, T, Dh]
        q = apply_rope(qkv[0], cos, sin)
        k = apply_rope(qkv[1], cos, sin)
        v = qkv[2]
        ring_k = state[f"{MIMI_RING_PREFIX}{self.state_key}.key"]  # [B, H, W, Dh]
        ring_v = state[f"{MIMI_RING_PREFIX}{self.state_key}.value"]
        scale = Dh ** -0.5
        scores = torch.cat([torch.matmul(q, ring_k.transpose(2, 3)),  # [B, H, T, W]
                            torch.matmul(q, k.transpose(2, 3))], dim=-1) * scale  # [B, H, T, W+T]
        # the mask as an additive 0 / -inf (exactly masked_fill's result): a concatenation of
        # booleans has no WebGPU kernel and would run on the host
        hidden = torch.tensor(float("-inf"))
        mask = torch.cat([torch.where(ring_visible, 0.0, hidden),
                          torch.where(new_visible, 0.0, hidden)], dim=-1)  # [B, 1, T, W+T]
        probs = torch.softmax(scores + mask, dim=-1)
        out = (torch.matmul(probs[..., :self.window], ring_v)
               + torch.matmul(probs[..., self.window:], v))  # [B, H, T, Dh]
        out = self.out_proj(out.transpose(1, 2).reshape(B, T, D))
        return out, {f"{MIMI_ROWS_PREFIX}{self.state_key}.key": k,
                     f"{MIMI_ROWS_PREFIX}{self.state_key}.value": v}


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

    def forward(self, x, cos, sin, ring_visible, new_visible,
                state: State) -> tuple[torch.Tensor, State]:
        update, new = self.self_attn(self.norm1(x), cos, sin, ring_visible, new_visible, state)
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

    def rings(self, batch: int, rows: int) -> list[RingSpec]:
        position = state_input(f"{self.state_key}.offset")  # the ring position: the step offset
        return [spec for layer in self.layers
                for spec in layer.self_attn.own_rings(batch, rows, position)]

    def forward(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        B, C, T = x.shape
        W = self.window
        offset = state[f"{self.state_key}.offset"]  # [B]
        pos_q = offset[:, None] + torch.arange(T, dtype=torch.int64)  # [B, T]
        # ring slot j holds the newest position p_j < offset with p_j = j (mod W)
        pos_k = newest_positions(offset, W)  # [B, W]
        # visible: written (p >= 0) and still inside the window after this call's T rows land
        ring_visible = (pos_k >= 0) & (pos_k >= offset[:, None] + T - W)  # [B, W]
        ring_visible = ring_visible[:, None, None, :].expand(B, 1, T, W)  # [B, 1, T, W]
        new_visible = torch.tril(torch.ones(T, T, dtype=torch.bool))[None, None]  # [1, 1, T, T]
        new_visible = new_visible.expand(B, 1, T, T)
        angles = pos_q.to(torch.float32)[:, None, :, None] * self.freqs  # [B, 1, T, Dh/2]
        cos, sin = rope_tables(angles)  # [B, 1, T, Dh]
        h = x.transpose(1, 2)  # [B, T, C]
        new: State = {f"{self.state_key}.offset": offset + T}
        for layer in self.layers:
            h, changed = layer(h, cos, sin, ring_visible, new_visible, state)
            new.update(changed)
        return h.transpose(1, 2), new
