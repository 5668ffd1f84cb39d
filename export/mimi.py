"""Mimi, the 24 kHz <-> 12.5 Hz codec, as two one-frame steps with explicit state.

    encode_step: pcm [B, 1, 1920] -> SEANet -> transformer (2 steps) -> stride-2 conv -> RVQ
                 -> codes [B, 8]
    decode_step: codes [B, 8] -> RVQ -> depthwise transposed conv -> transformer -> SEANet
                 -> pcm [B, 1, 1920]

Weights load from `tokenizer-e351c8d8-checkpoint125.safetensors` in the published key layout.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from personaplex_edge.config import PersonaPlexMimiConfig
from personaplex_edge.manifest import RingSpec, StateSpec

from .checkpoint import TensorFile, check_tensors
from .mimi_transformer import MimiTransformer
from .quantizer import CLUSTER_USAGE_EPS, SplitRVQ
from .seanet import SEANetDecoder, SEANetEncoder
from .streaming import State, StreamConv1d, StreamConvTranspose1d, collect_state, name_states


class Mimi(nn.Module):
    def __init__(self, cfg: PersonaPlexMimiConfig):
        super().__init__()
        self.cfg = cfg
        d, s = cfg.hidden_size, cfg.steps_per_frame
        self.encoder = SEANetEncoder(cfg)
        self.encoder_transformer = MimiTransformer(cfg)
        self.downsample = StreamConv1d(d, d, 2 * s, stride=s, bias=False, replicate_first=True)
        self.quantizer = SplitRVQ(cfg)
        self.upsample = StreamConvTranspose1d(d, d, 2 * s, stride=s, groups=d, bias=False)
        self.decoder_transformer = MimiTransformer(cfg)
        self.decoder = SEANetDecoder(cfg)
        name_states(self)
        self.eval()

    def encoder_state(self, batch: int = 1) -> list[StateSpec]:
        return [spec for m in (self.encoder, self.encoder_transformer, self.downsample)
                for spec in collect_state(m, batch)]

    def decoder_state(self, batch: int = 1) -> list[StateSpec]:
        return [spec for m in (self.upsample, self.decoder_transformer, self.decoder)
                for spec in collect_state(m, batch)]

    def encoder_rings(self, batch: int = 1) -> list[RingSpec]:
        return self.encoder_transformer.rings(batch, self.cfg.steps_per_frame)

    def decoder_rings(self, batch: int = 1) -> list[RingSpec]:
        return self.decoder_transformer.rings(batch, self.cfg.steps_per_frame)

    def encode_step(self, pcm: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """pcm [B, 1, frame_size] -> codes [B, num_codebooks] int64."""
        x, new = self.encoder(pcm, state)  # [B, D, steps_per_frame]
        x, changed = self.encoder_transformer(x, state)
        new.update(changed)
        x, changed = self.downsample(x, state)  # [B, D, 1]
        new.update(changed)
        return self.quantizer.encode(x[..., 0]), new

    def decode_step(self, codes: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """codes [B, num_codebooks] int64 -> pcm [B, 1, frame_size]."""
        x = self.quantizer.decode(codes)[..., None]  # [B, D, 1]
        x, new = self.upsample(x, state)  # [B, D, steps_per_frame]
        x, changed = self.decoder_transformer(x, state)
        new.update(changed)
        pcm, changed = self.decoder(x, state)
        new.update(changed)
        return pcm, new


# ---- checkpoint layout -------------------------------------------------------------------------

def _canonical_key(key: str) -> str:
    """Maps the names older or re-saved Mimi files use onto the published ones."""
    key = key.replace(".self_attn.in_projs.0.weight", ".self_attn.in_proj_weight")
    key = key.replace(".self_attn.out_projs.0.weight", ".self_attn.out_proj.weight")
    for old, new in (("inited", "_initialized"), ("cluster_size", "cluster_usage"),
                     ("embed_avg", "embedding_sum"), ("embed_sum", "embedding_sum")):
        key = re.sub(rf"\._codebook\.{old}$", f"._codebook.{new}", key)
    return key


def expected_mimi_tensors(cfg: PersonaPlexMimiConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Mimi checkpoint with the shape `cfg` implies, in the published names."""
    shapes: dict[str, tuple[int, ...]] = {}
    with torch.device("meta"):  # shapes only: allocate nothing
        model = Mimi(cfg)
    for name, p in model.state_dict().items():
        if name.startswith("quantizer."):
            continue
        shapes[_checkpoint_name(name)] = tuple(p.shape)
    d, cd, bins = cfg.hidden_size, cfg.codebook_dim, cfg.card
    for part, count in (("rvq_first", cfg.num_semantic_quantizers),
                        ("rvq_rest", cfg.num_quantizers - cfg.num_semantic_quantizers)):
        shapes[f"quantizer.{part}.input_proj.weight"] = (cd, d, 1)
        shapes[f"quantizer.{part}.output_proj.weight"] = (d, cd, 1)
        for i in range(count):
            prefix = f"quantizer.{part}.vq.layers.{i}._codebook"
            shapes[f"{prefix}.embedding_sum"] = (bins, cd)
            shapes[f"{prefix}.cluster_usage"] = (bins,)
            shapes[f"{prefix}._initialized"] = (1,)
    return shapes


