"""Model configs: plain dataclasses with a JSON round trip.

Field names and defaults follow the published vllm-omni PersonaPlex integration; the defaults
describe PersonaPlex-7B. Extra Mimi fields describe the codec's inner sizes so that tiny codecs
can be built for tests. A checkpoint's config.json overrides whichever fields it carries.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError


def _from_dict(cls, data: dict[str, Any], where: str):
    """Builds dataclass `cls` from `data`, refusing unknown fields (a typo must not pass)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    return cls(**data)


@dataclass(frozen=True)
class PersonaPlexMimiConfig:
    sampling_rate: int = 24000
    frame_rate: float = 12.5
    num_codebooks: int = 8  # codebooks used; the checkpoint holds num_quantizers
    # SEANet
    hidden_size: int = 512  # latent channels, also the transformers' d_model
    num_filters: int = 64
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)  # decoder order; encoder reverses it
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    num_residual_layers: int = 1
    compress: int = 2
    # encoder / decoder transformers (at the encoder frame rate, 25 Hz)
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    intermediate_size: int = 2048
    sliding_window: int = 250  # KV ring capacity in encoder steps
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # split residual vector quantizer
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32  # trained codebooks present in the checkpoint
    num_semantic_quantizers: int = 1

    def __post_init__(self):
        object.__setattr__(self, "upsampling_ratios", tuple(int(r) for r in self.upsampling_ratios))
        if self.frame_size * self.frame_rate != self.sampling_rate:
            raise ConfigError(
                f"mimi: sampling_rate {self.sampling_rate} is not a whole number of "
                f"samples per frame at {self.frame_rate} Hz")
        if self.frame_size % self.hop_length:
            raise ConfigError(
                f"mimi: frame of {self.frame_size} samples is not a multiple of the SEANet hop "
                f"{self.hop_length}")
        if not 0 < self.num_codebooks <= self.num_quantizers:
            raise ConfigError(
                f"mimi: num_codebooks {self.num_codebooks} must be in 1..{self.num_quantizers}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError("mimi: hidden_size must be divisible by num_attention_heads")

    @property
    def frame_size(self) -> int:
        """Samples per 80 ms frame (1920 at 24 kHz / 12.5 Hz)."""
        return int(round(self.sampling_rate / self.frame_rate))

    @property
    def hop_length(self) -> int:
        """Samples per SEANet latent step (960: 25 Hz)."""
        return math.prod(self.upsampling_ratios)

    @property
    def steps_per_frame(self) -> int:
        """Encoder-rate (25 Hz) steps per frame; also the stride of the learnt resampling."""
        return self.frame_size // self.hop_length

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class HeliumConfig:
    hidden_size: int = 4096
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    intermediate_size: int = 11264
    max_position_embeddings: int = 3000  # KV ring capacity (context), in frames
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-8

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class PersonaPlexDepformerConfig:
    hidden_size: int = 1024
    num_hidden_layers: int = 6
    num_attention_heads: int = 16
    head_dim: int = 64
    intermediate_size: int = 2816
    dep_q: int = 16  # steps with weights in the checkpoint (agent 0-7, user 8-15)
    num_active_codebooks: int = 8  # steps that run: the agent's codebooks
    card: int = 2048
    rope_theta: float = 1e4
    rms_norm_eps: float = 1e-8


@dataclass(frozen=True)
class PersonaPlexConfig:
    text_vocab_size: int = 32000
    text_embedding_rows: int = 32001  # the extra row embeds the initial text token
    audio_vocab_size: int = 2048
    num_audio_codebooks: int = 16  # 8 agent + 8 user streams
    helium: HeliumConfig = field(default_factory=HeliumConfig)
    depformer: PersonaPlexDepformerConfig = field(default_factory=PersonaPlexDepformerConfig)
    mimi: PersonaPlexMimiConfig = field(default_factory=PersonaPlexMimiConfig)

    _SUB = {"helium": HeliumConfig, "depformer": PersonaPlexDepformerConfig,
            "mimi": PersonaPlexMimiConfig}

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["mimi"]["upsampling_ratios"] = list(self.mimi.upsampling_ratios)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> "PersonaPlexConfig":
        """Defaults overridden by whatever `data` carries; keys that no config knows are an error,
        except `model_type` and `version`, which the published config.json carries."""
        data = {k: v for k, v in data.items() if k not in ("model_type", "version")}
        subs = {}
        for name, sub_cls in cls._SUB.items():
            sub = data.pop(name, {}) or {}
            if not isinstance(sub, dict):
                raise ConfigError(f"{where}: '{name}' must be an object")
            subs[name] = _from_dict(sub_cls, sub, f"{where}.{name}")
        return _from_dict(cls, {**data, **subs}, where)

    @classmethod
    def from_json_file(cls, path: str | Path) -> "PersonaPlexConfig":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from e
        return cls.from_dict(data, where=str(path))


# Named presets (gpt-fast style): the real model, the tiny one the tests use (its short context
# makes the KV ring wrap within a test) and the built-in demo. Tiny configs keep the real stream
# layout and frame size but shrink every width.
PRESETS: dict[str, dict[str, Any]] = {
    "personaplex-7b-v1": {},
    "tiny": {
        "helium": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "intermediate_size": 176, "max_position_embeddings": 40},
        "depformer": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "head_dim": 16, "intermediate_size": 88},
        "mimi": {"hidden_size": 32, "num_filters": 4, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "intermediate_size": 64, "sliding_window": 16,
                 "codebook_dim": 16, "num_quantizers": 8},
    },
}
# The built-in demo model: tiny widths, but a context (40 s) that holds a persona and a chat.
PRESETS["demo"] = json.loads(json.dumps(PRESETS["tiny"]))
PRESETS["demo"]["helium"]["max_position_embeddings"] = 500
# a text vocabulary the size of the demo's small SentencePiece model, so its babble is readable
PRESETS["demo"].update(text_vocab_size=256, text_embedding_rows=257)


def preset(name: str) -> PersonaPlexConfig:
    try:
        return PersonaPlexConfig.from_dict(json.loads(json.dumps(PRESETS[name])), where=name)
    except KeyError:
        raise ConfigError(f"unknown config preset {name!r}; known: {', '.join(PRESETS)}") from None
