"""A finished export against the checkpoint it came from: each graph beside its torch module, with
the export's own check (codec_export.check_codec_graph, lm.check_lm_graph) on the same seeded
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

import dataclasses
from pathlib import Path
from typing import Callable

from personaplex_edge.contract import TRANSCRIBER_STEP
from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.findings import Finding
from personaplex_edge.manifest import Manifest

from .hub import resolve_checkpoint
from .lm import (check_lm_graph, converted_weights_check, full_check_fits, lm_jobs,
                 open_lm_header, spot_check_weights)
from .mimi import load_mimi
from .codec_export import check_codec_graph, codec_steps

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

    plan = plan_for(entry.precision, backend, kv[0] if kv else None, None,
                    entry.compute if entry.precision in ("int8", "int4") else None)
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


def _graph_finding(model_dir: Path, manifest: Manifest, job, header, cfg,
                   progress: Progress) -> Finding:
    """One LM (or transcriber) graph against the checkpoint: run beside its torch module where
    it is float32 and that fits in memory, else its weights spot-checked."""
    name, plans = job[0], job[5]
    entry = manifest.graphs[name]
    path = model_dir / entry.file
    kv = sorted({r.dtype for r in entry.rings})
    if entry.precision != "fp32" or kv not in ([], ["float32"]):
        return _converted(job, entry, path, manifest.backend, kv, header, cfg, progress)
    fits, need, have = full_check_fits(job)
    if fits:
        progress(f"checking {entry.file} against torch (the checkpoint's weights streamed)")
        return _compared("torch", name, lambda: check_lm_graph(path, job, header, cfg))
    progress(f"{name}: a full check needs ~{need / 1e9:.1f} GB, {have / 1e9:.1f} GB is "
             "available: spot-checking every weight against the checkpoint instead")
    return _compared("weights", name, lambda: {
        "how": "weight spot check", "calls": 0,
        "weight_rows_compared": spot_check_weights(path, plans, header)})


def _transcriber_findings(model_dir: Path, manifest: Manifest, spec: str | None,
                          progress: Progress) -> list[Finding]:
    """The transcriber's step against its Kyutai checkpoint (`verify --transcriber`)."""
    from .transcriber import (check_shared_codec, open_transcriber_header, resolve_transcriber,
                              transcriber_jobs)

    if spec is None:
        return [Finding("torch", TRANSCRIBER_STEP, True, "not compared: give --transcriber "
                        "STT_CHECKPOINT to check it against torch; its hash and signature are "
                        "checked")]
    stt = resolve_transcriber(spec, progress)
    mine = dataclasses.replace(stt.config, tokenizer=None, source="", source_revision=None)
    theirs = dataclasses.replace(manifest.transcriber, tokenizer=None, source="",
                                 source_revision=None)
    if mine != theirs:
        return [Finding("config", spec, False, "the transcriber checkpoint describes another "
                        "model than the manifest's transcriber: not the one of this export")]
    try:
        check_shared_codec(stt, manifest.config.mimi_config)
    except PersonaPlexError as e:
        return [Finding("codec", spec, False, str(e))]
    header = open_transcriber_header(stt.lm, stt.config)
    job = transcriber_jobs(stt.config, manifest.batch)[0]
    return [_graph_finding(model_dir, manifest, job, header, stt.config, progress)]


def against_checkpoint(model_dir: str | Path, manifest: Manifest, checkpoint: str,
                       progress: Progress = print,
                       transcriber: str | None = None) -> list[Finding]:
    """Every graph of the export against `checkpoint` (and, for a model with a transcriber,
    its step against the `transcriber` checkpoint)."""
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
    encoder = None  # with a transcriber the encoder makes its codebooks too
    if manifest.transcriber is not None:
        encoder = load_mimi(ckpt.mimi, dataclasses.replace(
            cfg.mimi_config, num_codebooks=manifest.transcriber.num_audio_codebooks))
    for name, _, fn, inputs, outputs, state, _ in codec_steps(mimi, batch, encoder):
        path = model_dir / manifest.graphs[name].file
        out.append(_compared("torch", name, lambda: check_codec_graph(path, fn, inputs,
                                                                      outputs, state)))
    del mimi, encoder
    if not with_lm:
        return out
    header = open_lm_header(ckpt.lm, cfg)
    out += [_graph_finding(model_dir, manifest, job, header, cfg, progress)
            for job in lm_jobs(cfg, batch)]
    if manifest.transcriber is not None:
        out += _transcriber_findings(model_dir, manifest, transcriber, progress)
    return out
