"""The depformer: the agent's 8 audio codebooks of one frame, predicted one after another.

Step k (k = 0..7) is a token of a small causal transformer whose sequence is the frame's steps:

    x_k    = depformer_in[k](hidden) + (depformer_text_emb(text) if k == 0
                                        else depformer_emb[k - 1](token_{k-1}))
    x_k    = layers(x_k), step k using its own slice of every attention and MLP weight
    logits = linears[k](x_k)                       no final norm, no positional embedding
    token_k = sample(logits)

Keys and values exist only within the frame, so the whole frame is one call with the steps
unrolled and no state crosses frames. The checkpoint holds dep_q = 16 steps; steps 8..15 predict
the user's codebooks, which the real user codes always replace, so only the first
`num_active_codebooks` steps are built.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from personaplex_edge.config import PersonaPlexConfig, PersonaPlexDepformerConfig

from .helium import GatedMLP, RMSNorm, embed
from .sampling import sample_top_k


class DepformerLayer(nn.Module):
    """Norms shared by all steps; attention projections and MLP per step."""

    def __init__(self, d: PersonaPlexDepformerConfig, steps: int):
        super().__init__()
        dim = d.hidden_size
        self.num_heads, self.head_dim = d.num_attention_heads, d.head_dim
        self.norm1 = RMSNorm(dim, d.rms_norm_eps)
        self.norm2 = RMSNorm(dim, d.rms_norm_eps)
        self.in_projs = nn.ModuleList([nn.Linear(dim, 3 * dim, bias=False) for _ in range(steps)])
        self.out_projs = nn.ModuleList([nn.Linear(dim, dim, bias=False) for _ in range(steps)])
        self.gating = nn.ModuleList([GatedMLP(dim, d.intermediate_size) for _ in range(steps)])

    def forward(self, x: torch.Tensor, step: int, keys: list[torch.Tensor],
                values: list[torch.Tensor]) -> torch.Tensor:
        """x [B, dim] at step `step`; keys/values hold this layer's rows of the earlier steps of
        the frame ([B, H, 1, Dh] each) and get this step's appended."""
        B, dim = x.shape
        H, Dh = self.num_heads, self.head_dim
        qkv = self.in_projs[step](self.norm1(x)).reshape(B, 3, H, 1, Dh)
        keys.append(qkv[:, 1])
        values.append(qkv[:, 2])
        k = torch.cat(keys, dim=2)  # [B, H, step + 1, Dh]: the steps so far, causal by design
        v = torch.cat(values, dim=2)
        scores = torch.matmul(qkv[:, 0], k.transpose(2, 3)) * (Dh ** -0.5)  # [B, H, 1, step+1]
        out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, H, 1, Dh]
        x = x + self.out_projs[step](out.reshape(B, dim))
        return x + self.gating[step](self.norm2(x))


class Depformer(nn.Module):
    def __init__(self, cfg: PersonaPlexConfig):
        super().__init__()
        d = cfg.depformer_config
        self.steps = d.num_active_codebooks
        D, dim = cfg.temporal_config.hidden_size, d.hidden_size
        self.depformer_in = nn.ModuleList([nn.Linear(D, dim, bias=False)
                                           for _ in range(self.steps)])
        self.text_emb = nn.Parameter(torch.zeros(cfg.text_embedding_rows, dim))
        # step k >= 1 embeds the token of step k - 1: tables 0 .. steps - 2
        self.audio_emb = nn.ParameterList([nn.Parameter(torch.zeros(d.card + 1, dim))
                                           for _ in range(self.steps - 1)])
        self.layers = nn.ModuleList([DepformerLayer(d, self.steps)
                                     for _ in range(d.num_hidden_layers)])
        self.linears = nn.ModuleList([nn.Linear(dim, d.card, bias=False)
                                      for _ in range(self.steps)])

    def run(self, hidden: torch.Tensor, text_token: torch.Tensor,
            choose: Callable[[int, torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, list]:
        """hidden [B, D], text_token [B]; `choose(k, logits [B, card])` gives step k's token [B].
        -> (tokens [B, steps] int64, logits of every step)."""
        keys: list[list[torch.Tensor]] = [[] for _ in self.layers]
        values: list[list[torch.Tensor]] = [[] for _ in self.layers]
        prev = embed(self.text_emb, text_token)  # [B, dim]
        tokens, all_logits = [], []
        for k in range(self.steps):
            x = self.depformer_in[k](hidden) + prev
            for layer, ks, vs in zip(self.layers, keys, values):
                x = layer(x, k, ks, vs)
            logits = self.linears[k](x)  # [B, card]
            token = choose(k, logits)
            tokens.append(token)
            all_logits.append(logits)
            if k + 1 < self.steps:
                prev = embed(self.audio_emb[k], token)
        return torch.stack(tokens, dim=1), all_logits

    def forward_teacher(self, hidden: torch.Tensor, text_token: torch.Tensor,
                        audio_tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, steps, card] with the given tokens [B, steps] fed back (parity tests)."""
        _, logits = self.run(hidden, text_token, lambda k, _: audio_tokens[:, k])
        return torch.stack(logits, dim=1)

    def step(self, hidden: torch.Tensor, text_token: torch.Tensor, noise: torch.Tensor,
             temperature: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
        """The exported step: noise [B, steps, K_max] -> the agent's tokens [B, steps] int64."""
        tokens, _ = self.run(hidden, text_token,
                             lambda k, logits: sample_top_k(logits, noise[:, k], temperature,
                                                            top_k))
        return tokens
