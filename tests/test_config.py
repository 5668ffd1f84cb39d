"""The config layout of the seed (vllm-omni's PersonaPlex integration): what a vllm-omni user's
config.json holds loads, what this runtime cannot honour is refused naming the field, and the
layout this project wrote before still loads."""

from __future__ import annotations

import dataclasses
import json

import pytest

from personaplex_edge.config import (PersonaPlexConfig, PersonaPlexDepformerConfig,
                                     PersonaPlexMimiConfig, preset)
from personaplex_edge.errors import ConfigError

# What transformers' save_pretrained writes for a PersonaPlexConfig in the seed's layout: the
# generic keys of every PretrainedConfig at the top and in each sub-config.
VLLM_OMNI_CONFIG = {
    "architectures": ["PersonaPlexTalkerForConditionalGeneration"],
    "model_type": "personaplex",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.57.1",
    "text_vocab_size": 32000,
    "text_embedding_rows": 32001,
    "audio_vocab_size": 2048,
    "num_audio_codebooks": 16,
    "mimi_name": "tokenizer-e351c8d8-checkpoint125.safetensors",
    "temporal_config": {"model_type": "personaplex_helium", "hidden_size": 4096,
                        "num_hidden_layers": 32, "num_attention_heads": 32,
                        "num_key_value_heads": 32, "intermediate_size": 11264,
                        "max_position_embeddings": 3000, "rope_theta": 10000.0,
                        "rms_norm_eps": 1e-8, "hidden_act": "silu", "use_cache": True,
                        "torch_dtype": "bfloat16"},
    "depformer_config": {"model_type": "personaplex_depformer", "hidden_size": 1024,
                         "num_hidden_layers": 6, "num_attention_heads": 16,
                         "num_key_value_heads": 16, "head_dim": 64,
                         "max_position_embeddings": 8, "dep_q": 16, "num_active_codebooks": 8,
                         "card": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-8,
                         "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                         "intermediate_size": 2816, "use_cache": True},
    "mimi_config": {"model_type": "personaplex_mimi", "sample_rate": 24000, "frame_rate": 12.5,
                    "samples_per_frame": 1920, "num_codebooks": 8, "card": 2048,
                    "num_channels": 1, "mimi_name": None},
}


def test_a_vllm_omni_config_with_hugging_face_keys_loads_as_the_7b():
    cfg = PersonaPlexConfig.from_dict(json.loads(json.dumps(VLLM_OMNI_CONFIG)))
    assert cfg.temporal_config == PersonaPlexConfig().temporal_config
    assert cfg.depformer_config == PersonaPlexDepformerConfig()
    # the top-level mirror overrides the sub-config's value, as the seed documents
    assert cfg.mimi_config.mimi_name == "tokenizer-e351c8d8-checkpoint125.safetensors"
    assert cfg.mimi_name == cfg.mimi_config.mimi_name
    assert cfg.sample_rate == 24000 and cfg.mimi_config.samples_per_frame == 1920
    assert set(cfg.sub_configs) == {"temporal_config", "depformer_config", "mimi_config"}
    assert cfg.get_text_config() is cfg.temporal_config


def test_the_written_layout_is_the_seeds_and_round_trips():
    cfg = preset("tiny")
    d = cfg.to_dict()
    assert d["model_type"] == "personaplex"
    assert d["architectures"] == ["PersonaPlexTalkerForConditionalGeneration"]
    assert d["mimi_config"]["model_type"] == "personaplex_mimi"
    assert d["mimi_config"]["samples_per_frame"] == 1920
    assert "sampling_rate" not in d["mimi_config"] and "helium" not in d
    assert PersonaPlexConfig.from_dict(json.loads(cfg.to_json())) == cfg


def test_the_layout_written_before_still_loads():
    new = preset("tiny").to_dict()
    old = {"helium": {k: v for k, v in new["temporal_config"].items() if k != "model_type"},
           "depformer": new["depformer_config"],
           "mimi": {("sampling_rate" if k == "sample_rate" else
                     "codebook_size" if k == "card" else k): v
                    for k, v in new["mimi_config"].items()}}
    assert PersonaPlexConfig.from_dict(old) == preset("tiny")


# Every field of the seed's HeliumConfig (vllm-omni's configuration_helium), at its default, as
# its save_pretrained writes them: the documented ones and those beyond (REFERENCE.md).
SEED_HELIUM = {"model_type": "helium", "hidden_size": 4096, "num_hidden_layers": 32,
               "num_attention_heads": 32, "head_dim": 128, "num_key_value_heads": 32,
               "intermediate_size": 11264, "max_position_embeddings": 3000,
               "rope_theta": 10000.0, "rms_norm_eps": 1e-8, "vocab_size": 32000,
               "sliding_window": 3000, "hidden_act": "silu", "attention_bias": False,
               "mlp_bias": False, "tie_word_embeddings": False, "use_cache": True}


def test_the_seeds_full_helium_config_loads_as_the_7b():
    data = json.loads(json.dumps(VLLM_OMNI_CONFIG))
    data["temporal_config"] = dict(SEED_HELIUM)
    data["mimi_cuda_graphs"] = data["depformer_cuda_graphs"] = True  # vllm-omni's own switches
    cfg = PersonaPlexConfig.from_dict(data)
    helium = cfg.temporal_config
    assert (helium.hidden_size, helium.num_hidden_layers, helium.head_dim,
            helium.intermediate_size) == (4096, 32, 128, 11264)
    assert (helium.vocab_size, helium.sliding_window) == (32000, 3000)
    # the 7B, field for field, with the two sizes it leaves implied stated
    assert helium == dataclasses.replace(PersonaPlexConfig().temporal_config, vocab_size=32000,
                                         sliding_window=3000)
    # written back in the seed's layout, every field of it present, and read again
    written = cfg.to_dict()["temporal_config"]
    assert set(SEED_HELIUM) - {"model_type"} <= set(written)
    assert PersonaPlexConfig.from_dict(json.loads(cfg.to_json())) == cfg


def test_the_fields_beyond_the_documented_ones_default_to_what_the_model_is():
    """Absent, the vocabulary is the text vocabulary and the window the context: the demo's
    256-token vocabulary and 500-frame context need no vocab_size or sliding_window, and
    stating them so is the same model; a config edited through to_dict() stays consistent."""
    demo = preset("demo").to_dict()
    assert demo["temporal_config"]["vocab_size"] is None
    stated = json.loads(json.dumps(demo))
    stated["temporal_config"].update(vocab_size=256, sliding_window=500)
    assert PersonaPlexConfig.from_dict(stated).text_vocab_size == 256
    demo.update(text_vocab_size=300, text_embedding_rows=301)
    assert PersonaPlexConfig.from_dict(demo).text_vocab_size == 300


@pytest.mark.parametrize("field, value, message", [
    ("sliding_window", 2048, r"temporal_config\.sliding_window = 2048: .*max_position_embeddings "
                             r"\(3000\)"),
    ("vocab_size", 32001, r"temporal_config\.vocab_size = 32001: .*text_vocab_size \(32000\)"),
    ("tie_word_embeddings", True, r"temporal_config\.tie_word_embeddings = True: .*not "
                                  "implemented"),
    ("attention_bias", True, r"temporal_config\.attention_bias = True"),
    ("mlp_bias", True, r"temporal_config\.mlp_bias = True"),
    ("hidden_act", "gelu_pytorch_tanh", r"temporal_config\.hidden_act = 'gelu_pytorch_tanh'"),
    ("head_dim", 64, r"temporal_config\.head_dim = 64: 32 heads of it must make hidden_size 4096"),
    ("num_key_value_heads", 8, r"temporal_config\.num_key_value_heads = 8: grouped KV heads"),
    ("use_cache", "yes", r"temporal_config\.use_cache = 'yes': must be true or false"),
])
def test_each_seed_helium_value_the_runtime_cannot_honour_is_refused(field, value, message):
    data = json.loads(json.dumps(VLLM_OMNI_CONFIG))
    data["temporal_config"] = {**SEED_HELIUM, field: value}
    with pytest.raises(ConfigError, match=message):
        PersonaPlexConfig.from_dict(data)


@pytest.mark.parametrize("where, field, value, message", [
    ("temporal_config", "hidden_act", "gelu", r"temporal_config\.hidden_act = 'gelu'"),
    ("temporal_config", "attention_bias", True, r"temporal_config\.attention_bias = True"),
    ("temporal_config", "mlp_bias", True, r"temporal_config\.mlp_bias = True"),
    ("temporal_config", "num_key_value_heads", 8, r"temporal_config\.num_key_value_heads = 8"),
    ("depformer_config", "hidden_act", "relu", r"depformer_config\.hidden_act = 'relu'"),
    ("depformer_config", "mlp_bias", True, r"depformer_config\.mlp_bias = True"),
    ("depformer_config", "num_key_value_heads", 4,
     r"depformer_config\.num_key_value_heads = 4"),
    ("mimi_config", "samples_per_frame", 2000, r"mimi_config\.samples_per_frame = 2000"),
    ("mimi_config", "num_channels", 2, r"mimi_config\.num_channels = 2"),
    ("mimi_config", "card", 1024, r"mimi_config\.card = 1024"),
    # sizes and rates the arithmetic divides by: one message, never a ZeroDivisionError
    ("temporal_config", "num_attention_heads", 0, r"temporal_config\.num_attention_heads = 0"),
    ("depformer_config", "hidden_size", -8, r"depformer_config\.hidden_size = -8"),
    ("mimi_config", "frame_rate", 0, r"mimi_config\.frame_rate = 0"),
    ("mimi_config", "num_attention_heads", 0, r"mimi_config\.num_attention_heads = 0"),
    ("mimi_config", "upsampling_ratios", [8, 0, 5, 4],
     r"mimi_config\.upsampling_ratios = \[8, 0, 5, 4\]"),
    ("mimi_config", "sample_rate", "24k", r"mimi_config\.sample_rate = '24k'"),
    # the value given is the value named
    ("temporal_config", "mlp_bias", "yes", r"temporal_config\.mlp_bias = 'yes'"),
])
def test_a_value_the_runtime_cannot_honour_is_refused_naming_it(where, field, value, message):
    data = json.loads(json.dumps(VLLM_OMNI_CONFIG))
    data[where][field] = value
    with pytest.raises(ConfigError, match=message):
        PersonaPlexConfig.from_dict(data)


def test_a_misspelt_key_is_still_refused():
    for where in ("temporal_config", "depformer_config", "mimi_config"):
        data = json.loads(json.dumps(VLLM_OMNI_CONFIG))
        data[where]["num_hiden_layers"] = 3
        with pytest.raises(ConfigError, match=rf"{where}: unknown field\(s\) num_hiden_layers"):
            PersonaPlexConfig.from_dict(data)
    with pytest.raises(ConfigError, match="text_vocab_sise"):
        PersonaPlexConfig.from_dict({"text_vocab_sise": 3})


def test_an_old_and_a_new_name_of_one_field_are_refused_together():
    data = json.loads(json.dumps(VLLM_OMNI_CONFIG))
    data["mimi_config"]["sampling_rate"] = 16000
    with pytest.raises(ConfigError, match="sampling_rate and sample_rate name the same field"):
        PersonaPlexConfig.from_dict(data)


def test_frame_size_must_agree_with_the_rates():
    assert PersonaPlexMimiConfig(sample_rate=16000, samples_per_frame=1280,
                                 upsampling_ratios=(8, 5, 4, 4)).steps_per_frame == 2
    with pytest.raises(ConfigError, match="samples_per_frame = 1920: disagrees with sample_rate "
                                          "16000"):
        PersonaPlexMimiConfig(sample_rate=16000)
