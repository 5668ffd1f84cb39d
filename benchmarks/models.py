"""Model directories the runtime benchmarks share: the built-in demo, the tests' tiny preset
and the mid-size model (benchmarks/mid_model.py; the tests' tiny Mimi where only the LM is
measured), exported from a synthetic checkpoint at a given batch, once per work directory. The
checkpoint is kept beside them, for benchmarks that load the same weights into the reference."""

from __future__ import annotations

import resource
import shutil
from pathlib import Path

MODELS = ("demo", "tiny", "mid")


def checkpoint(name: str, work: Path, log=print) -> Path:
    """The synthetic checkpoint of `name` (MODELS) in `work`, written if missing."""
    from mid_model import mid_config

    from personaplex_edge.config import preset
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    out = Path(work) / f"{name}-checkpoint"
    if (out / "config.json").is_file():  # written last
        return out
    log(f"writing the {name} checkpoint (random weights) into {out}")
    cfg = mid_config(tiny_codec=True) if name == "mid" else preset(name)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    write_synthetic_checkpoint(cfg, partial)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def exported(name: str, work: Path, batch: int = 1, log=print) -> Path:
    """name: one of MODELS -> its model directory at `batch`, built if missing."""
    out = Path(work) / f"{name}-b{batch}"
    if (out / "manifest.json").is_file():
        return out
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model

    ckpt = checkpoint(name, work, log)
    log(f"exporting the {name} model at batch {batch} into {out}")
    export_model(resolve_checkpoint(str(ckpt)), out, batch=batch, progress=lambda s: None)
    return out


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
