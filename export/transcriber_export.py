"""A transcriber added to a model directory already exported (`personaplex-edge export
--transcriber STT_CK --out DIR`, without --checkpoint).

    the model       read and checked as the runtime reads it (every file against its hash)
    the codec       the transcriber's Mimi file must be the model's (the manifest keeps the
                    codec weights' sha256); its encoder is exported again making n_q codebooks,
                    and run beside the model's own on the export's check inputs: its first 8
                    codes must be the model's (which also stands in for the hash where an
                    older manifest has none)
    the step        transcriber_step.onnx in the LM's precision (or --transcriber-precision),
                    checked as export_model checks it, and the transcriber's tokenizer

The directory is rewritten through a staging copy of hard links (atomic.staged_dir): the LM's
gigabytes are not copied, the files that change are replaced (never written in place), and an
interrupted run leaves the model as it was.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np

from personaplex_edge.atomic import staged_dir
from personaplex_edge.contract import CODES, HELIUM_STEP, MIMI_ENCODER, TRANSCRIBER_STEP
from personaplex_edge.errors import CheckpointError
from personaplex_edge.manifest import Manifest, load_model_dir, sha256_file, write_manifest
from personaplex_edge.streams import CODEBOOKS_PER_SPEAKER

from .mimi import load_mimi
from .model_export import CODEC_CHECK_CALLS, codec_steps, export_codec
from .precision_plan import check_transcriber_plan
from .transcriber import TranscriberFiles, check_shared_codec, export_transcriber_graph

Progress = Callable[[str], None]


def _graph_files(manifest: Manifest, name: str) -> list[str]:
    g = manifest.graphs.get(name)
    if g is None:
        return []
    return [g.file, *g.data_files] + ([g.engine["file"]] if g.engine else [])


def same_first_codes(old: Path, new: Path, inputs, state, calls: int = CODEC_CHECK_CALLS
                     ) -> bool:
    """Whether encoder graph `new` makes the first 8 codes `old` makes, call after call, each
    fed the state its previous call returned (on the export's seeded check inputs)."""
    import onnxruntime as ort

    feeds = {s.name: t.numpy() for s, t in inputs}
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
                for p in (old, new)]
    states = [{s.input_name: np.full(s.shape, s.init, np.dtype(s.dtype)) for s in state}
              for _ in sessions]
    for _ in range(calls):
        codes = []
        for sess, st in zip(sessions, states):
            names = [o.name for o in sess.get_outputs()]
            got = dict(zip(names, sess.run(None, {**feeds, **st})))
            st.update({s.input_name: got[s.output_name] for s in state})
            codes.append(got[CODES][:, :CODEBOOKS_PER_SPEAKER])
        if not np.array_equal(*codes):
            return False
    return True


def add_transcriber(model_dir: str | Path, stt: TranscriberFiles, precision: str | None = None,
                    verify: str = "auto", progress: Progress = print) -> Manifest:
    """Adds (or replaces) the transcriber of the model in `model_dir` (module docstring)."""
    model_dir = Path(model_dir)
    manifest = load_model_dir(model_dir, need="lm", progress=progress)
    cfg = manifest.config
    check_shared_codec(stt, manifest.codec_sha256, cfg.mimi_config, str(model_dir))
    helium = manifest.graphs[HELIUM_STEP]
    precision = precision or helium.precision
    plan, warnings = check_transcriber_plan(precision, manifest.backend,
                                            helium.rings[0].dtype if helium.rings else None)
    for line in warnings:
        progress(line)
    batch = manifest.batch
    mimi = load_mimi(stt.mimi, cfg.mimi_config)
    encoder = load_mimi(stt.mimi, dataclasses.replace(
        cfg.mimi_config, num_codebooks=stt.config.num_audio_codebooks))
    old_transcriber = manifest.transcriber
    stale = _graph_files(manifest, MIMI_ENCODER) + _graph_files(manifest, TRANSCRIBER_STEP)
    files = dict(manifest.files)
    if old_transcriber is not None and old_transcriber.tokenizer:
        stale.append(old_transcriber.tokenizer)
        files.pop(old_transcriber.tokenizer, None)
    with staged_dir(model_dir, progress=progress, seed_from=model_dir) as stage:
        for rel in stale:  # hard links of the model's files: replaced, never written into
            (stage / rel).unlink(missing_ok=True)
        graphs = dict(manifest.graphs)
        graphs.pop(TRANSCRIBER_STEP, None)
        step = next(codec_steps(mimi, batch, encoder, (MIMI_ENCODER,)))
        graphs.update(export_codec([step], stage, progress))
        _, _, _, inputs, _, state, _ = step
        del mimi, encoder
        if not same_first_codes(model_dir / manifest.graphs[MIMI_ENCODER].file,
                                stage / graphs[MIMI_ENCODER].file, inputs, state):
            raise CheckpointError(
                f"{stt.mimi} (config.json field 'mimi_name') is not the codec of {model_dir}: "
                "its encoder makes other codes than the model's; the transcriber must read the "
                "codes of the same Mimi")
        progress(f"  {MIMI_ENCODER}.onnx: its first {CODEBOOKS_PER_SPEAKER} codes are the "
                 "model's own encoder's")
        stt_graphs, stt_files, stt_cfg = export_transcriber_graph(
            stt, stage, batch, progress, verify, plan, taken=set(files))
        graphs.update(stt_graphs)
        files.update(stt_files)
        contents = list(manifest.contents) + (["transcriber"] if "transcriber" not in
                                              manifest.contents else [])
        updated = dataclasses.replace(
            manifest, graphs=graphs, files=files, contents=contents, transcriber=stt_cfg,
            codec_sha256=manifest.codec_sha256 or sha256_file(stt.mimi))
        if manifest.backend == "tensorrt":
            progress(f"  no TensorRT engines built for {MIMI_ENCODER} and {TRANSCRIBER_STEP}: "
                     f"build them on the target GPU with personaplex-edge engines --model "
                     f"{model_dir}")
        write_manifest(stage, updated)
        load_model_dir(stage, progress=progress)
    progress(f"wrote {model_dir} ({', '.join(updated.contents)})")
    return updated
