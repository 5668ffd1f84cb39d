"""Model configs in the layout of vllm-omni's PersonaPlex integration (the user's seed).

`PersonaPlexConfig` holds three sub-configs, as the seed names them: `temporal_config` (Helium),
`depformer_config` and `mimi_config`, with the seed's field names and defaults (PersonaPlex-7B).
A config.json in that layout, with the keys Hugging Face writes into every config
(`architectures`, `transformers_version`, `torch_dtype`, a sub-config's `model_type`, ...),
loads; so does the published checkpoint's config.json, which carries no architecture at all,
and the layout this project wrote before (`helium` / `depformer` / `mimi`, Mimi's
`sampling_rate` and `codebook_size`).

Every field the seed's config classes define is accepted, those vllm-omni's `HeliumConfig` has
beyond the documented ones (`vocab_size`, `sliding_window`, `tie_word_embeddings`, `use_cache`)
included. A value this runtime cannot honour (another activation, biases, grouped KV heads, a
sliding window other than the context, tied embeddings, a frame size that disagrees with the
rates, ...) is a ConfigError naming the field and the value; a key no config knows is one too, so
a misspelt field never passes silently. Extra Mimi fields describe the codec's inner sizes so
that tiny codecs can be built for tests.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .errors import ConfigError
from .streams import CODEBOOKS_PER_SPEAKER

# Keys Hugging Face's PretrainedConfig writes into a config.json (save_pretrained, to_dict) that
# say nothing about the architecture: accepted and ignored. Only these exact names.
HF_GENERIC_KEYS = frozenset({
    "architectures", "transformers_version", "torch_dtype", "dtype", "model_type", "use_cache",
    "_name_or_path", "_attn_implementation_autoset", "return_dict", "output_hidden_states",
    "output_attentions", "torchscript", "use_bfloat16", "tf_legacy_loss", "pruned_heads",
    "tie_word_embeddings", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder",
    "cross_attention_hidden_size", "add_cross_attention", "tie_encoder_decoder",
    "finetuning_task", "id2label", "label2id", "tokenizer_class", "prefix", "bos_token_id",
    "pad_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
    "task_specific_params", "problem_type", "keys_to_ignore_at_inference",
    # the published nvidia/personaplex-7b-v1 config.json
    "version",
})
# The seed's top-level switches for vllm-omni's CUDA graph capture: how vllm-omni runs the
# model, not what the model is. This runtime captures its own (runtime/backends/cuda_graphs.py).
SEED_RUNTIME_FLAGS = frozenset({"mimi_cuda_graphs", "depformer_cuda_graphs"})


def _from_dict(cls, data: dict[str, Any], where: str, renamed: dict[str, str] | None = None):
    """Builds dataclass `cls` from `data`: Hugging Face's generic keys dropped, the names this
    project used before mapped to the seed's (`renamed`), anything else unknown refused."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be an object, got {type(data).__name__}")
    renamed = renamed or {}
    both = sorted(f"{old} and {new}" for old, new in renamed.items() if old in data and new in data)
    if both:
        raise ConfigError(f"{where}: {', '.join(both)} name the same field; keep one")
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    # a generic key that is a field of this config (Helium's tie_word_embeddings) is checked
    ignored = (HF_GENERIC_KEYS | getattr(cls, "IGNORED", frozenset())) - known
    data = {renamed.get(k, k): v for k, v in data.items() if k not in ignored}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    try:
        return cls(**data)
    except TypeError as e:  # a value of the wrong kind, e.g. a list where a number goes
        raise ConfigError(f"{where}: {e}") from None


def _refuse(where: str, name: str, value: Any, why: str) -> None:
    raise ConfigError(f"{where}.{name} = {value!r}: {why}")


def _check_transformer(cfg, where: str) -> None:
    """What the Helium and depformer ports implement: full multi-head attention with heads of
    head_dim summing to the width, a SiLU-gated MLP, no biases."""
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings"):
        _positive(where, cfg, name)
    if cfg.hidden_act != "silu":
        _refuse(where, "hidden_act", cfg.hidden_act, "only the SiLU-gated MLP ('silu') is "
                "implemented")
    for name in ("attention_bias", "mlp_bias"):
        if getattr(cfg, name):
            _refuse(where, name, getattr(cfg, name),
                    "PersonaPlex has no biases; this runtime implements none")
    if cfg.num_key_value_heads != cfg.num_attention_heads:
        _refuse(where, "num_key_value_heads", cfg.num_key_value_heads,
                f"grouped KV heads are not implemented (num_attention_heads is "
                f"{cfg.num_attention_heads}: full multi-head attention)")
    if cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size:
        _refuse(where, "head_dim", cfg.head_dim, f"{cfg.num_attention_heads} heads of it must "
                f"make hidden_size {cfg.hidden_size}")