def _checkpoint_name(name: str) -> str:
    """Our parameter name -> the published checkpoint key."""
    if name.startswith("downsample."):
        return name.replace("downsample.conv.", "downsample.conv.conv.conv.")
    if name.startswith("upsample."):
        return name.replace("upsample.convtr.", "upsample.convtr.convtr.convtr.")
    m = re.match(r"(encoder|decoder)_transformer\.layers\.(.*)$", name)
    if m:
        rest = m.group(2).replace("self_attn.in_proj.weight", "self_attn.in_proj_weight")
        return f"{m.group(1)}_transformer.transformer.layers.{rest}"
    name = re.sub(r"\.conv\.(weight|bias)$", r".conv.conv.\1", name)
    return re.sub(r"\.convtr\.(weight|bias)$", r".convtr.convtr.\1", name)


def load_mimi(path: str | Path, cfg: PersonaPlexMimiConfig) -> Mimi:
    """Builds Mimi from a checkpoint, after checking every tensor's name and shape."""
    tf = TensorFile(path, rename=_canonical_key)
    check_tensors(tf, expected_mimi_tensors(cfg), what="Mimi")
    model = Mimi(cfg)
    own = {name: tf.get(_checkpoint_name(name)) for name in model.state_dict()
           if not name.startswith("quantizer.")}
    q = model.quantizer
    for ours, part in (("first", "rvq_first"), ("rest", "rvq_rest")):
        own[f"quantizer.{ours}_in.weight"] = tf.get(f"quantizer.{part}.input_proj.weight")[..., 0]
        own[f"quantizer.{ours}_out.weight"] = tf.get(f"quantizer.{part}.output_proj.weight")[..., 0]
    books = []
    for k in range(cfg.num_codebooks):
        part, i = ("rvq_first", k) if k < cfg.num_semantic_quantizers else \
            ("rvq_rest", k - cfg.num_semantic_quantizers)
        prefix = f"quantizer.{part}.vq.layers.{i}._codebook"
        usage = tf.get(f"{prefix}.cluster_usage").clamp(min=CLUSTER_USAGE_EPS)
        books.append(tf.get(f"{prefix}.embedding_sum") / usage[:, None])
    own["quantizer.codebooks"] = torch.stack(books)  # [n, bins, cd]
    own["quantizer.sq_norms"] = q.sq_norms
    model.load_state_dict(own, strict=True)
    q.set_codebooks(own["quantizer.codebooks"])
    return model.eval()
