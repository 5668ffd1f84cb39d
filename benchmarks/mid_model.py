"""The mid-size language model the benchmarks share.

Helium d 1024 x 8 layers with 16 heads, MLP 2816 and the 7B's context (3000), and the real
depformer (d 1024, 6 layers, 8 active steps): memory-bandwidth bound on a CPU, like the 7B on
its GPU, yet built and exported in about a minute. dep_q 8 (Moshi-7B's own setting) keeps the
reference's copy of depformer steps 8-15 out of memory; LMGen runs 8 steps either way.
"""

from __future__ import annotations

MID_LM = {"temporal_config": {"hidden_size": 1024, "num_hidden_layers": 8,
                              "num_attention_heads": 16, "intermediate_size": 2816,
                              "max_position_embeddings": 3000},
          "depformer_config": {"dep_q": 8, "num_active_codebooks": 8}}


def mid_config(tiny_codec: bool = False):
    """The mid LM with the real-size Mimi, or with the tests' tiny one where only the LM is
    measured and the codec would only cost export time."""
    import copy

    from personaplex_edge.config import PRESETS, PersonaPlexConfig

    d = copy.deepcopy(MID_LM)
    if tiny_codec:
        d["mimi_config"] = dict(PRESETS["tiny"]["mimi_config"])
    return PersonaPlexConfig.from_dict(d, where="benchmarks mid model")
