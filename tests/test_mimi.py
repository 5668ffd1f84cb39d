"""The codec against the reference: moshi's streaming Mimi with random weights and randomised
codebooks, frame by frame, past the point where the KV window wraps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moshi_reference import reference_mimi, reference_stream, save_published, tie_free
from personaplex_edge.config import PersonaPlexConfig
from personaplex_edge.export.hub import MIMI_FILE, resolve_checkpoint
from personaplex_edge.export.mimi import load_mimi
from personaplex_edge.export.model_export import export_model
from personaplex_edge.export.onnx_export import initial_state
from personaplex_edge.export.streaming import advance
from personaplex_edge.runtime.codec import Codec

FRAMES = 140  # > 125: the real 250-slot window wraps; the tiny one (16) wraps many times


def _speechlike(frames: int, frame_size: int, seed: int = 0) -> np.ndarray:
    """Noise with a slow envelope and some silence, so codes see varied input."""
    rng = np.random.default_rng(seed)
    n = frames * frame_size
    t = np.arange(n) / 24000
    env = 0.05 + 0.3 * np.abs(np.sin(2 * np.pi * 0.7 * t))
    env[n // 3: n // 3 + 4 * frame_size] = 0.0
    return (rng.standard_normal(n) * env).astype(np.float32)


@pytest.fixture(scope="module")
def tiny_reference_run(tiny_cfg, tiny_mimi_ref):
    frame = tiny_cfg.mimi_config.samples_per_frame
    pcm, (codes, out) = tie_free(
        lambda x: reference_stream(tiny_mimi_ref, torch.from_numpy(x), frame),
        lambda seed: _speechlike(FRAMES, frame, seed))
    return pcm, codes.numpy(), out.numpy()


def test_reference_codes_are_not_degenerate(tiny_reference_run):
    """Guards the other tests: with default buffers every code is 0 and parity means nothing."""
    _, codes, _ = tiny_reference_run
    for k in range(codes.shape[1]):
        assert len(np.unique(codes[:, k])) >= 8, f"codebook {k} barely varies"


def test_torch_modules_match_reference(tiny_cfg, tiny_codec_checkpoint, tiny_reference_run):
    pcm, ref_codes, ref_out = tiny_reference_run
    mimi = load_mimi(tiny_codec_checkpoint / MIMI_FILE, tiny_cfg.mimi_config)
    frame = tiny_cfg.mimi_config.samples_per_frame
    enc_rings, dec_rings = mimi.encoder_rings(), mimi.decoder_rings()
    enc_state = initial_state(mimi.encoder_state()) | {
        r.input_name: torch.zeros(r.shape) for r in enc_rings}
    dec_state = initial_state(mimi.decoder_state()) | {
        r.input_name: torch.zeros(r.shape) for r in dec_rings}
    with torch.no_grad():
        for i in range(FRAMES):
            codes, new = mimi.encode_step(torch.from_numpy(pcm[i * frame:(i + 1) * frame])
                                          .view(1, 1, -1), enc_state)
            advance(enc_state, new, enc_rings)
            assert np.array_equal(codes[0].numpy(), ref_codes[i]), f"frame {i}"
            # decode the reference's codes so a code mismatch cannot hide a decoder error
            out, new = mimi.decode_step(torch.from_numpy(ref_codes[i])[None], dec_state)
            advance(dec_state, new, dec_rings)
            np.testing.assert_allclose(out[0, 0].numpy(), ref_out[i * frame:(i + 1) * frame],
                                       atol=1e-4, err_msg=f"frame {i}")


def test_onnx_graphs_match_reference(tiny_codec_dir, tiny_reference_run):
    pcm, ref_codes, ref_out = tiny_reference_run
    codec = Codec.load(tiny_codec_dir, device="cpu")
    codes = codec.encode(pcm)
    assert codes.dtype == np.int64 and codes.shape == ref_codes.shape
    mismatched = np.flatnonzero((codes != ref_codes).any(axis=1))
    assert mismatched.size == 0, f"codes differ from the reference at frames {mismatched[:10]}"
    np.testing.assert_allclose(codec.decode(ref_codes), ref_out, atol=1e-4)


def test_reset_gives_identical_codes(tiny_codec_dir, tiny_reference_run):
    pcm = tiny_reference_run[0][:30 * 1920]
    codec = Codec.load(tiny_codec_dir, device="cpu")
    first = codec.encode(pcm)
    codec.encode(pcm[::-1].copy())  # disturb the state
    disturbed = codec.encode(pcm)
    assert not np.array_equal(first, disturbed), "state should carry across calls"
    codec.reset()
    np.testing.assert_array_equal(codec.encode(pcm), first)
    codec.reset()
    out_a = codec.decode(first)
    codec.reset()
    np.testing.assert_array_equal(codec.decode(first), out_a)


@pytest.mark.slow
def test_real_size_onnx_matches_reference(tmp_path):
    """The real Mimi size (random weights): the ONNX graphs against moshi's streaming Mimi."""
    torch.set_num_threads(2)
    cfg = PersonaPlexConfig()
    ref = reference_mimi(cfg.mimi_config, seed=1)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_published(ref, ckpt / MIMI_FILE)
    export_model(resolve_checkpoint(str(ckpt), with_lm=False), tmp_path / "model",
                 progress=lambda s: None)
    frames = 130
    pcm, (ref_codes, ref_out) = tie_free(
        lambda x: reference_stream(ref, torch.from_numpy(x), cfg.mimi_config.samples_per_frame),
        lambda seed: _speechlike(frames, cfg.mimi_config.samples_per_frame, seed=1 + seed))
    codec = Codec.load(tmp_path / "model", device="cpu", threads=2)
    codes = codec.encode(pcm)
    assert len(np.unique(ref_codes.numpy()[:, 0])) >= 8
    mismatched = np.flatnonzero((codes != ref_codes.numpy()).any(axis=1))
    assert mismatched.size == 0, f"codes differ from the reference at frames {mismatched[:10]}"
    np.testing.assert_allclose(codec.decode(ref_codes.numpy()), ref_out.numpy(), atol=1e-4)
