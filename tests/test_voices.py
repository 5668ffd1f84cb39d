"""The torch-free voice bank reader (personaplex_edge.voices) on hand-made banks; the export side
(voices.tgz of torch .pt files -> voices.npz) is covered end to end in test_real_layout.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from personaplex_edge.config import preset
from personaplex_edge.errors import ModelDirError, VoiceError
from personaplex_edge.manifest import Manifest
from personaplex_edge.voices import (available_voices, bf16_bits_to_float32, load_voice)

D = preset("tiny").temporal_config.hidden_size


def _manifest(voices="voices.npz") -> Manifest:
    return Manifest(config=preset("tiny"), graphs={}, contents=["codec", "lm"], voices=voices)


@pytest.fixture
def bank(tmp_path):
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((6, D)).astype(np.float32)
    bf16 = (f32.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bf16 bit patterns
    cache = rng.integers(0, 2048, (17, 4))
    np.savez(tmp_path / "voices.npz", **{
        "NATF2.embeddings_bf16": bf16, "NATF2.cache": cache,
        "VARM0.embeddings": f32, "VARM0.cache": cache[:, :3]})
    return tmp_path, f32, bf16, cache


def test_names_and_both_storage_forms(bank):
    root, f32, bf16, cache = bank
    m = _manifest()
    assert available_voices(root, m) == ["NATF2", "VARM0"]
    natf2 = load_voice(root, m, "NATF2")
    np.testing.assert_array_equal(natf2.embeddings.view(np.uint32),
                                  bf16.astype(np.uint32) << 16)
    assert natf2.embeddings.dtype == np.float32 and natf2.frames == 6
    np.testing.assert_array_equal(natf2.cache, cache)
    varm0 = load_voice(root, m, "VARM0.pt")
    np.testing.assert_array_equal(varm0.embeddings, f32)
    assert varm0.cache.shape == (17, 3) and varm0.cache.dtype == np.int64


def test_bf16_bits_round_trip():
    x = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)  # exactly representable in bf16
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(bf16_bits_to_float32(bits), x)


def test_name_spellings(bank):
    root, *_ = bank
    m = _manifest()
    for spelling in ("natf2", "NATF2.pt", "voices/NATF2.pt", "NatF2.PT"):
        assert load_voice(root, m, spelling).name == "NATF2"


def test_unknown_voice_and_missing_bank(bank, tmp_path):
    root, *_ = bank
    with pytest.raises(VoiceError, match=r"no voice 'NATM1'.*available: NATF2, VARM0"):
        load_voice(root, _manifest(), "NATM1")
    with pytest.raises(VoiceError, match="has no voice bank"):
        available_voices(root, _manifest(voices=None))
    with pytest.raises(ModelDirError, match="missing"):
        load_voice(tmp_path / "elsewhere", _manifest(), "NATF2")


def test_voice_of_another_width_is_refused(tmp_path):
    np.savez(tmp_path / "voices.npz", **{"X.embeddings": np.zeros((2, D + 1), np.float32),
                                         "X.cache": np.zeros((17, 4), np.int64)})
    with pytest.raises(ModelDirError, match=rf"\[N, {D}\]"):
        load_voice(tmp_path, _manifest(), "X")


def test_runtime_modules_do_not_import_torch():
    code = ("import sys, personaplex_edge.voices, personaplex_edge.loudness; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