def _check_flag(where: str, cfg, name: str) -> None:
    value = getattr(cfg, name)
    if not isinstance(value, bool):
        _refuse(where, name, value, "must be true or false")


def _positive(where: str, cfg, name: str) -> None:
    """A size or rate the arithmetic after it divides by: a number above zero, or one message."""
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        _refuse(where, name, value, "must be a number above 0")


@dataclass(frozen=True)
class PersonaPlexMimiConfig:
    model_type: ClassVar[str] = "personaplex_mimi"

    sample_rate: int = 24000
    frame_rate: float = 12.5
    samples_per_frame: int = 1920  # sample_rate / frame_rate: one 80 ms frame
    num_codebooks: int = 8  # codebooks used; the checkpoint holds num_quantizers
    card: int = 2048  # entries per codebook
    num_channels: int = 1
    mimi_name: str | None = None  # the Mimi weights' file in the checkpoint (None: the usual)
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
    codebook_dim: int = 256
    num_quantizers: int = 32  # trained codebooks present in the checkpoint
    num_semantic_quantizers: int = 1

    # names this project wrote before the seed's layout
    LEGACY: ClassVar[dict[str, str]] = {"sampling_rate": "sample_rate", "codebook_size": "card"}

    def __post_init__(self):
        where = "mimi_config"
        for name in ("sample_rate", "frame_rate", "samples_per_frame", "hidden_size",
                     "num_attention_heads", "num_hidden_layers", "card", "num_quantizers"):
            _positive(where, self, name)
        ratios = self.upsampling_ratios
        if (not isinstance(ratios, (list, tuple)) or not ratios
                or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ratios)):
            _refuse(where, "upsampling_ratios", ratios, "must be a list of whole numbers above 0")
        object.__setattr__(self, "upsampling_ratios", tuple(ratios))
        if self.num_channels != 1:
            _refuse(where, "num_channels", self.num_channels, "Mimi here is mono (1)")
        if self.samples_per_frame * self.frame_rate != self.sample_rate:
            _refuse(where, "samples_per_frame", self.samples_per_frame,
                    f"disagrees with sample_rate {self.sample_rate} / frame_rate "
                    f"{self.frame_rate} = {self.sample_rate / self.frame_rate:g}")
        if self.samples_per_frame % self.hop_length:
            _refuse(where, "upsampling_ratios", list(self.upsampling_ratios),
                    f"their product {self.hop_length} (the SEANet hop) must divide "
                    f"samples_per_frame {self.samples_per_frame}")
        if not 0 < self.num_codebooks <= self.num_quantizers:
            _refuse(where, "num_codebooks", self.num_codebooks,
                    f"must be in 1..num_quantizers ({self.num_quantizers})")
        if self.hidden_size % self.num_attention_heads:
            _refuse(where, "num_attention_heads", self.num_attention_heads,
                    f"must divide hidden_size {self.hidden_size}")

    @property
    def frame_seconds(self) -> float:
        return 1.0 / self.frame_rate

    @property
    def hop_length(self) -> int:
        """Samples per SEANet latent step (960: 25 Hz)."""
        return math.prod(self.upsampling_ratios)

    @property
    def steps_per_frame(self) -> int:
        """Encoder-rate (25 Hz) steps per frame; also the stride of the learnt resampling."""
        return self.samples_per_frame // self.hop_length

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class HeliumConfig:
    """The temporal transformer (the seed's `temporal_config`)."""

    model_type: ClassVar[str] = "personaplex_helium"

    hidden_size: int = 4096
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None: = num_attention_heads (full MHA)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    intermediate_size: int = 11264
    max_position_embeddings: int = 3000  # KV ring capacity (context), in frames
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-8
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    # the seed's HeliumConfig beyond its documented fields
    # None: what the model is (not written back as a number, so that a config edited through
    # to_dict() stays consistent): text_vocab_size, and the context
    vocab_size: int | None = None  # text_linear's rows
    sliding_window: int | None = None  # the KV ring is the window
    tie_word_embeddings: bool = False  # text_linear is its own weight, not text_emb's
    use_cache: bool = True  # the KV ring is always there; either value computes the same

    def __post_init__(self):
        where = "temporal_config"
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None and isinstance(self.num_attention_heads, int) \
                and self.num_attention_heads > 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        _check_transformer(self, where)
        if self.sliding_window not in (None, self.max_position_embeddings):
            # one query per step over a ring of the context's size is an exact sliding window
            # of that size; another window would need another mask (and persona prefill)
            _refuse(where, "sliding_window", self.sliding_window,
                    f"the KV ring attends over exactly max_position_embeddings "
                    f"({self.max_position_embeddings}) frames; set both to the same value")
        if self.tie_word_embeddings is not False:
            _refuse(where, "tie_word_embeddings", self.tie_word_embeddings,
                    "PersonaPlex's text_linear is a weight of its own; tied embeddings are not "
                    "implemented")
        _check_flag(where, self, "use_cache")
        if self.vocab_size is not None:
            _positive(where, self, "vocab_size")


