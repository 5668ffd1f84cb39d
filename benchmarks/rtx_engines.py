"""TensorRT for RTX engines of every precision the TensorRT export writes, built here without a
GPU: each engine's size beside its graph's weight bytes, the verdict on quantised weights, the
build's seconds, peak memory and disk.

    python benchmarks/rtx_engines.py [--config tiny|full-width] [--work DIR] [--json out.json]

tiny: the built-in tiny model (random weights). full-width: the 7B's config cut to one Helium
and one depformer layer (tests/test_full_width.py's), the tiny codec. Every precision's Helium
and depformer, the codec (float32 in every precision) once; each build in a process of its own
(benchmarks/rehearsal.py's steps: its peak memory is its own). The whole 7B is
benchmarks/rehearsal.py --recipes rtx.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rehearsal import engines_table, rtx_engines  # noqa: E402

from personaplex_edge.contract import PRECISIONS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def export(config: str, work: Path) -> Path:
    """The float32 export of `config` (random weights), its checkpoint deleted after."""
    from personaplex_edge.config import preset
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    if config == "tiny":
        cfg = preset("tiny")
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        from test_full_width import full_width_config

        cfg = full_width_config()
    ckpt = write_synthetic_checkpoint(cfg, work / "checkpoint", streamed=config != "tiny")
    export_model(resolve_checkpoint(str(ckpt)), work / "fp32", progress=lambda s: None)
    shutil.rmtree(ckpt)
    return work / "fp32"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny", choices=["tiny", "full-width"])
    ap.add_argument("--work", default="/tmp/personaplex_rtx_engines")
    ap.add_argument("--json")
    args = ap.parse_args()
    from personaplex_edge.export.precision import convert_model_dir

    work = Path(args.work) / args.config
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows = []
    try:
        fp32 = export(args.config, work)
        for precision in PRECISIONS:
            model = work / f"trt-{precision}"
            convert_model_dir(fp32, model, precision, backend="tensorrt",
                              progress=lambda s: None)
            graphs = None if precision == "fp32" else ["helium_step", "depformer_step"]
            rows += rtx_engines(precision, model, work, graphs=graphs)
            shutil.rmtree(model)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    engines_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
