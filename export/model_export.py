"""Checkpoint -> model directory: build the torch modules, export each graph, check each graph in
onnxruntime against its torch module (the LM's in float32, before its weights are written in
their precision), then write the manifest. The directory is staged and appears complete or not
at all.

TensorRT engines are device-side work (they are built on the GPU that will run them, where
there may be no torch): the export does not build them itself but calls the `engine_builder`
its caller hands in (the CLI passes runtime/backends/trt_build.build_engines) on the staging
directory, so export/ imports nothing of runtime/."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Callable, Protocol

from personaplex_edge.atomic import staged_dir
from personaplex_edge.contract import BACKENDS, MIMI_ENCODER, TRANSCRIBER_STEP
from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.manifest import (GraphEntry, Manifest, load_model_dir, sha256_file,
                                       write_manifest)

from .codec_export import codec_steps, export_codec
from .hub import CheckpointFiles
from .mimi import load_mimi
from .precision_plan import PrecisionPlan, check_plans
from .transcriber import TranscriberFiles, check_shared_codec, export_transcriber_graph

Progress = Callable[[str], None]
VERIFY = ("auto", "full", "reduced", "off")  # the LM graphs' check, see export_lm_graphs_frugal


class EngineBuilder(Protocol):
    """Builds the TensorRT engines of a model directory in place and returns the manifest that
    records them (runtime/backends/trt_build.build_engines)."""

    def __call__(self, model_dir: Path, manifest: Manifest, *,
                 progress: Progress) -> Manifest: ...


def export_lm(ckpt: CheckpointFiles, out: Path, batch: int, progress: Progress,
              verify: str = "auto", precisions: dict[str, PrecisionPlan] | None = None,
              ) -> dict[str, GraphEntry]:
    """The LM graphs, each weight streamed from the checkpoint into external data in its final
    precision (lm.py's export_lm_graphs_frugal): the 7B is never held in memory twice, nor
    written in float32 first."""
    from .lm import export_lm_graphs_frugal

    t0 = time.perf_counter()
    progress(f"exporting the language model from {ckpt.lm}")
    graphs = export_lm_graphs_frugal(ckpt.config, ckpt.lm, out, batch=batch, verify=verify,
                                     progress=progress, precisions=precisions)
    progress(f"  helium_step.onnx, depformer_step.onnx: written, check {verify} "
             f"({time.perf_counter() - t0:.1f} s)")
    return graphs


def export_voices(ckpt: CheckpointFiles, out: Path, progress: Progress) -> str | None:
    """voices.tgz -> voices.npz in `out` (see export/voices.py); its name, or None."""
    if ckpt.voices is None:
        return None
    from .voices import VOICES_NPZ, convert_voice_bank

    names = convert_voice_bank(ckpt.voices, out / VOICES_NPZ, ckpt.config)
    progress(f"  {VOICES_NPZ}: {len(names)} voices ({', '.join(names)})")
    return VOICES_NPZ


# Bytes of a converted LM weight per float32 byte, scales included, rounded up from the
# measured mid-size model (fp16 0.500, int8 0.289, int4 0.200 of the float32 bytes).
_CONVERTED_RATIO = {"fp32": 1.0, "fp16": 0.51, "bf16": 0.51, "fp8": 0.3, "int8": 0.31,
                    "int4": 0.22}
# Besides the model: the largest weight being made (the text embedding or head in float32, a
# few hundred MB at the 7B's size) is in memory, not on disk; the graphs' own .onnx files and
# the staging directory's temporary names are the rest. Kept as a margin.
SCRATCH_MARGIN = 64 << 20


def output_bytes(ckpt: CheckpointFiles, precision: str = "fp32",
                 depformer_precision: str | None = None, engines: bool = False) -> int:
    """About the most the export holds on disk at once: the model it writes. Each LM weight is
    written once, in its final precision (Helium in `precision`, the depformer in
    `depformer_precision`), straight from the checkpoint; TensorRT `engines` (about the size of
    the graph they come from) are built after that, beside the graphs."""
    need = ckpt.mimi.stat().st_size + SCRATCH_MARGIN  # Mimi is float32 already
    if ckpt.lm is not None:
        from .lm import depformer_plan, helium_plan

        lm = 0
        for plans, p in ((helium_plan(ckpt.config), precision),
                         (depformer_plan(ckpt.config), depformer_precision or precision)):
            lm += int(sum(w.nbytes for w in plans.values()) * _CONVERTED_RATIO[p])
        need += 2 * lm if engines else lm
        need += sum(f.stat().st_size for f in (ckpt.tokenizer, ckpt.voices) if f is not None)
    return need


def check_output_space(ckpt: CheckpointFiles, out_dir: str | Path, precision: str = "fp32",
                       depformer_precision: str | None = None, engines: bool = False) -> None:
    """Refuses to start an export whose output cannot fit on the disk it goes to."""
    probe = Path(out_dir).expanduser().absolute().parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    need = int(output_bytes(ckpt, precision, depformer_precision, engines) * 1.02)
    free = shutil.disk_usage(probe).free
    if need > free:
        what = precision + (f", depformer {depformer_precision}" if depformer_precision else "")
        what += " with TensorRT engines" if engines else ""
        raise PersonaPlexError(f"the export ({what}) needs ~{need / 1e9:.1f} GB in {probe} at "
                               f"its peak, which has {free / 1e9:.1f} GB free: free some space "
                               "or choose another --out")


def export_model(ckpt: CheckpointFiles, out_dir: str | Path, precision: str = "fp32",
                 backend: str = "onnx", batch: int = 1,
                 progress: Progress = print, verify: str = "auto",
                 kv_dtype: str | None = None, engine_builder: EngineBuilder | None = None,
                 depformer_precision: str | None = None,
                 transcriber: TranscriberFiles | None = None,
                 transcriber_precision: str | None = None,
                 compute: str | None = None) -> Manifest:
    """Writes the model directory for `ckpt`: the codec always; the language model, its
    tokenizer and its voice bank when the checkpoint has them. `verify` chooses the LM graphs'
    check (export_lm_graphs_frugal: "auto", "full", "reduced", "off"); the codec is always
    checked in full. The LM graphs are written in `precision` for `backend` (see
    export/precision.py; the depformer in `depformer_precision` when given), each weight
    converted on its way from the checkpoint, after a check of the float32 graph (int8/int4 in
    `compute`'s float type around their products: precision_plan.plan_for). For TensorRT,
    `engine_builder` (when given) builds the engines in the staging directory before the
    manifest is written; without one the graphs are written for a later
    `personaplex-edge engines --model DIR` on the target. Every choice is checked before
    anything is written: what a backend cannot run is refused, what TensorRT may not honour
    (int8 / fp8 weight-only) is said first.

    With `transcriber` (a Kyutai STT checkpoint, export/transcriber.py) its step graph is
    written beside the LM's (in `transcriber_precision`, else `precision`) and the encoder
    makes the codebooks it reads, its first 8 those PersonaPlex reads; a transcriber whose
    codec is not this checkpoint's is refused before anything is written."""
    if backend not in BACKENDS:
        raise PersonaPlexError(f"unknown backend {backend}; choose one of {', '.join(BACKENDS)}")
    if verify not in VERIFY:
        raise PersonaPlexError(f"verify {verify!r} is not one of {', '.join(VERIFY)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise PersonaPlexError(f"--batch {batch}: the conversations a graph call steps must be "
                               "a whole number, at least 1")
    # an impossible combination (fp8 or bf16 for onnxruntime, a bad KV dtype) fails now, not
    # after the codec's export and the LM's check it would otherwise follow
    plans, warnings = check_plans(precision, backend, kv_dtype, depformer_precision,
                                  (transcriber_precision or precision) if transcriber
                                  else None, compute)
    engines = backend == "tensorrt" and engine_builder is not None
    cfg = ckpt.config
    check_output_space(ckpt, out_dir, precision, depformer_precision, engines=engines)
    for line in warnings if ckpt.lm is not None else []:
        progress(line)
    codec_sha256 = sha256_file(ckpt.mimi)
    if transcriber is not None:
        if ckpt.lm is None:
            raise PersonaPlexError("--transcriber goes with a language model: export without "
                                   "--codec-only")
        check_shared_codec(transcriber, cfg.mimi_config)
    progress(f"loading Mimi from {ckpt.mimi}")
    mimi = load_mimi(ckpt.mimi, cfg.mimi_config)
    with staged_dir(out_dir, progress=progress) as stage:  # says what a killed one left
        graphs = export_codec(codec_steps(mimi, batch), stage, progress)
        del mimi
        if transcriber is not None:  # its own codec's encoder, checked on the model's codes
            from .transcriber_export import export_transcriber_encoder

            graphs.update(export_transcriber_encoder(
                transcriber, cfg.mimi_config, batch, stage, stage / graphs[MIMI_ENCODER].file,
                ckpt.source, progress))
        contents = ["codec"]
        stt_cfg = None
        tokenizer = voices = None
        files = {}
        if ckpt.lm is not None:
            # the voice bank first: a damaged voices.tgz fails in seconds, not after the LM
            voices = export_voices(ckpt, stage, progress)
            if voices is not None:
                files[voices] = sha256_file(stage / voices)
            graphs.update(export_lm(ckpt, stage, batch, progress, verify, plans))
            contents.append("lm")
            if ckpt.tokenizer is not None:
                tokenizer = ckpt.tokenizer.name
                shutil.copyfile(ckpt.tokenizer, stage / tokenizer)
                files[tokenizer] = sha256_file(stage / tokenizer)
        if transcriber is not None:
            stt_graphs, stt_files, stt_cfg = export_transcriber_graph(
                transcriber, stage, batch, progress, verify, plans.get(TRANSCRIBER_STEP),
                taken=set(files))
            graphs.update(stt_graphs)
            files.update(stt_files)
            contents.append("transcriber")
        manifest = Manifest(config=cfg, graphs=graphs, contents=contents,
                            precision=precision,
                            backend=backend, tokenizer=tokenizer, voices=voices,
                            source=ckpt.source, files=files,
                            source_revision=ckpt.revision, codec_sha256=codec_sha256,
                            transcriber=stt_cfg)
        if engines:
            manifest = engine_builder(stage, manifest, progress=progress)
        elif backend == "tensorrt":
            progress(f"  no TensorRT engines built: build them on the target GPU with "
                     f"personaplex-edge engines --model {out_dir}")
        write_manifest(stage, manifest)
        # read back as the runtime will: every file against its hash (which also stamps them,
        # so the first conversation does not hash the whole model again)
        load_model_dir(stage, progress=progress)
    progress(f"wrote {out_dir} ({', '.join(manifest.contents)})")
    return manifest
