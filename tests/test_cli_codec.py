"""`personaplex-edge codec` as a user runs it, and the torch-free promise of the runtime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from personaplex_edge.audio import read_audio
from personaplex_edge.cli import main

SPEECH = Path(__file__).resolve().parent.parent / "personaplex_edge" / "data" / "hello.wav"


def test_codec_any_rate_stereo_to_codes_and_same_length(tiny_codec_dir, tmp_path, capsys):
    rate, seconds = 44100, 1.3
    t = np.arange(int(rate * seconds)) / rate
    stereo = np.stack([np.sin(2 * np.pi * 220 * t), 0.5 * np.sin(2 * np.pi * 330 * t)], 1) * 0.3
    src = tmp_path / "in.wav"
    sf.write(src, stereo, rate, subtype="PCM_24")
    rc = main(["codec", "--model", str(tiny_codec_dir), "--input", str(src),
               "--codes-out", str(tmp_path / "codes.npy"), "--output", str(tmp_path / "rec.wav"),
               "--device", "cpu"])
    assert rc == 0
    codes = np.load(tmp_path / "codes.npy")
    expected_len = round(len(t) * 24000 / rate)
    assert codes.dtype == np.int64
    assert codes.shape == (-(-expected_len // 1920), 8)
    rec, rec_rate = sf.read(tmp_path / "rec.wav")
    assert rec_rate == 24000 and rec.ndim == 1 and len(rec) == expected_len
    assert "frames" in capsys.readouterr().out


def test_resampling_keeps_a_tone_at_its_pitch(tmp_path):
    rate = 16000
    t = np.arange(rate) / rate
    sf.write(tmp_path / "tone.wav", 0.5 * np.sin(2 * np.pi * 1000 * t), rate)
    pcm = read_audio(tmp_path / "tone.wav")
    assert len(pcm) == 24000
    spectrum = np.abs(np.fft.rfft(pcm))
    assert abs(np.argmax(spectrum) * 24000 / len(pcm) - 1000) < 2


@pytest.mark.parametrize("kind", ["garbage", "empty", "nan", "missing", "truncated"])
def test_bad_input_one_message_no_output(kind, tiny_codec_dir, tmp_path, capsys):
    src = tmp_path / "in.wav"
    if kind == "garbage":
        src.write_bytes(b"RIFF....WAVEfmt not really a wav file" * 10)
    elif kind == "empty":
        sf.write(src, np.zeros((0, 1)), 24000)
    elif kind == "truncated":
        sf.write(src, np.zeros(24000, np.float32), 24000, subtype="PCM_16")
        data = src.read_bytes()
        src.write_bytes(data[:len(data) // 2])
    elif kind == "nan":
        data = np.zeros(4800, np.float32)
        data[100] = np.nan
        sf.write(src, data, 24000, subtype="FLOAT")
    out, codes = tmp_path / "out.wav", tmp_path / "codes.npy"
    rc = main(["codec", "--model", str(tiny_codec_dir), "--input", str(src),
               "--output", str(out), "--codes-out", str(codes), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.count("error:") == 1 and "Traceback" not in err
    assert {"garbage": "cannot read", "empty": "no audio", "nan": "NaN",
            "missing": "does not exist", "truncated": "is truncated"}[kind] in err
    assert not out.exists() and not codes.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["in.wav"] if kind != "missing" else [])


def test_unknown_model_lists_the_builtin_ones(tmp_path, capsys):
    rc = main(["codec", "--model", str(tmp_path / "nope"), "--input", str(SPEECH),
               "--output", str(tmp_path / "o.wav")])
    assert rc == 2
    assert "built-in model: tiny" in capsys.readouterr().err


def test_runtime_codec_runs_without_torch(tiny_codec_dir, tmp_path):
    """Import every runtime and core module and run the codec in a fresh interpreter where
    torch cannot load."""
    script = f"""
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not allowed in the runtime")
sys.meta_path.insert(0, _NoTorch())
import importlib, pkgutil
import personaplex_edge, personaplex_edge.runtime
# every module of the runtime (its rooms too: backends, audio_io, serve) and of the shared
# core, whether or not the codec path uses it
seen = 0
for pkg in (personaplex_edge.runtime, personaplex_edge):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if info.name.startswith(("personaplex_edge.export", "personaplex_edge.runtime.")) \
                and pkg is personaplex_edge:
            continue
        importlib.import_module(info.name)
        seen += 1
assert seen > 40, seen
from personaplex_edge.cli import main
rc = main(["codec", "--model", {str(tiny_codec_dir)!r}, "--input", {str(SPEECH)!r},
           "--output", {str(tmp_path / 'r.wav')!r}, "--device", "cpu"])
assert rc == 0, rc
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch imported"
print("TORCH-FREE OK")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "TORCH-FREE OK" in done.stdout
    assert (tmp_path / "r.wav").is_file()
