"""The voice bank of a model directory: stored voice prompts, read without torch.

The reference ships its voices as torch `.pt` files (voices.tgz); the export converts them into
one numpy archive (`voices.npz`, named by `manifest.voices`) holding per voice NAME:

    NAME.embeddings_bf16   uint16 [N, D]   the prompt's N summed input embeddings, as the
                                           bit patterns of the bf16 values the reference
                                           saved (exact, half the size of float32)
    NAME.embeddings        float32 [N, D]  instead, for a voice saved in another precision
    NAME.cache             int64 [17, S]   the reference's token ring after the prompt

`load_voice` gives float32 embeddings either way. A name may be given as "NATF2" or
"NATF2.pt" (the reference's spelling), in any case.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ModelDirError, VoiceError
from .manifest import Manifest
from .streams import NUM_STREAMS

EMBEDDINGS_BF16 = "embeddings_bf16"
EMBEDDINGS_F32 = "embeddings"
CACHE = "cache"


@dataclass(frozen=True)
class VoicePrompt:
    name: str
    embeddings: np.ndarray  # [N, D] float32: added to the input of positions 0..N-1
    cache: np.ndarray  # [17, S] int64: the token ring the prompt leaves behind

    @property
    def frames(self) -> int:
        return self.embeddings.shape[0]


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns -> float32 (bf16 is the upper half of a float32)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _bank(model_dir: str | Path, manifest: Manifest) -> Path:
    if manifest.voices is None:
        raise VoiceError(f"{model_dir} has no voice bank (its checkpoint had no voices.tgz); "
                         "give a recording (.wav) as the voice prompt instead, or export from "
                         "a checkpoint that has voices.tgz")
    path = Path(model_dir) / manifest.voices
    if not path.is_file():
        raise ModelDirError(f"{model_dir}: the voice bank {manifest.voices} named in its "
                            "manifest is missing; export the model again")
    return path


def _names(archive) -> list[str]:
    return sorted({key.rsplit(".", 1)[0] for key in archive.files})


def available_voices(model_dir: str | Path, manifest: Manifest) -> list[str]:
    """The names of the voice bank's voices, sorted ("NATF0", ..., "VARM4")."""
    with np.load(_bank(model_dir, manifest)) as archive:
        return _names(archive)


def resolve_voice(name: str, names: list[str], model_dir) -> str:
    """The bank name `name` means (".pt" and case aside), or a VoiceError listing the known ones."""
    wanted = Path(name).name
    if wanted.lower().endswith(".pt"):
        wanted = wanted[:-3]
    if wanted in names:
        return wanted
    folded = [n for n in names if n.lower() == wanted.lower()]
    if len(folded) == 1:
        return folded[0]
    raise VoiceError(f"no voice {name!r} in the voice bank of {model_dir}; available: "
                     f"{', '.join(names)} (or give a .wav recording)")


def load_voice(model_dir: str | Path, manifest: Manifest, name: str) -> VoicePrompt:
    """One voice of the bank by name; an unknown name is a VoiceError listing the known ones."""
    path = _bank(model_dir, manifest)
    with np.load(path) as archive:
        voice = resolve_voice(name, _names(archive), model_dir)
        if f"{voice}.{EMBEDDINGS_BF16}" in archive.files:
            embeddings = bf16_bits_to_float32(archive[f"{voice}.{EMBEDDINGS_BF16}"])
        else:
            embeddings = archive[f"{voice}.{EMBEDDINGS_F32}"].astype(np.float32)
        cache = archive[f"{voice}.{CACHE}"].astype(np.int64)
    D = manifest.config.temporal_config.hidden_size
    if embeddings.ndim != 2 or embeddings.shape[1] != D or cache.ndim != 2 \
            or cache.shape[0] != NUM_STREAMS:
        raise ModelDirError(f"{path}: voice {voice} has embeddings {list(embeddings.shape)} and "
                            f"cache {list(cache.shape)}, the model needs [N, {D}] and "
                            f"[{NUM_STREAMS}, S]; export the model again")
    return VoicePrompt(voice, embeddings, cache)
