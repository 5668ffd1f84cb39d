"""Temperature + top-k sampling inside a graph, as Gumbel-max over the top-k.

    scores = TopK(logits / temperature, K_max)          sorted, best first   [B, K_max]
    scores[rank >= top_k] = -inf                        top_k is a runtime input
    pick   = argmax(scores + gumbel_noise)              noise drawn on the host, [B, K_max]
    token  = index of the picked entry

argmax(s + G) with G i.i.d. standard Gumbel picks entry i with probability softmax(s)_i, so this
samples the same distribution as the reference's multinomial over softmax(top-k(logits / T)).
Zero noise gives the greedy argmax. K_max is fixed at export (shapes stay static; TensorRT needs
TopK's K constant); top_k <= 0 or above K_max means K_max. No If/Loop: greedy vs sampled is only
data (the noise).
"""

from __future__ import annotations

import torch

DEFAULT_K_MAX = 250  # the reference's audio top-k; text uses 25
MIN_TEMPERATURE = 1e-6  # a temperature of 0 would divide by zero; greedy is zero noise instead


def sample_top_k(logits: torch.Tensor, noise: torch.Tensor, temperature: torch.Tensor,
                 top_k: torch.Tensor) -> torch.Tensor:
    """logits [B, V] float32, noise [B, K_max], temperature [B] float32, top_k [B] int64
    -> tokens [B] int64."""
    k_max, vocab = int(noise.shape[-1]), int(logits.shape[-1])  # static at export
    if k_max > vocab:
        raise ValueError(f"K_max {k_max} exceeds the vocabulary ({vocab})")
    if vocab > 1 << 24:
        raise ValueError(f"a vocabulary of {vocab} is past float32's exact integers")
    scaled = logits / temperature.clamp(min=MIN_TEMPERATURE)[:, None]  # [B, V]
    best, index = torch.topk(scaled, k_max, dim=-1)  # [B, K_max] each, best first
    limit = torch.where(top_k > 0, top_k.clamp(max=k_max), torch.full_like(top_k, k_max))
    rank = torch.arange(k_max, dtype=torch.int64, device=logits.device)  # [K_max]
    keep = rank[None, :] < limit[:, None]  # [B, K_max]
    scores = torch.where(keep, best + noise, torch.full_like(best, float("-inf")))
    pick = scores.argmax(dim=-1, keepdim=True)  # [B, 1]
    # gathered as float32, exact for any vocabulary below 2^24: WebGPU's GatherElements takes
    # float data only, and one kept on the CPU would send every step's top-k through the host
    return index.to(torch.float32).gather(-1, pick)[:, 0].to(torch.int64)


def top_k_probabilities(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """The distribution `sample_top_k` draws from, [B, V] (for tests and the reference check)."""
    scaled = logits / temperature
    kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]  # [B, 1]
    scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return torch.softmax(scaled, dim=-1)
