"""The transcriber: Kyutai's streaming speech-to-text model (`kyutai/stt-1b-en_fr`,
`kyutai/stt-2.6b-en`) as a model directory holds it beside PersonaPlex.

A Kyutai STT model is a Helium-style transformer step like PersonaPlex's temporal one, reading
one column per 80 ms frame - the text token it chose the step before and the user's Mimi codes
(32 codebooks, all on time) - and choosing the next text token; no depformer. Its text runs
`audio_delay_seconds` behind the audio: a word heard at t is written about t + 0.5 s (1B). The
1B's `-candle` weights add semantic-VAD heads: head h's softmax, class 0, is the probability
that no voice comes within 0.5 / 1 / 2 / 3 s.

Mimi's residual quantiser chooses codebook k from codebooks 0..k-1 only, so the first 8 codes
of a 32-code encode are the 8 PersonaPlex reads: one encode per frame feeds both models when
both use the same codec (the export compares the codec files' hashes).

`TranscriberConfig` is read from Kyutai's config.json (moshi's `LMModel` arguments at the top
level, with `model_type` "stt", `stt_config`, `lm_gen_config`, `mimi_name`, `tokenizer_name`) and
kept in the manifest. It has the attribute names of PersonaPlexConfig where the two agree
(`temporal_config`, `text_vocab_size`, ...), so the Helium port builds either.

Torch-free: the runtime reads this from the manifest.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .config import HeliumConfig
from .errors import ConfigError
from .streams import TEXT_EPAD, TEXT_PAD

STT_MODEL_TYPE = "stt"
# the 1B's semantic VAD: Kyutai's Unmute ends the user's turn when the 2 s head's probability
# of no voice passes 0.6 (unmute/unmute_handler.py, determine_pause)
TURN_HEAD = 2
TURN_THRESHOLD = 0.6

# moshi LMModel arguments of an STT config.json that this port reads (the rest must not change
# what the step computes: see _IGNORED)
_READ = frozenset({
    "dim", "num_heads", "num_layers", "hidden_scale", "context", "max_period", "gating", "norm",
    "positional_embedding", "causal", "layer_scale", "n_q", "dep_q", "card", "text_card",
    "text_card_out", "delays", "existing_text_padding_id", "existing_text_end_padding_id",
    "extra_heads_num_heads", "extra_heads_dim", "bias_proj", "norm_emb", "kv_repeat",
    "conditioners", "fuser", "cross_attention", "demux_second_stream",
    "demux_second_text_stream", "model_type", "stt_config", "lm_gen_config", "mimi_name",
    "tokenizer_name", "moshi_name", "lora"})
# keys that name where files are or what the model was trained from, and the depformer's
# sizes (a dep_q 0 model has no depformer: they describe nothing it computes)
_IGNORED_PREFIXES = ("depformer_",)
_IGNORED = frozenset({"model_id", "mimi_config_name", "quantize", "gradient_checkpointing",
                      "lora_rank", "lora_scaling", "tts_config"})


def _where(where: str, name: str) -> str:
    return f"{where}: field '{name}'"


# the transcriber the docs and the refusals name: English and French, with the VAD heads
SUGGESTED_CHECKPOINT = "kyutai/stt-1b-en_fr-candle"

# The built-in models' transcribers (export/synthetic.py writes them with random weights):
# config.json as Kyutai publishes stt-1b-en_fr-candle's - 32 codebooks, the 0.5 s delay, four
# VAD heads - at tiny widths; text_card is its tokenizer's size, filled in when it is written.
TRANSCRIBER_PRESETS: dict[str, dict[str, Any]] = {
    "demo": {
        "card": 2048, "n_q": 32, "dep_q": 0, "delays": [0] * 33, "dim": 64, "num_heads": 4,
        "num_layers": 2, "hidden_scale": 4.125, "context": 750, "max_period": 100000.0,
        "gating": "silu", "norm": "rms_norm_f32", "positional_embedding": "rope",
        "causal": True, "layer_scale": None, "existing_text_padding_id": TEXT_PAD,
        "extra_heads_num_heads": 4, "extra_heads_dim": 6, "model_type": STT_MODEL_TYPE,
        "stt_config": {"audio_delay_seconds": 0.5, "audio_silence_prefix_seconds": 0.0},
        "lm_gen_config": {"temp": 0.0, "temp_text": 0.0, "top_k": 250, "top_k_text": 50},
        "mimi_name": "mimi-pytorch-e351c8d8@125.safetensors",
        "tokenizer_name": "tokenizer_en_fr_audio_8000.model",
    },
}


def no_transcriber(model_dir=None) -> str:
    """Why a model cannot hear the user, with the command that adds a transcriber. A server
    passes no `model_dir`: its clients are not told where its files are."""
    model = "this model" if model_dir is None else f"the model {model_dir}"
    return (f"{model} has no transcriber to hear the user with; add one with personaplex-edge "
            f"export --transcriber {SUGGESTED_CHECKPOINT} --out {model_dir or 'DIR'}")


@dataclass(frozen=True)
class TranscriberConfig:
    """A Kyutai STT model, as the export and the runtime need it."""

    model_type: ClassVar[str] = STT_MODEL_TYPE

    temporal_config: HeliumConfig = field(default_factory=lambda: HeliumConfig(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=16, intermediate_size=5632,
        max_position_embeddings=750, rope_theta=100000.0))
    text_vocab_size: int = 8000  # text_card: the text head's rows
    text_embedding_rows: int = 8001  # + the initial text token's row
    audio_vocab_size: int = 2048  # card
    num_audio_codebooks: int = 32  # n_q: the Mimi codebooks it reads, all undelayed
    vad_heads: int = 0  # extra_heads_num_heads: 4 in stt-1b-en_fr-candle, else 0
    vad_classes: int = 6  # extra_heads_dim
    audio_delay_seconds: float = 0.5  # stt_config: its text runs this far behind the audio
    audio_silence_prefix_seconds: float = 0.0  # stt_config: silence its reference feeds first
    # existing_text_padding_id / existing_text_end_padding_id: PAD ("nothing this frame") and
    # EPAD ("a word starts next frame"), PersonaPlex's own unless the checkpoint says otherwise
    text_padding_id: int = TEXT_PAD
    end_of_padding_id: int = TEXT_EPAD
    tokenizer: str | None = None  # its SentencePiece model, a file of the model directory
    source: str = ""  # the checkpoint it was exported from, for the user's information
    source_revision: str | None = None
    lm_gen_config: dict[str, Any] = field(default_factory=dict)  # as published (the runtime
    #                                                             decodes greedily)

    def __post_init__(self):
        if self.text_embedding_rows != self.text_vocab_size + 1:
            raise ConfigError(f"transcriber: text_embedding_rows {self.text_embedding_rows} "
                              f"must be text_vocab_size + 1 ({self.text_vocab_size + 1})")
        if self.vad_heads and self.vad_classes < 1:
            raise ConfigError(f"transcriber: vad_classes {self.vad_classes} must be at least 1")

    @property
    def num_streams(self) -> int:
        """Tokens per column: the text stream and the audio codebooks."""
        return 1 + self.num_audio_codebooks

    def delay_frames(self, frame_rate: float) -> int:
        """Frames its text runs behind the audio (whole frames, rounded up)."""
        return math.ceil(self.audio_delay_seconds * frame_rate - 1e-9)

    def initial_tokens(self) -> list[int]:
        """[1 + n_q]: each stream's initial token (one past its vocabulary), what the first
        step reads everywhere."""
        return [self.text_vocab_size] + [self.audio_vocab_size] * self.num_audio_codebooks

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["model_type"] = self.model_type
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "transcriber") -> "TranscriberConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be an object")
        data = {k: v for k, v in data.items() if k != "model_type"}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
        if isinstance(data.get("temporal_config"), dict):
            data["temporal_config"] = HeliumConfig(**data["temporal_config"])
        try:
            return cls(**data)
        except TypeError as e:
            raise ConfigError(f"{where}: {e}") from None

    @classmethod
    def from_kyutai(cls, raw: dict[str, Any], where: str) -> "TranscriberConfig":
        """Kyutai's config.json (moshi's LMModel arguments at the top level) -> the config.
        What is not an STT model, or not one this port computes exactly, is a ConfigError
        naming `where` (the file) and the field."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{where} is not a JSON object")
        kind = raw.get("model_type")
        if kind != STT_MODEL_TYPE:
            raise ConfigError(f"{_where(where, 'model_type')} is {kind!r}, not 'stt': not a "
                              "Kyutai speech-to-text checkpoint (kyutai/stt-1b-en_fr-candle, "
                              "kyutai/stt-1b-en_fr or kyutai/stt-2.6b-en)")
        unknown = sorted(k for k in raw if k not in _READ and k not in _IGNORED
                         and not k.startswith(_IGNORED_PREFIXES))
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}: not a layout "
                              "this version reads")

        def need(name, kind=int):
            value = raw.get(name)
            if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
                raise ConfigError(f"{_where(where, name)} is {value!r}: must be a number above 0")
            return value

        def equal(name, want, default, why):
            value = raw.get(name, default)
            if value != want:
                raise ConfigError(f"{_where(where, name)} is {value!r}: {why}")

        equal("dep_q", 0, None, "a speech-to-text model has no depformer (dep_q 0); this is "
              "a speech model (PersonaPlex, Moshi, a TTS): give --checkpoint that one")
        n_q = need("n_q")
        delays = raw.get("delays")
        if not isinstance(delays, list) or len(delays) != n_q + 1:
            raise ConfigError(f"{_where(where, 'delays')} must list {n_q + 1} delays (text and "
                              f"n_q {n_q} codebooks)")
        if any(d != 0 for d in delays):
            raise ConfigError(f"{_where(where, 'delays')} is {delays}: this port reads every "
                              "stream on time, as Kyutai's STT models do (all 0)")
        equal("gating", "silu", None, "only the SiLU-gated MLP is implemented")
        equal("positional_embedding", "rope", "sin", "only RoPE is implemented")
        equal("causal", True, False, "a streaming model is causal")
        equal("layer_scale", None, None, "layer scales are not implemented")
        equal("bias_proj", False, False, "the text head has no bias in this port")
        equal("norm_emb", False, False, "normalised embeddings are not implemented")
        equal("kv_repeat", 1, 1, "grouped KV heads are not implemented")
        equal("cross_attention", False, False, "cross-attention is not implemented")
        equal("demux_second_stream", False, False, "one text stream only")
        equal("demux_second_text_stream", False, False, "one text stream only")
        equal("lora", False, False, "LoRA weights are not read; fuse them first")
        if raw.get("conditioners") not in (None, {}) or raw.get("fuser") is not None:
            raise ConfigError(f"{_where(where, 'conditioners')}: conditioning is not "
                              "implemented")
        norm = raw.get("norm")
        eps = {"rms_norm_f32": 1e-8, "rms_norm": 1e-5}.get(norm)
        if eps is None:
            raise ConfigError(f"{_where(where, 'norm')} is {norm!r}: RMSNorm (rms_norm_f32 or "
                              "rms_norm) is implemented")
        dim, heads = need("dim"), need("num_heads")
        if dim % heads:
            raise ConfigError(f"{_where(where, 'num_heads')} {heads} must divide dim {dim}")
        scale = need("hidden_scale", (int, float))
        ff = int(scale * dim)
        hidden = (21 * dim) // 8 if ff == 4 * dim else (2 * ff) // 3  # moshi's gating sizes
        text_card, card = need("text_card"), need("card")
        if raw.get("text_card_out") not in (None, text_card):
            raise ConfigError(f"{_where(where, 'text_card_out')} must equal text_card "
                              f"{text_card}")
        stt, gen = (raw.get(name) or {} for name in ("stt_config", "lm_gen_config"))
        for name, value in (("stt_config", stt), ("lm_gen_config", gen)):
            if not isinstance(value, dict):
                raise ConfigError(f"{_where(where, name)} must be an object")

        def at_least_0(name, value, kinds, what):
            if isinstance(value, bool) or not isinstance(value, kinds) or value < 0:
                raise ConfigError(f"{_where(where, name)} is {value!r}: must be {what}")
            return value

        delay, prefix = (at_least_0(f"stt_config.{name}", stt.get(name, 0.0), (int, float),
                                    "a number of seconds, 0 or more")
                         for name in ("audio_delay_seconds", "audio_silence_prefix_seconds"))
        vad_heads, vad_classes = (at_least_0(name, raw.get(name, default), int,
                                             "a whole number")
                                  for name, default in (("extra_heads_num_heads", 0),
                                                        ("extra_heads_dim", 6)))
        helium = HeliumConfig(hidden_size=dim, num_hidden_layers=need("num_layers"),
                              num_attention_heads=heads, intermediate_size=hidden,
                              max_position_embeddings=need("context"),
                              rope_theta=float(need("max_period", (int, float))),
                              rms_norm_eps=eps)
        return cls(temporal_config=helium, text_vocab_size=text_card,
                   text_embedding_rows=text_card + 1, audio_vocab_size=card,
                   num_audio_codebooks=n_q, vad_heads=vad_heads, vad_classes=vad_classes,
                   audio_delay_seconds=float(delay), audio_silence_prefix_seconds=float(prefix),
                   text_padding_id=int(raw.get("existing_text_padding_id", TEXT_PAD)),
                   end_of_padding_id=int(raw.get("existing_text_end_padding_id", TEXT_EPAD)),
                   lm_gen_config=dict(gen))
