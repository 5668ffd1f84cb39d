"""Audio files in and out: any readable file -> float32 mono at the model rate, and atomic writes.

Reading uses soundfile (libsndfile: wav, flac, ogg, ... in any sample format). Resampling uses
soxr, the SoX resampler: band-limited, high quality (VHQ here, which is still far faster than
real time for a whole file), a small wheel with no torch, and it is the same library used for
streaming device audio, so offline and live paths resample identically.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import AudioError
from .atomic import atomic_file

MODEL_RATE = 24000  # Hz; Mimi's rate


def resample(pcm: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """pcm [T] float32 at rate_in -> [T'] float32 at rate_out."""
    if rate_in == rate_out:
        return pcm.astype(np.float32, copy=False)
    import soxr

    return soxr.resample(pcm, rate_in, rate_out, quality="VHQ").astype(np.float32, copy=False)


def _check_wav_complete(path: Path) -> None:
    """libsndfile quietly reads what there is of a truncated wav; a user should hear about it
    (an interrupted copy or download). Walks the RIFF chunks up to `data` and compares the size
    its header promises with the bytes present."""
    import struct

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return  # not a RIFF wav: libsndfile judges it
        pos = 12
        while pos + 8 <= size:
            f.seek(pos)
            chunk, length = struct.unpack("<4sI", f.read(8))
            if chunk == b"data":
                present = size - pos - 8
                # 0 and 0xFFFFFFFF are what streaming writers leave when they cannot seek back
                if length not in (0, 0xFFFFFFFF) and length > present:
                    raise AudioError(f"{path} is truncated: its header promises {length} bytes "
                                     f"of audio, the file holds {present}")
                return
            pos += 8 + length + (length & 1)


def read_audio(path: str | Path, rate: int = MODEL_RATE) -> np.ndarray:
    """Reads any audio file as float32 mono at `rate` ([T]); channels are averaged.

    An unreadable, empty or non-finite file raises AudioError saying which."""
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise AudioError(f"input audio {path} does not exist")
    _check_wav_complete(path)
    try:
        data, file_rate = sf.read(str(path), dtype="float32", always_2d=True)  # [T, C]
    except Exception as e:  # libsndfile's errors are RuntimeError/LibsndfileError
        raise AudioError(f"cannot read {path} as audio ({e}); give a wav, flac or ogg "
                         "file") from e
    if data.shape[0] == 0:
        raise AudioError(f"{path} holds no audio samples")
    if not np.isfinite(data).all():
        bad = int((~np.isfinite(data)).sum())
        raise AudioError(f"{path} holds {bad} NaN or infinite sample(s); the file is damaged")
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    return resample(mono, int(file_rate), rate)


def to_pcm16(pcm: np.ndarray) -> np.ndarray:
    """float32 [-1, 1] -> int16 [T], as libsndfile converts floats for a PCM16 file (x 32768,
    rounded down, clipped); every front end that sends PCM16 (`stdio`, OpenAI Realtime) and
    every wav written here use this one conversion, so their samples agree to the bit."""
    scaled = np.floor(np.asarray(pcm, np.float32) * np.float32(32768.0))
    return np.clip(scaled, -32768, 32767).astype(np.int16)


def write_audio(path: str | Path, pcm: np.ndarray, rate: int = MODEL_RATE) -> None:
    """Writes float32 mono pcm [T] as 16-bit PCM wav, atomically: a reader never sees half a
    file, and an error leaves no file behind."""
    import soundfile as sf

    with atomic_file(path, suffix=".wav") as tmp:
        sf.write(str(tmp), to_pcm16(pcm), rate, subtype="PCM_16", format="WAV")


def pcm16_bytes(pcm: np.ndarray) -> bytes:
    """float32 mono pcm [T] -> the 16-bit little-endian samples `write_audio` writes for it,
    so PCM16 sent elsewhere (stdio, OpenAI Realtime) equals a written wav sample for sample."""
    return to_pcm16(pcm).astype("<i2", copy=False).tobytes()


def save_array_atomic(path: str | Path, array: np.ndarray) -> None:
    """np.save, atomically (same guarantees as write_audio)."""
    with atomic_file(path, suffix=".npy") as tmp:
        np.save(tmp, array)