@dataclass(frozen=True)
class PersonaPlexDepformerConfig:
    model_type: ClassVar[str] = "personaplex_depformer"

    hidden_size: int = 1024
    num_hidden_layers: int = 6
    num_attention_heads: int = 16
    num_key_value_heads: int | None = None  # None: = num_attention_heads
    head_dim: int = 64
    intermediate_size: int = 2816
    max_position_embeddings: int = 8  # the depformer's context: one position per inner step
    dep_q: int = 16  # steps with weights in the checkpoint (agent 0-7, user 8-15)
    num_active_codebooks: int = 8  # steps that run: the agent's codebooks, decoded by Mimi
    card: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-8
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    use_cache: bool = True  # its per-frame KV is always there; either value computes the same

    def __post_init__(self):
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        where = "depformer_config"
        _check_transformer(self, where)
        _check_flag(where, self, "use_cache")
        if not 0 < self.num_active_codebooks <= self.dep_q:
            _refuse(where, "num_active_codebooks", self.num_active_codebooks,
                    f"must be in 1..dep_q ({self.dep_q})")
        if self.max_position_embeddings < self.num_active_codebooks:
            _refuse(where, "max_position_embeddings", self.max_position_embeddings,
                    f"the depformer runs num_active_codebooks ({self.num_active_codebooks}) "
                    "steps per frame, one position each")


