"""Model directories the runtime benchmarks share: the built-in demo and the mid-size model
(benchmarks/mid_model.py; the tests' tiny Mimi where only the LM is measured), exported from a
synthetic checkpoint at a given batch, once per work directory."""

from __future__ import annotations

import resource
import tempfile
from pathlib import Path


def exported(name: str, work: Path, batch: int = 1, log=print) -> Path:
    """models: "demo" or "mid" (mid LM, tiny codec); -> the model directory, built if missing."""
    out = Path(work) / f"{name}-b{batch}"
    if (out / "manifest.json").is_file():
        return out
    from mid_model import mid_config

    from personaplex_edge.config import preset
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    cfg = preset("demo") if name == "demo" else mid_config(tiny_codec=True)
    log(f"exporting the {name} model at batch {batch} into {out}")
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_synthetic_checkpoint(cfg, tmp)
        export_model(resolve_checkpoint(str(ckpt)), out, batch=batch, progress=lambda s: None)
    return out


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
