"""Random checkpoints in the published layout, for the built-in demo model.

Weights come from this project's own modules (seeded), written under the published key names, so
the demo exercises exactly the loading path the real weights take. Such a model babbles.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from personaplex_edge.config import PersonaPlexConfig

from .hub import CONFIG_FILE, MIMI_FILE
from .mimi import Mimi, _checkpoint_name


@torch.no_grad()
def random_mimi_tensors(cfg: PersonaPlexConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    mc = cfg.mimi
    torch.manual_seed(seed)
    model = Mimi(mc)
    gen = torch.Generator().manual_seed(seed + 1)
    out = {}
    for name, p in model.state_dict().items():
        if name.startswith("quantizer."):
            continue
        if name.endswith("layer_scale_1.scale") or name.endswith("layer_scale_2.scale"):
            p = torch.rand(p.shape, generator=gen) * 0.5 + 0.25
        out[_checkpoint_name(name)] = p.contiguous()
    d, cd, bins = mc.hidden_size, mc.codebook_dim, mc.codebook_size
    # centroids at the scale of the projected latents, so that codes spread out
    scale = 0.5 / cd ** 0.5
    for part, count in (("rvq_first", mc.num_semantic_quantizers),
                        ("rvq_rest", mc.num_quantizers - mc.num_semantic_quantizers)):
        out[f"quantizer.{part}.input_proj.weight"] = torch.randn(cd, d, 1, generator=gen) / d ** 0.5
        out[f"quantizer.{part}.output_proj.weight"] = torch.randn(d, cd, 1, generator=gen) / cd ** 0.5
        for i in range(count):
            prefix = f"quantizer.{part}.vq.layers.{i}._codebook"
            out[f"{prefix}.embedding_sum"] = torch.randn(bins, cd, generator=gen) * scale
            out[f"{prefix}.cluster_usage"] = torch.ones(bins)
            out[f"{prefix}._initialized"] = torch.ones(1)
    return out


def write_synthetic_checkpoint(cfg: PersonaPlexConfig, root: str | Path, seed: int = 0) -> Path:
    """A checkpoint directory for `cfg` with random weights: the Mimi file and config.json."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    save_file(random_mimi_tensors(cfg, seed), str(root / MIMI_FILE))
    (root / CONFIG_FILE).write_text(json.dumps(
        {"model_type": "personaplex", "version": "synthetic", **cfg.to_dict()}, indent=2))
    return root
