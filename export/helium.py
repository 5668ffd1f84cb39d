"""Helium, the temporal transformer, as one step over F frames with its KV ring passed in
(F = 1 for every live frame; the persona prefill runs all its frames in one call, so a
bandwidth-bound device reads the weights once for the whole prompt instead of once per frame).

    x      = text_emb(tokens[..., 0]) + sum_k emb[k](tokens[..., 1 + k]) + extra  [B, F, D]
    x      = layers(x)          pre-norm attention + gated SiLU MLP, RMSNorm in float32
    hidden = out_norm(x)        what the depformer reads and text_linear turns into text logits
                                (of the last frame only)

KV ring: each layer's keys/values live in a ring of capacity T = context (max_position_embeddings)
owned by the caller: the key of absolute position p sits in slot p % T, already rotated (RoPE at p).
A step at positions pos..pos+F-1 receives the ring as it was before the step and returns only
its own new rows [B, H, F, Dh]; the caller writes row f into slot (pos + f) % T afterwards.
Nothing in the step copies the ring: the new rows are attended to separately (causally, among
themselves) and their scores join the ring's scores before the softmax.

Which slots frame f (at q = pos + f) sees: slot j holds the newest position p_j < pos with
p_j = j (mod T). It is valid iff p_j >= 0 (written at all) and q - p_j < T; for F = 1 the second
condition excludes exactly the slot pos % T, whose old row is about to be overwritten. With the
new rows that makes the last T positions for every frame, the same window as the reference's
ring cache (mask 0 <= pos_q - pos_k < T), for any position, however far past the context.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from personaplex_edge.config import HeliumConfig, PersonaPlexConfig

from .mimi_transformer import apply_rope, rope_frequencies, rope_tables
from .ring_slots import newest_positions
from .sampling import sample_top_k


class RMSNorm(nn.Module):
    """RMS normalisation computed in float32; weight `alpha` [1, 1, D] as in the checkpoint."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., D]
        x = x.float()
        var = self.eps + torch.mean(x * x, dim=-1, keepdim=True)  # [..., 1]
        return x * (self.alpha[0] * torch.rsqrt(var))


class GatedMLP(nn.Module):
    """silu(gate(x)) * up(x) -> down. `linear_in` holds the gate rows first, then the up rows."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear_in(x)  # [..., 2 * hidden]
        return self.linear_out(F.silu(h[..., :self.hidden]) * h[..., self.hidden:])


def embed(table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Rows of `table` [N, D] for tokens [...] int64; token -1 (and any negative) gives zeros."""
    rows = F.embedding(tokens.clamp(min=0), table)  # [..., D]
    return torch.where((tokens >= 0)[..., None], rows, torch.zeros_like(rows))


