"""Helium + depformer against moshi's LMModel / LMGen (random weights, tiny widths, real layout).

The reference is driven by moshi's own LMGen (greedy, fixed user codes); ours by
personaplex_edge.streams.TokenRing, so the schedule is tested along with the modules.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest_lm import FRAMES, OrtLM, TorchLM, lm_bundle, lm_graphs, lm_modules, run_schedule

from personaplex_edge.config import PersonaPlexConfig, preset
from personaplex_edge.errors import CheckpointError
from personaplex_edge.export.checkpoint import TensorFile
from personaplex_edge.export.lm import expected_lm_tensors, load_lm
from personaplex_edge.gumbel import gumbel_noise
from personaplex_edge.streams import DELAYS, NUM_STREAMS, TokenRing, initial_tokens

ATOL = 1e-4


@pytest.fixture(scope="module")
def bundle():
    return lm_bundle()


@pytest.fixture(scope="module")
def modules(bundle):
    return lm_modules()


# ---- checkpoint layout --------------------------------------------------------------------------

def test_published_layout_matches_expected_shapes(bundle):
    tf = TensorFile(bundle.checkpoint)
    assert tf.shapes == expected_lm_tensors(bundle.cfg)
    assert {str(tf.get("out_norm.alpha", torch.bfloat16).dtype)} == {"torch.bfloat16"}
    # the 7B layout has 475 tensors (published model.safetensors)
    assert len(expected_lm_tensors(PersonaPlexConfig())) == 475
    assert expected_lm_tensors(PersonaPlexConfig())[
        "depformer.layers.0.self_attn.in_proj_weight"] == (16 * 3072, 1024)


@pytest.mark.parametrize("change, tensor", [
    ({"temporal_config": {"intermediate_size": 160}},
     "transformer.layers.0.gating.linear_in.weight"),
    ({"depformer_config": {"dep_q": 12, "num_active_codebooks": 8}},
     "depformer.layers.0.self_attn.in_proj_weight"),
    ({"text_vocab_size": 31999, "text_embedding_rows": 32000}, "text_linear.weight"),
])
def test_config_disagreeing_with_checkpoint_names_the_tensor(bundle, change, tensor):
    base = preset("tiny").to_dict()
    for key, value in change.items():
        if isinstance(value, dict):
            base[key].update(value)
        else:
            base[key] = value
    cfg = PersonaPlexConfig.from_dict(base)
    with pytest.raises(CheckpointError, match=tensor.replace(".", r"\.")):
        load_lm(bundle.checkpoint, cfg)


def test_missing_tensor_is_reported(bundle, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(str(bundle.checkpoint))
    del state["linears.3.weight"]
    save_file(state, str(tmp_path / "broken.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'linears\.3\.weight'"):
        load_lm(tmp_path / "broken.safetensors", bundle.cfg)


# ---- token schedule -----------------------------------------------------------------------------

def test_token_ring_initial_columns():
    cfg = preset("tiny")
    ring = TokenRing(cfg)
    init = initial_tokens(cfg)
    assert init[0] == 32000 and set(init[1:]) == {2048}
    ring.write_user(np.arange(8)[None] + 100)
    np.testing.assert_array_equal(ring.step_input()[0], init)  # frame 0: all initial
    ring.write_generated(np.array([5]), np.arange(8)[None] + 200)
    assert ring.output() is None
    ring.write_user(np.arange(8)[None] + 300)
    col = ring.step_input()[0]
    delayed = np.asarray(DELAYS) == 1
    np.testing.assert_array_equal(col[delayed], init[delayed])  # frame 1: delayed still initial
    assert (col[0], col[1], col[9]) == (5, 200, 300)  # text, agent cb0, user cb0 of this frame
    ring.write_generated(np.array([6]), np.arange(8)[None] + 400)
    out = ring.output()[0]
    # text and cb0 of the previous step, cb1..7 of this step
    np.testing.assert_array_equal(out, [5, 200] + list(range(401, 408)))
    ring.write_user(np.arange(8)[None] + 500)
    col = ring.step_input()[0]
    np.testing.assert_array_equal(col[1:9], [400] + list(range(401, 408)))
    np.testing.assert_array_equal(col[9:], [500] + list(range(301, 308)))
    assert col.shape == (NUM_STREAMS,)


def test_token_ring_refuses_unwritten_user_codes():
    cfg = preset("tiny")
    ring = TokenRing(cfg)
    for _ in range(2):
        ring.write_user(np.zeros((1, 8)))
        ring.step_input()
        ring.write_generated(np.zeros(1), np.zeros((1, 8)))
    with pytest.raises(RuntimeError, match="never written"):
        ring.step_input()  # user cb0 of this frame was not written


# ---- temporal transformer -----------------------------------------------------------------------

def test_ring_mask_is_the_reference_window(modules):
    helium, _ = modules
    T = helium.context
    for pos in range(3 * T + 2):
        visible = helium.visible_slots(torch.tensor([pos]), torch.arange(1))[0, 0, 0].numpy()
        # brute force: the positions each slot holds before the step, then the window rule
        held = {p % T: p for p in range(pos)}
        want = np.array([j in held and pos - held[j] < T for j in range(T)])
        np.testing.assert_array_equal(visible, want, err_msg=f"position {pos}")
        assert visible.sum() + 1 == min(pos + 1, T)  # plus the new row: the last T positions


def test_ring_mask_of_several_frames_is_each_frames_window(modules):
    """A call over F frames at pos..pos+F-1 (the batched persona prefill): frame f sees the
    ring slots whose position is within its own window of T (and the call's frames 0..f)."""
    helium, _ = modules
    T = helium.context
    F = 7
    for pos in list(range(0, 2 * T, 5)) + [T - 3, T - 1]:
        visible = helium.visible_slots(torch.tensor([pos]), torch.arange(F))[0, 0].numpy()
        held = {p % T: p for p in range(pos)}  # what the ring holds before the call
        for f in range(F):
            want = np.array([j in held and pos + f - held[j] < T for j in range(T)])
            np.testing.assert_array_equal(visible[f], want, err_msg=f"position {pos} frame {f}")


def test_temporal_hidden_and_text_logits_match_reference(bundle, modules):
    """Teacher-forced with the reference's own tokens, so only Helium and the schedule count."""
    helium, depformer = modules
    ref = bundle.ref_run
    ours = TorchLM(bundle.cfg, helium, depformer)
    ring = TokenRing(bundle.cfg)
    for t in range(FRAMES):
        ring.write_user(bundle.user_codes[t].numpy()[None])
        logits, hidden = ours.temporal(ring.step_input(), ring.position)
        np.testing.assert_allclose(logits[0], ref["text_logits"][t], atol=ATOL, rtol=0,
                                   err_msg=f"text logits, frame {t}")
        np.testing.assert_allclose(hidden[0], ref["hidden"][t], atol=ATOL, rtol=0,
                                   err_msg=f"hidden, frame {t}")
        ring.write_generated(ref["text"][t:t + 1].numpy(), ref["audio"][t:t + 1].numpy())
    assert FRAMES > helium.context + 20  # the KV ring wrapped


def test_extra_embedding_adds_to_the_input(bundle, modules):
    """A voice prompt arrives as summed input embeddings: tokens -1 + extra == the tokens."""
    helium, _ = modules
    ref = bundle.ref
    tokens = torch.tensor([[17, 5, 9, 2048, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, -1]])
    summed = ref.text_emb(tokens[:, 0]) + sum(ref.emb[k](tokens[:, 1 + k]) for k in range(16))
    ring = [(torch.randn(helium.kv_shape(1)), torch.randn(helium.kv_shape(1)))
            for _ in helium.layers]
    pos = torch.tensor([helium.context + 5])
    with torch.no_grad():
        a, _, _ = helium.forward_logits(tokens, torch.zeros(1, 64), pos, ring)
        b, _, _ = helium.forward_logits(torch.full_like(tokens, -1), summed, pos, ring)
        c, _, _ = helium.forward_logits(torch.full_like(tokens, -1), torch.zeros(1, 64), pos, ring)
    np.testing.assert_allclose(a, b, atol=ATOL)
    assert (a - c).abs().max() > 0.1


# ---- depformer ----------------------------------------------------------------------------------

@torch.no_grad()
def test_depformer_teacher_forced_logits_match_reference(bundle, modules):
    _, depformer = modules
    ref = bundle.ref
    B = 3
    gen = torch.Generator().manual_seed(11)
    hidden = torch.randn(B, bundle.cfg.temporal_config.hidden_size, generator=gen)
    text = torch.randint(0, 32000, (B,), generator=gen)
    audio = torch.randint(0, 2048, (B, 8), generator=gen)
    want = []
    with ref.depformer.streaming(B):
        prev = text
        for k in range(8):
            want.append(ref.forward_depformer(k, prev[:, None, None], hidden[:, None])[:, 0, 0])
            prev = audio[:, k]
    got = depformer.forward_teacher(hidden, text, audio)  # [B, 8, card]
    for k in range(8):
        np.testing.assert_allclose(got[:, k], want[k], atol=ATOL, rtol=0, err_msg=f"step {k}")
    # each step's logits depend on the token fed back from the step before
    other = audio.clone()
    other[:, 2] = (other[:, 2] + 1) % 2048
    changed = depformer.forward_teacher(hidden, text, other)
    assert torch.equal(changed[:, :3], got[:, :3]) and (changed[:, 3] - got[:, 3]).abs().max() > 0


# ---- greedy generation --------------------------------------------------------------------------

def _assert_same_tokens(bundle, text, audio, outputs):
    ref = bundle.ref_run
    np.testing.assert_array_equal(text, ref["text"].numpy())
    np.testing.assert_array_equal(audio, ref["audio"].numpy())
    np.testing.assert_array_equal(outputs, ref["outputs"].numpy())
    assert len(np.unique(audio[:, 0])) > 10  # the run is not stuck on one token


def test_greedy_tokens_match_lmgen_torch(bundle, modules):
    ours = TorchLM(bundle.cfg, *modules)

    def frame(tokens, position):
        text, audio, _, _ = ours.greedy_frame(tokens, position)
        return text, audio

    _assert_same_tokens(bundle, *run_schedule(bundle.cfg, bundle.user_codes, frame))


def test_greedy_tokens_match_lmgen_onnx(bundle):
    graph_dir, _ = lm_graphs()
    ours = OrtLM(bundle.cfg, graph_dir)
    zeros_text, zeros_audio = np.zeros((1, 250), np.float32), np.zeros((1, 8, 250), np.float32)

    def frame(tokens, position):
        text, audio, _ = ours.frame(tokens, position, zeros_text, zeros_audio)
        return text, audio

    _assert_same_tokens(bundle, *run_schedule(bundle.cfg, bundle.user_codes, frame))


def test_sampled_onnx_matches_torch_with_the_same_noise(bundle, modules):
    """Sampling path: the graphs and the torch modules draw the same tokens from the same noise,
    and the noise changes the tokens."""
    from personaplex_edge.export.sampling import sample_top_k

    helium, depformer = modules
    graph_dir, _ = lm_graphs()
    onnx_lm, torch_lm = OrtLM(bundle.cfg, graph_dir), TorchLM(bundle.cfg, helium, depformer)
    rng = np.random.default_rng(5)
    ring = TokenRing(bundle.cfg)
    differs_from_greedy = 0
    for t in range(12):
        ring.write_user(bundle.user_codes[t].numpy()[None])
        tokens = ring.step_input()
        tn, an = gumbel_noise(rng, (1, 250)), gumbel_noise(rng, (1, 8, 250))
        text, audio, hidden = onnx_lm.frame(tokens, ring.position, tn, an)
        logits, h = torch_lm.temporal(tokens, ring.position)
        want_text = sample_top_k(logits, torch.from_numpy(tn), torch.tensor([0.7]),
                                 torch.tensor([25]))
        with torch.no_grad():
            want_audio = depformer.step(h, want_text, torch.from_numpy(an), torch.tensor([0.8]),
                                        torch.tensor([250]))
        np.testing.assert_allclose(hidden, h, atol=ATOL)
        np.testing.assert_array_equal(text, want_text.numpy())
        np.testing.assert_array_equal(audio, want_audio.numpy())
        differs_from_greedy += int(text[0] != logits.argmax(-1).item())
        ring.write_generated(text, audio)
    assert differs_from_greedy > 0


def test_export_entries_describe_the_graphs(bundle):
    graph_dir, entries = lm_graphs()
    h = bundle.cfg.temporal_config
    helium = entries["helium_step"]
    names = [s.name for s in helium.inputs]
    assert names[:6] == ["tokens", "extra_embedding", "position", "text_noise",
                         "text_temperature", "text_top_k"]
    ring = [s for s in helium.inputs if s.name.startswith("past_key_values.")]
    assert len(ring) == 2 * h.num_hidden_layers
    assert {s.shape for s in ring} == {(1, h.num_attention_heads, h.max_position_embeddings,
                                        h.head_dim)}
    rows = {s.name: s.shape for s in helium.outputs if s.name.startswith("present.")}
    assert rows == {f"present.{i}.{kind}": (1, h.num_attention_heads, 1, h.head_dim)
                    for i in range(h.num_hidden_layers) for kind in ("key", "value")}
    dep = entries["depformer_step"]
    assert [(s.name, s.shape, s.dtype) for s in dep.outputs] == [("audio_tokens", (1, 8), "int64")]
    assert (graph_dir / helium.file).is_file() and (graph_dir / dep.file).is_file()


def test_inactive_depformer_steps_are_not_built(bundle, modules):
    _, depformer = modules
    assert bundle.cfg.depformer_config.dep_q == 16  # the checkpoint holds 16 steps ...
    assert depformer.steps == 8 and len(depformer.linears) == 8  # ... 8 are built
    assert len(depformer.layers[0].in_projs) == 8 and len(depformer.audio_emb) == 7
    # step 7's slice of the packed weights is the 8th block of rows, not another one
    dim = bundle.cfg.depformer_config.hidden_size
    packed = bundle.ref.depformer.layers[0].self_attn.in_projs[7].weight
    torch.testing.assert_close(depformer.layers[0].in_projs[7].weight, packed, rtol=0, atol=0)
    assert depformer.layers[0].in_projs[7].weight.shape == (3 * dim, dim)
