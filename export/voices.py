"""voices.tgz (the reference's torch voice prompts) -> voices.npz (read without torch).

Each `.pt` in the archive (e.g. `voices/NATF2.pt`) is what the reference's LMGen saves after
running a recorded voice prompt: {"embeddings": [N, 1, 1, D] (bf16: the summed input embedding
of each prompt frame), "cache": [1, 17, S] int64 (its token ring afterwards)}. The runtime's
format is described in personaplex_edge/voices.py: bf16 is kept bit for bit (as uint16), the
batch and step axes are dropped. Members are read from the archive in memory, never extracted,
and loaded with torch's weights-only unpickler: a voice bank cannot run code.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from personaplex_edge.config import PersonaPlexConfig
from personaplex_edge.errors import CheckpointError
from personaplex_edge.streams import NUM_STREAMS
from personaplex_edge.voices import CACHE, EMBEDDINGS_BF16, EMBEDDINGS_F32

VOICES_NPZ = "voices.npz"


def _voice_arrays(name: str, obj, cfg: PersonaPlexConfig, where: str) -> dict[str, np.ndarray]:
    if not isinstance(obj, dict) or not {"embeddings", "cache"} <= set(obj):
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(f"{where}: voice {name} holds {keys}, not a voice prompt "
                              "({'embeddings', 'cache'})")
    emb, cache = obj["embeddings"], obj["cache"]
    D = cfg.temporal_config.hidden_size
    if not (torch.is_tensor(emb) and emb.is_floating_point() and emb.ndim >= 2
            and emb.shape[-1] == D and emb[0].numel() == D):
        raise CheckpointError(f"{where}: voice {name} has embeddings "
                              f"{list(getattr(emb, 'shape', []))}; this model needs [N, 1, 1, "
                              f"{D}] (is the voice bank from another model?)")
    if not (torch.is_tensor(cache) and not cache.is_floating_point() and cache.ndim >= 2
            and cache.shape[-2:].numel() == cache.numel() and cache.shape[-2] == NUM_STREAMS):
        raise CheckpointError(f"{where}: voice {name} has a token cache "
                              f"{list(getattr(cache, 'shape', []))}; expected [1, "
                              f"{NUM_STREAMS}, S] integers")
    emb = emb.detach().reshape(emb.shape[0], D)  # [N, D]
    out = {f"{name}.{CACHE}": cache.detach().reshape(cache.shape[-2:]).to(torch.int64).numpy()}
    if emb.dtype == torch.bfloat16:
        out[f"{name}.{EMBEDDINGS_BF16}"] = emb.view(torch.int16).numpy().view(np.uint16)
    else:
        out[f"{name}.{EMBEDDINGS_F32}"] = emb.float().numpy()
    return out


def convert_voice_bank(tgz: str | Path, out: str | Path, cfg: PersonaPlexConfig) -> list[str]:
    """Writes the voices of `tgz` into the archive `out` (voices.npz); returns their names."""
    tgz, out = Path(tgz), Path(out)
    arrays: dict[str, np.ndarray] = {}
    names: list[str] = []
    try:
        with tarfile.open(tgz, "r:*") as tar:
            for member in tar:
                path = PurePosixPath(member.name)
                if not member.isfile() or path.suffix != ".pt" or path.name.startswith("."):
                    continue
                name = path.stem
                if name in names:
                    raise CheckpointError(f"{tgz}: two voices named {name}")
                data = tar.extractfile(member).read()
                try:
                    obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
                except Exception as e:
                    raise CheckpointError(f"{tgz}: {member.name} is not a readable voice "
                                          f"prompt ({e})") from e
                arrays.update(_voice_arrays(name, obj, cfg, str(tgz)))
                names.append(name)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise CheckpointError(f"{tgz} is not a readable .tgz archive ({e}); download it "
                              "again") from e
    if not names:
        raise CheckpointError(f"{tgz} holds no voice prompts (.pt files)")
    with open(out, "wb") as f:
        np.savez(f, **arrays)
    return sorted(names)