@dataclass(frozen=True)
class PersonaPlexConfig:
    model_type: ClassVar[str] = "personaplex"
    architectures: ClassVar[tuple[str, ...]] = ("PersonaPlexTalkerForConditionalGeneration",)
    sub_configs: ClassVar[dict[str, type]] = {"temporal_config": HeliumConfig,
                                              "depformer_config": PersonaPlexDepformerConfig,
                                              "mimi_config": PersonaPlexMimiConfig}

    temporal_config: HeliumConfig = field(default_factory=HeliumConfig)
    depformer_config: PersonaPlexDepformerConfig = field(
        default_factory=PersonaPlexDepformerConfig)
    mimi_config: PersonaPlexMimiConfig = field(default_factory=PersonaPlexMimiConfig)
    text_vocab_size: int = 32000
    text_embedding_rows: int = 32001  # the extra row embeds the initial text token
    audio_vocab_size: int = 2048
    num_audio_codebooks: int = 16  # 8 agent + 8 user streams
    mimi_name: str | None = None  # the seed's mirror: set, it overrides mimi_config.mimi_name

    _LEGACY_SUBS: ClassVar[dict[str, str]] = {"helium": "temporal_config",
                                              "depformer": "depformer_config",
                                              "mimi": "mimi_config"}
    IGNORED: ClassVar[frozenset[str]] = SEED_RUNTIME_FLAGS

    def __post_init__(self):
        if self.mimi_name is not None and self.mimi_name != self.mimi_config.mimi_name:
            object.__setattr__(self, "mimi_config",
                               dataclasses.replace(self.mimi_config, mimi_name=self.mimi_name))
        object.__setattr__(self, "mimi_name", self.mimi_config.mimi_name)
        helium = self.temporal_config
        if helium.vocab_size not in (None, self.text_vocab_size):
            _refuse("temporal_config", "vocab_size", helium.vocab_size,
                    f"text_linear has one row per text token: it must equal text_vocab_size "
                    f"({self.text_vocab_size})")
        where = "config"
        if self.text_embedding_rows != self.text_vocab_size + 1:
            _refuse(where, "text_embedding_rows", self.text_embedding_rows,
                    f"must be text_vocab_size + 1 ({self.text_vocab_size + 1}): the extra row "
                    "embeds the initial text token")
        for name, value in (("mimi_config.card", self.mimi_config.card),
                            ("depformer_config.card", self.depformer_config.card)):
            if value != self.audio_vocab_size:
                _refuse(where, name.split(".")[0] + ".card", value,
                        f"disagrees with audio_vocab_size {self.audio_vocab_size}")
        if self.mimi_config.num_codebooks != CODEBOOKS_PER_SPEAKER:
            _refuse("mimi_config", "num_codebooks", self.mimi_config.num_codebooks,
                    f"the 17-stream layout holds {CODEBOOKS_PER_SPEAKER} codebooks per speaker")
        if self.num_audio_codebooks != 2 * self.mimi_config.num_codebooks:
            _refuse(where, "num_audio_codebooks", self.num_audio_codebooks,
                    f"must be 2 x mimi_config.num_codebooks ({2 * self.mimi_config.num_codebooks}"
                    "): the agent's and the user's codebooks")
        if self.depformer_config.num_active_codebooks != self.mimi_config.num_codebooks:
            _refuse("depformer_config", "num_active_codebooks",
                    self.depformer_config.num_active_codebooks,
                    f"must equal mimi_config.num_codebooks ({self.mimi_config.num_codebooks})")
        if self.depformer_config.dep_q > self.num_audio_codebooks:
            _refuse("depformer_config", "dep_q", self.depformer_config.dep_q,
                    f"at most num_audio_codebooks ({self.num_audio_codebooks})")

    @property
    def sample_rate(self) -> int:
        """Output PCM sample rate in Hz (the Mimi config's)."""
        return self.mimi_config.sample_rate

    def get_text_config(self) -> HeliumConfig:
        return self.temporal_config

    def to_dict(self) -> dict[str, Any]:
        """The seed's layout, with each config's model_type (what a vllm-omni user has)."""
        out: dict[str, Any] = {"model_type": self.model_type,
                               "architectures": list(self.architectures)}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                sub = dataclasses.asdict(value)
                sub = {k: list(v) if isinstance(v, tuple) else v for k, v in sub.items()}
                out[f.name] = {"model_type": value.model_type, **sub}
            else:
                out[f.name] = value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> "PersonaPlexConfig":
        """Defaults overridden by whatever `data` carries (see the module docstring)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be an object")
        data = dict(data)
        for old, new in cls._LEGACY_SUBS.items():
            if old in data:
                if new in data:
                    raise ConfigError(f"{where}: both '{old}' and '{new}' given; keep '{new}'")
                data[new] = data.pop(old)
        for name, sub_cls in cls.sub_configs.items():
            sub = data.get(name) or {}
            if isinstance(sub, sub_cls):
                continue
            data[name] = _from_dict(sub_cls, sub, f"{where}.{name}",
                                    getattr(sub_cls, "LEGACY", None))
        return _from_dict(cls, data, where)

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
        "temporal_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                            "intermediate_size": 176, "max_position_embeddings": 40},
        "depformer_config": {"hidden_size": 32, "num_hidden_layers": 2,
                             "num_attention_heads": 2, "head_dim": 16, "intermediate_size": 88},
        "mimi_config": {"hidden_size": 32, "num_filters": 4, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "intermediate_size": 64, "sliding_window": 16,
                        "codebook_dim": 16, "num_quantizers": 8},
    },
}
# The built-in demo model: tiny widths, but a context (40 s) that holds a persona and a chat.
PRESETS["demo"] = json.loads(json.dumps(PRESETS["tiny"]))
PRESETS["demo"]["temporal_config"]["max_position_embeddings"] = 500
# a text vocabulary the size of the demo's small SentencePiece model, so its babble is readable
PRESETS["demo"].update(text_vocab_size=256, text_embedding_rows=257)
# the 32 codebooks its transcriber reads (personaplex_edge/transcriber.py: TRANSCRIBER_PRESETS);
# the first 8, all PersonaPlex reads, are drawn as before
PRESETS["demo"]["mimi_config"]["num_quantizers"] = 32


def preset(name: str) -> PersonaPlexConfig:
    try:
        return PersonaPlexConfig.from_dict(json.loads(json.dumps(PRESETS[name])), where=name)
    except KeyError:
        raise ConfigError(f"unknown config preset {name!r}; known: {', '.join(PRESETS)}") from None