class RingAttention(nn.Module):
    def __init__(self, cfg: HeliumConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        d = cfg.hidden_size
        self.in_proj = nn.Linear(d, 3 * d, bias=False)  # rows: Q | K | V, head-major within each
        self.out_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                visible: torch.Tensor, causal: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, F, D]; cos/sin [B, 1, F, Dh] (rope_tables); visible [B, 1, F, T] bool (ring
        slots), causal [F, F] bool (the call's own frames); past_* [B, H, T, Dh]
        -> (update [B, F, D], new key rows [B, H, F, Dh], new value rows [B, H, F, Dh])."""
        B, Fr, D = x.shape[0], x.shape[1], x.shape[2]
        H, Dh = self.num_heads, self.head_dim
        qkv = self.in_proj(x).reshape(B, Fr, 3, H, Dh).permute(2, 0, 3, 1, 4)  # [3, B, H, F, Dh]
        q = apply_rope(qkv[0], cos, sin)  # [B, H, F, Dh]
        k = apply_rope(qkv[1], cos, sin)  # [B, H, F, Dh]
        v = qkv[2]  # [B, H, F, Dh]
        scale = Dh ** -0.5
        ring_scores = torch.matmul(q, past_key.transpose(2, 3)) * scale  # [B, H, F, T]
        ring_scores = ring_scores.masked_fill(~visible, float("-inf"))
        own_scores = torch.matmul(q, k.transpose(2, 3)) * scale  # [B, H, F, F]
        own_scores = own_scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(torch.cat([ring_scores, own_scores], dim=-1), dim=-1)  # [.., T+F]
        T = past_key.shape[2]
        out = torch.matmul(probs[..., :T], past_value) + torch.matmul(probs[..., T:], v)
        out = out.transpose(1, 2).reshape(B, Fr, D)  # [B, F, D]
        return self.out_proj(out), k, v


class HeliumLayer(nn.Module):
    def __init__(self, cfg: HeliumConfig):
        super().__init__()
        self.norm1 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = RingAttention(cfg)
        self.norm2 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gating = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, visible, causal, past_key, past_value):
        update, k, v = self.self_attn(self.norm1(x), cos, sin, visible, causal, past_key,
                                      past_value)
        x = x + update
        return x + self.gating(self.norm2(x)), k, v


class Helium(nn.Module):
    def __init__(self, cfg: PersonaPlexConfig):
        super().__init__()
        h = cfg.temporal_config
        self.cfg = cfg
        self.context = h.max_position_embeddings
        self.num_layers = h.num_hidden_layers
        self.text_emb = nn.Parameter(torch.zeros(cfg.text_embedding_rows, h.hidden_size))
        # all audio tables stacked so one gather fetches the 16 rows of a frame
        self.audio_emb = nn.Parameter(
            torch.zeros(cfg.num_audio_codebooks, cfg.audio_vocab_size + 1, h.hidden_size))
        self.layers = nn.ModuleList([HeliumLayer(h) for _ in range(h.num_hidden_layers)])
        self.out_norm = RMSNorm(h.hidden_size, h.rms_norm_eps)
        self.text_linear = nn.Linear(h.hidden_size, cfg.text_vocab_size, bias=False)
        self.make_buffers()

    def make_buffers(self) -> None:
        """(Re)creates the derived constants on the CPU, e.g. after building on the meta device."""
        h, cfg = self.cfg.temporal_config, self.cfg
        with torch.device("cpu"):
            self.register_buffer("freqs", rope_frequencies(h.head_dim, h.rope_theta),
                                 persistent=False)
            # row offset of each audio table inside the flattened stack
            self.register_buffer("table_offsets", torch.arange(cfg.num_audio_codebooks)
                                 * (cfg.audio_vocab_size + 1), persistent=False)

    def kv_shape(self, batch: int) -> tuple[int, int, int, int]:
        h = self.cfg.temporal_config
        return (batch, h.num_attention_heads, self.context, h.head_dim)

    def input_embedding(self, tokens: torch.Tensor, extra: torch.Tensor | None) -> torch.Tensor:
        """tokens [B, F, 1 + n] int64 (text, then n audio streams), extra [B, F, D] or None
        -> [B, F, D]."""
        audio = tokens[..., 1:]  # [B, F, n]
        flat = self.audio_emb.reshape(-1, self.audio_emb.shape[-1])  # [n * (card + 1), D]
        rows = embed(flat, torch.where(audio >= 0, audio + self.table_offsets, -1))  # [B,F,n,D]
        x = rows.sum(dim=2) + embed(self.text_emb, tokens[..., 0])
        return x if extra is None else x + extra

    def visible_slots(self, position: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        """position [B] int64 (the call's first frame), frames [F] (0..F-1) -> [B, 1, F, T] bool:
        which ring slots frame f sees (see the module docstring). Slot j holds the newest
        position p_j < position with p_j = j (mod T)."""
        T = self.context
        held = newest_positions(position, T)  # [B, T]: p_j
        query = position[:, None] + frames[None, :]  # [B, F]
        visible = (held[:, None, :] >= 0) & (query[:, :, None] - held[:, None, :] < T)
        return visible[:, None]  # [B, 1, F, T]

    def forward_hidden(self, tokens: torch.Tensor, extra: torch.Tensor, position: torch.Tensor,
                       past: list[tuple[torch.Tensor, torch.Tensor]],
                       ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """One step over F frames (tokens [B, F, 17], extra [B, F, D], position [B]) -> (hidden
        [B, F, D] after out_norm, the new (key, value) rows [B, H, F, Dh] of each layer)."""
        frames = torch.arange(tokens.shape[1], dtype=torch.int64)  # [F]
        pos_q = (position[:, None] + frames[None, :]).to(torch.float32)  # [B, F]
        angles = pos_q[:, None, :, None] * self.freqs  # [B, 1, F, Dh/2]
        cos, sin = rope_tables(angles)  # [B, 1, F, Dh]
        visible = self.visible_slots(position, frames)
        causal = frames[:, None] >= frames[None, :]  # [F, F]
        x = self.input_embedding(tokens, extra)  # [B, F, D]
        rows = []
        for layer, (pk, pv) in zip(self.layers, past):
            x, k, v = layer(x, cos, sin, visible, causal, pk, pv)
            rows.append((k, v))
        return self.out_norm(x), rows

    def forward_logits(self, tokens, extra, position, past):
        """-> (text logits [B, text_vocab], hidden [B, D], new rows), of the last frame: for
        parity tests (tokens [B, 17] and extra [B, D] are one frame)."""
        if tokens.dim() == 2:
            tokens, extra = tokens[:, None], extra[:, None]
        hidden, rows = self.forward_hidden(tokens, extra, position, past)
        last = hidden[:, -1]  # [B, D]
        return self.text_linear(last), last, rows

    def step(self, tokens, extra, position, text_noise, text_temperature, text_top_k, *ring):
        """The exported step. tokens [B, F, 17], extra [B, F, D], position [B]; ring = key_0,
        value_0, key_1, ... [B, H, T, Dh] -> (text token [B] int64 and hidden [B, D] of the
        last frame, key rows 0, value rows 0, ... [B, H, F, Dh])."""
        past = list(zip(ring[0::2], ring[1::2]))
        logits, hidden, rows = self.forward_logits(tokens, extra, position, past)
        token = sample_top_k(logits, text_noise, text_temperature, text_top_k)
        return (token, hidden, *[t for kv in rows for t in kv])


def write_rows(ring: list[tuple[torch.Tensor, torch.Tensor]],
               rows: list[tuple[torch.Tensor, torch.Tensor]], position: int, context: int) -> None:
    """Writes a step's new rows (F of them) into a torch KV ring in place (tests; the runtime
    does this in numpy or on the device)."""
    for (rk, rv), (k, v) in zip(ring, rows):
        for f in range(k.shape[2]):
            slot = (position + f) % context
            rk[:, :, slot] = k[:, :, f]
            rv[:, :, slot] = v[:, :, f]
