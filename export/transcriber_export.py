"""A transcriber added to a model directory already exported (`personaplex-edge export
--transcriber STT_CK --out DIR`, without --checkpoint), and the codec check both exports make.

    the flags       what applies to the model as it was exported (its precision, backend,
                    batch, KV dtype) is refused up front, naming the flags (exit 2); what
                    applies to what is added is honoured: --transcriber-precision, --verify,
                    the engine flags on a TensorRT model (its two new graphs' engines are
                    built), --push-to-hub
    the model       read and checked as the runtime reads it (every file against its hash)
    the codec       the transcriber's own Mimi file makes its codes: its encoder is exported
                    making n_q codebooks and run beside the model's own on the export's check
                    inputs; its first 8 codes must be the model's, frame after frame (a
                    byte-for-byte copy of the file is not needed: the weights decide)
    the step        transcriber_step.onnx in the LM's precision (or --transcriber-precision),
                    checked as export_model checks it, and the transcriber's tokenizer

The directory is rewritten through a staging copy of hard links (atomic.staged_dir): the LM's
gigabytes are not copied, the files that change are replaced (never written in place), and an
interrupted run leaves the model as it was.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from personaplex_edge.atomic import staged_dir
from personaplex_edge.config import PersonaPlexMimiConfig
from personaplex_edge.contract import (CODES, DEPFORMER_STEP, HELIUM_STEP, MIMI_ENCODER,
                                       TRANSCRIBER_STEP)
from personaplex_edge.errors import CheckpointError, PersonaPlexError
from personaplex_edge.manifest import (GraphEntry, Manifest, load_model_dir, sha256_file,
                                       write_manifest)
from personaplex_edge.streams import CODEBOOKS_PER_SPEAKER

from .mimi import load_mimi
from .codec_export import CODEC_CHECK_CALLS, codec_steps, export_codec
from .precision_plan import check_transcriber_plan
from .transcriber import TranscriberFiles, check_shared_codec, export_transcriber_graph

Progress = Callable[[str], None]
NEW_GRAPHS = (MIMI_ENCODER, TRANSCRIBER_STEP)  # what adding a transcriber writes anew


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


def export_transcriber_encoder(stt: TranscriberFiles, mimi_cfg: PersonaPlexMimiConfig,
                               batch: int, stage: Path, model_encoder: Path, model: str,
                               progress: Progress) -> dict[str, GraphEntry]:
    """The encoder of the transcriber's own codec, making the n_q codebooks it reads, exported
    into `stage` in place of the model's encoder; refused (CheckpointError naming the file and
    its field) unless its first 8 codes are those of `model_encoder`, the encoder graph of
    `model`, call after call on the export's check inputs: then one encode per frame feeds
    both models."""
    mimi = load_mimi(stt.mimi, mimi_cfg)
    encoder = load_mimi(stt.mimi, dataclasses.replace(
        mimi_cfg, num_codebooks=stt.config.num_audio_codebooks))
    step = next(codec_steps(mimi, batch, encoder, (MIMI_ENCODER,)))
    _, _, _, inputs, _, state, _ = step
    with tempfile.TemporaryDirectory(dir=stage, prefix=".transcriber-encoder-") as tmp:
        graphs = export_codec([step], Path(tmp), progress)
        del mimi, encoder
        entry = graphs[MIMI_ENCODER]
        if not same_first_codes(model_encoder, Path(tmp) / entry.file, inputs, state):
            raise CheckpointError(
                f"{stt.mimi} (config.json field 'mimi_name') is not the codec of {model}: its "
                f"encoder makes other codes than the model's; the transcriber must read the "
                "codes of the same Mimi (Kyutai's STT models use PersonaPlex's)")
        for name in (entry.file, *entry.data_files):
            os.replace(Path(tmp) / name, stage / name)
    progress(f"  {MIMI_ENCODER}.onnx: the transcriber's codec, its first "
             f"{CODEBOOKS_PER_SPEAKER} codes the model's own encoder's")
    return graphs


def add_transcriber(model_dir: str | Path, stt: TranscriberFiles, precision: str | None = None,
                    verify: str = "auto", progress: Progress = print,
                    engine_builder: Callable | None = None,
                    compute: str | None = None) -> Manifest:
    """Adds (or replaces) the transcriber of the model in `model_dir` (module docstring).
    `engine_builder`: on a TensorRT model, builds the engines of the graphs it is given
    (trt_build.build_engines with the --library, --targets, --weightless setup); without one
    they are left to `engines --graphs` or the first run on a GPU. `compute` (int8/int4: the
    float type around their products) defaults to the model's own Helium's, so a model made
    for every WebGPU adapter (float32) gets a transcriber that runs on them too."""
    model_dir = Path(model_dir)
    manifest = load_model_dir(model_dir, need="lm", progress=progress)
    cfg = manifest.config
    check_shared_codec(stt, cfg.mimi_config)
    helium = manifest.graphs[HELIUM_STEP]
    precision = precision or helium.precision
    if compute is None and helium.precision in ("int8", "int4"):
        compute = helium.compute
    plan, warnings = check_transcriber_plan(precision, manifest.backend,
                                            helium.rings[0].dtype if helium.rings else None,
                                            compute)
    for line in warnings:
        progress(line)
    batch = manifest.batch
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
        graphs.update(export_transcriber_encoder(
            stt, cfg.mimi_config, batch, stage, model_dir / manifest.graphs[MIMI_ENCODER].file,
            str(model_dir), progress))
        stt_graphs, stt_files, stt_cfg = export_transcriber_graph(
            stt, stage, batch, progress, verify, plan, taken=set(files))
        graphs.update(stt_graphs)
        files.update(stt_files)
        contents = list(manifest.contents) + (["transcriber"] if "transcriber" not in
                                              manifest.contents else [])
        updated = dataclasses.replace(
            manifest, graphs=graphs, files=files, contents=contents, transcriber=stt_cfg,
            codec_sha256=manifest.codec_sha256 or sha256_file(stt.mimi))
        if manifest.backend == "tensorrt" and engine_builder is not None:
            updated = engine_builder(stage, updated, graphs=list(NEW_GRAPHS),
                                     progress=progress)
        elif manifest.backend == "tensorrt":
            progress(f"  no TensorRT engines built for {' and '.join(NEW_GRAPHS)}: build them "
                     f"on the target GPU with personaplex-edge engines --model {model_dir} "
                     f"--graphs {','.join(NEW_GRAPHS)}")
        write_manifest(stage, updated)
        load_model_dir(stage, progress=progress)
    progress(f"wrote {model_dir} ({', '.join(updated.contents)})")
    return updated


# ---- the command ---------------------------------------------------------------------------------

def check_add_flags(args, manifest: Manifest, model_dir: str) -> None:
    """The export flags of `args` (the CLI's) that cannot apply to a transcriber added to
    `manifest`'s model, refused in one PersonaPlexError naming each and why: the model's own
    settings, fixed when it was exported (a value equal to the model's passes), and engine
    flags where no engine is built."""
    helium, depformer = manifest.graphs[HELIUM_STEP], manifest.graphs.get(DEPFORMER_STEP)
    kv = helium.rings[0].dtype if helium.rings else None
    fixed = []  # (flag with its value, the model's)
    if args.precision != "fp32" and args.precision != helium.precision:
        fixed.append((f"--precision {args.precision}", f"precision {helium.precision}"))
    if args.depformer_precision and depformer is not None \
            and args.depformer_precision != depformer.precision:
        fixed.append((f"--depformer-precision {args.depformer_precision}",
                      f"depformer precision {depformer.precision}"))
    if args.kv_dtype and args.kv_dtype != kv:
        fixed.append((f"--kv-dtype {args.kv_dtype}", f"KV {kv}"))
    if args.backend != "onnx" and args.backend != manifest.backend:
        fixed.append((f"--backend {args.backend}", f"backend {manifest.backend}"))
    if args.batch != 1 and args.batch != manifest.batch:
        fixed.append((f"--batch {args.batch}", f"batch {manifest.batch}"))
    out = []
    if fixed:
        out.append(f"{', '.join(f for f, _ in fixed)} (the model's own, fixed when it was "
                   f"exported: {', '.join(m for _, m in fixed)}; the transcriber's precision "
                   "is --transcriber-precision)")
    if args.codec_only:
        out.append("--codec-only (a transcriber goes with a language model)")
    engine = [f for f, on in ((f"--library {args.library}", args.library != "auto"),
                              (f"--targets {args.targets}", args.targets),
                              ("--weightless", args.weightless)) if on]
    if engine and manifest.backend != "tensorrt":
        out.append(f"{', '.join(engine)} (they build TensorRT engines; the model runs on "
                   f"{manifest.backend})")
    elif engine and args.no_engines:
        out.append(f"{', '.join(engine)} with --no-engines (they build engines; it builds none)")
    if out:
        raise PersonaPlexError(
            f"export --transcriber without --checkpoint adds a transcriber to the model at "
            f"{model_dir}; these flags cannot apply to it: {'; '.join(out)}. Leave them out, or "
            "export the model again with --checkpoint")


def builds_engines(args, manifest: Manifest) -> bool:
    """Whether adding a transcriber builds its graphs' engines now: on a TensorRT model whose
    engine flags ask for them (--library, --targets, --weightless)."""
    return manifest.backend == "tensorrt" and not args.no_engines and bool(
        args.library != "auto" or args.targets or args.weightless)
