"""A finished export against the checkpoint it came from: each graph beside its torch module, with
the export's own check (model_export.check_codec_graph, lm.check_lm_graph) on the same seeded
inputs, over the same frames and at the same tolerance. `personaplex-edge verify --checkpoint`.

The export checks the language model's graphs in float32, before converting them to a lower
precision; a graph stored in another precision (or with a narrower KV ring) cannot be held to
that tolerance. Its weights are compared instead: the graph traced again without them, laid
out in its precision, and every stored weight spot-checked against what the checkpoint makes
through the same conversion (three output channels each: a wrong tensor, row, offset or
conversion shows). A layout this version does not write (another block size, names traced by
another torch) is said and left to the hashes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.findings import Finding
from personaplex_edge.manifest import Manifest

from .hub import resolve_checkpoint
from .lm import (check_lm_graph, converted_weights_check, full_check_fits, lm_jobs,
                 open_lm_header, spot_check_weights)
from .mimi import load_mimi
from .model_export import check_codec_graph, codec_steps

Progress = Callable[[str], None]


def _compared(check: str, target: str, run) -> Finding:
    """One comparison as a finding: what it measured, or the disagreement it raised."""
    try:
        record = run()
    except PersonaPlexError as e:  # ExportMismatch, or a graph the check cannot feed
        return Finding(check, target, False, str(e))
    except Exception as e:  # onnxruntime refusing the inputs of a graph that was changed
        return Finding(check, target, False, f"{type(e).__name__}: {e}")
    figures = record.get("outputs", {})
    worst = max(figures.values(), default=0.0)
    return Finding(check, target, True, f"{record['how']}, {record['calls']} calls, largest "
                   f"difference {worst:.3g}", record)


def _converted(job, entry, path: Path, backend: str, kv: list[str], header, cfg,
               progress: Progress) -> Finding:
    """A graph stored in a lower precision: its weights against the checkpoint's."""
    from .precision_plan import plan_for

    plan = plan_for(entry.precision, backend, kv[0] if kv else None)
    progress(f"spot-checking {entry.file}'s {entry.precision} weights against the checkpoint")
    finding = _compared("weights", job[0], lambda: converted_weights_check(
        job, path, plan, header, cfg))
    if finding.ok and finding.measured and finding.measured.get("compared") is False:
        return Finding("weights", job[0], True, finding.measured["detail"] + "; its hash and "
                       "signature are checked", finding.measured)
    if finding.ok:
        rows = finding.measured["weight_rows_compared"]
        return Finding("weights", job[0], True, f"{rows} weight rows of its {entry.precision} "
                       "weights equal what the checkpoint makes", finding.measured)
    return finding


def against_checkpoint(model_dir: str | Path, manifest: Manifest, checkpoint: str,
                       progress: Progress = print) -> list[Finding]:
    model_dir = Path(model_dir)
    with_lm = "lm" in manifest.contents
    ckpt = resolve_checkpoint(checkpoint, with_lm=with_lm, progress=progress)
    if ckpt.config.to_dict() != manifest.config.to_dict():
        return [Finding("config", checkpoint, False, "the checkpoint's config.json describes "
                        "another model than the manifest's config: not the checkpoint of this "
                        "export")]
    cfg = manifest.config
    batch = manifest.batch
    out = []
    progress(f"checking the codec graphs against torch ({ckpt.mimi.name})")
    mimi = load_mimi(ckpt.mimi, cfg.mimi_config)
    for name, fn, inputs, outputs, state, _ in codec_steps(mimi, batch):
        path = model_dir / manifest.graphs[name].file
        out.append(_compared("torch", name, lambda: check_codec_graph(path, fn, inputs,
                                                                      outputs, state)))
    del mimi
    if not with_lm:
        return out
    header = open_lm_header(ckpt.lm, cfg)
    for job in lm_jobs(cfg, batch):
        name, plans = job[0], job[5]
        entry = manifest.graphs[name]
        path = model_dir / entry.file
        kv = sorted({r.dtype for r in entry.rings})
        if entry.precision != "fp32" or kv not in ([], ["float32"]):
            out.append(_converted(job, entry, path, manifest.backend, kv, header, cfg,
                                  progress))
            continue
        fits, need, have = full_check_fits(job)
        if fits:
            progress(f"checking {entry.file} against torch (the checkpoint's weights streamed)")
            out.append(_compared("torch", name, lambda: check_lm_graph(path, job, header, cfg)))
        else:
            progress(f"{name}: a full check needs ~{need / 1e9:.1f} GB, {have / 1e9:.1f} GB is "
                     "available: spot-checking every weight against the checkpoint instead")
            out.append(_compared("weights", name, lambda: {
                "how": "weight spot check", "calls": 0,
                "weight_rows_compared": spot_check_weights(path, plans, header)}))
    return out
