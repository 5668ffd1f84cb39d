"""Mimi's split residual vector quantizer, reduced to the codebooks in use.

Codebook 0 (semantic) quantizes its own projection of the latent; codebooks 1..n-1 (acoustic)
quantize a second projection residually. Centroids are `embedding_sum / max(cluster_usage, eps)`,
precomputed at load. Nearest centroid by L2, with the distance expanded as |x|^2 + |e|^2 - 2 x.e
as the reference's cdist does for large codebooks.
"""

from __future__ import annotations

import torch
from torch import nn

from personaplex_edge.config import PersonaPlexMimiConfig

CLUSTER_USAGE_EPS = 1e-5


class SplitRVQ(nn.Module):
    def __init__(self, cfg: PersonaPlexMimiConfig):
        super().__init__()
        n, bins, cd, d = cfg.num_codebooks, cfg.card, cfg.codebook_dim, cfg.hidden_size
        self.num_codebooks = n
        self.first_in = nn.Linear(d, cd, bias=False)
        self.first_out = nn.Linear(cd, d, bias=False)
        self.rest_in = nn.Linear(d, cd, bias=False)
        self.rest_out = nn.Linear(cd, d, bias=False)
        self.register_buffer("codebooks", torch.zeros(n, bins, cd))  # [n, bins, cd]
        self.register_buffer("sq_norms", torch.zeros(n, bins))  # [n, bins]

    def set_codebooks(self, codebooks: torch.Tensor) -> None:
        self.codebooks.copy_(codebooks)
        self.sq_norms.copy_((codebooks * codebooks).sum(-1))

    def _nearest(self, k: int, x: torch.Tensor) -> torch.Tensor:
        # x: [B, cd] -> codes [B]
        dist = ((x * x).sum(-1, keepdim=True) + self.sq_norms[k]
                - 2.0 * torch.matmul(x, self.codebooks[k].t()))  # [B, bins]
        return torch.argmin(dist, dim=-1)

    def encode(self, latent: torch.Tensor) -> torch.Tensor:
        """latent [B, D] -> codes [B, n] int64."""
        codes = [self._nearest(0, self.first_in(latent))]
        residual = self.rest_in(latent)  # [B, cd]
        for k in range(1, self.num_codebooks):
            code = self._nearest(k, residual)
            codes.append(code)
            if k + 1 < self.num_codebooks:
                residual = residual - self.codebooks[k][code]
        return torch.stack(codes, dim=-1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, n] int64 -> latent [B, D]."""
        out = self.first_out(self.codebooks[0][codes[:, 0]])
        if self.num_codebooks > 1:
            rest = self.codebooks[1][codes[:, 1]]
            for k in range(2, self.num_codebooks):
                rest = rest + self.codebooks[k][codes[:, k]]
            out = out + self.rest_out(rest)
        return out
