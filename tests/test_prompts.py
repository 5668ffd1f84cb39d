"""The persona prefill layout: forced frames through the stream delays, as the reference's
token cache lays them out (see runtime/prompts.py)."""

from __future__ import annotations

import numpy as np

from personaplex_edge.config import preset
from personaplex_edge.streams import (AGENT_FIRST, SILENCE_TOKENS, SINE_TOKENS, TEXT_PAD,
                                      USER_FIRST, initial_tokens)
from personaplex_edge.runtime.prompts import build_prefill, forced_frame, wrap_text_prompt

CFG = preset("tiny")
INITIAL = initial_tokens(CFG)
ACOUSTIC = [AGENT_FIRST + k for k in range(1, 8)] + [USER_FIRST + k for k in range(1, 8)]
ON_TIME = [0, AGENT_FIRST, USER_FIRST]


def _frames(n):
    """Distinct frames: text 10+f, agent codes 100*f+k, user codes sine."""
    return [forced_frame(10 + f, [100 * f + k for k in range(8)]) for f in range(n)]


def test_columns_delay_the_acoustic_codebooks_by_one_frame():
    frames = _frames(5)
    plan = build_prefill(INITIAL, frames)
    assert len(plan) == 5 and all(e is None for e in plan.embeddings)
    np.testing.assert_array_equal(plan.columns[0], INITIAL)  # column 0: all initial tokens
    np.testing.assert_array_equal(plan.columns[1][ACOUSTIC], INITIAL[ACOUSTIC])
    for c in range(1, 5):
        np.testing.assert_array_equal(plan.columns[c][ON_TIME], frames[c][ON_TIME])
        if c >= 2:
            np.testing.assert_array_equal(plan.columns[c][ACOUSTIC], frames[c - 1][ACOUSTIC])
    # the column after the prompts: only the last frame's acoustic codebooks are known
    np.testing.assert_array_equal(plan.pending[ACOUSTIC], frames[4][ACOUSTIC])
    assert (plan.pending[ON_TIME] == -2).all()


def test_stored_voice_prompt_replays_embeddings_then_restores_the_cache():
    n, d = 4, CFG.temporal_config.hidden_size
    emb = np.arange(n * d, dtype=np.float32).reshape(n, d)
    cache = np.arange(17 * 4, dtype=np.int64).reshape(17, 4) + 500  # [17, 4] ring of columns
    frames = _frames(3)
    plan = build_prefill(INITIAL, frames, emb, cache)
    assert len(plan) == n + 1 + 3
    for i in range(n):  # embeddings replace the token sum: every stream embeds to zero
        assert (plan.columns[i] == -1).all()
        np.testing.assert_array_equal(plan.embeddings[i], emb[i])
    np.testing.assert_array_equal(plan.columns[n], cache[:, n % 4])
    first = plan.columns[n + 1]  # the first forced frame after the voice
    np.testing.assert_array_equal(first[ON_TIME], frames[0][ON_TIME])
    np.testing.assert_array_equal(first[ACOUSTIC], cache[ACOUSTIC, (n + 1) % 4])


def test_persona_order_and_text_wrapping():
    assert wrap_text_prompt("  be kind ") == "<system> be kind <system>"
    assert wrap_text_prompt("<system> x <system>") == "<system> x <system>"
    silence = forced_frame(TEXT_PAD, SILENCE_TOKENS)
    np.testing.assert_array_equal(silence[USER_FIRST:], SINE_TOKENS)
    np.testing.assert_array_equal(silence[AGENT_FIRST:USER_FIRST], SILENCE_TOKENS)


def test_persona_prompt_frames_follow_the_reference_order(demo_model_dir):
    from personaplex_edge.manifest import load_model_dir
    from personaplex_edge.runtime.prompts import prompt_frames
    from personaplex_edge.runtime.words.text import TextTokenizer

    voice = np.array([[7] * 8, [8] * 8])
    text = TextTokenizer(demo_model_dir, load_model_dir(demo_model_dir))
    tokens = text.encode(wrap_text_prompt("hello there"))
    frames = prompt_frames(tokens, voice_codes=voice)
    assert len(frames) == 2 + 6 + len(tokens) + 6
    np.testing.assert_array_equal(frames[0][AGENT_FIRST:USER_FIRST], voice[0])
    assert [f[0] for f in frames[8:8 + len(tokens)]] == tokens
    for f in frames[2:8] + frames[-6:]:
        np.testing.assert_array_equal(f, forced_frame(TEXT_PAD, SILENCE_TOKENS))
