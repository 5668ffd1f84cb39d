"""`personaplex-edge export`: a checkpoint (a directory or a hub repo) into a model
directory - or, with --transcriber alone, a transcriber added to an exported one. Torch is
imported only here, when it runs (the export extra)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..contract import BACKENDS, PRECISIONS
from ..errors import PersonaPlexError
from ..model_ref import need_export_extra


def add_parser(sub) -> None:
    e = sub.add_parser("export", help="checkpoint (directory or hub repo) -> model directory")
    e.add_argument("--checkpoint",
                   help="checkpoint directory or Hugging Face repo, e.g. nvidia/personaplex-7b-v1 "
                        "(leave it out with --transcriber to add one to the model at --out)")
    e.add_argument("--transcriber", metavar="STT_CHECKPOINT",
                   help="also hear the user: a Kyutai STT checkpoint (directory or hub repo, e.g. "
                        "kyutai/stt-1b-en_fr-candle) whose step runs beside the model's on the "
                        "same Mimi codes (docs/heard.md)")
    e.add_argument("--transcriber-precision", choices=PRECISIONS,
                   help="the transcriber's precision (default: --precision, or the model's)")
    e.add_argument("--out", required=True, help="model directory to write")
    e.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="weights of the language model (the codec stays fp32); int8/int4 are "
                        "weight-only; fp8 is TensorRT only")
    e.add_argument("--depformer-precision", choices=PRECISIONS,
                   help="the depformer's own precision (default: --precision). It is ~9%% of "
                        "the 7B's weights and makes the audio tokens: e.g. --precision "
                        "int4 --depformer-precision int8")
    e.add_argument("--compute", choices=["float16", "float32"],
                   help="with int8/int4: the float type around the integer weights' products - "
                        "float16 (default: GPUs; WebGPU adapters with shader-f16) or float32 "
                        "(every WebGPU adapter; docs/install.md)")
    e.add_argument("--backend", default="onnx", choices=BACKENDS,
                   help="tensorrt also builds TensorRT engines (--library, --targets)")
    e.add_argument("--kv-dtype", choices=["float32", "float16", "bfloat16"],
                   help="KV ring dtype (default: float16 for GPU precisions, float32 on the CPU)")
    e.add_argument("--verify", default="auto", choices=["auto", "full", "reduced", "off"],
                   help="check of the LM graphs against torch before the manifest is written: "
                        "full (needs the weights in memory once), reduced (one layer at full "
                        "width + a spot check of every written weight), auto (full if it fits)")
    e.add_argument("--no-engines", action="store_true",
                   help="with --backend tensorrt: write the graphs only; build the engines later "
                        "with personaplex-edge engines --model DIR")
    from ..runtime.backends.engines_entry import add_build_flags

    add_build_flags(e)
    e.add_argument("--batch", type=int, default=1, help="streams per graph call (default 1)")
    e.add_argument("--codec-only", action="store_true",
                   help="export only the Mimi codec (no model.safetensors needed)")
    e.add_argument("--push-to-hub", metavar="OWNER/NAME",
                   help="after the export, publish it on the Hugging Face hub with a model card "
                        "(needs a token: HF_TOKEN or 'hf auth login'); run it with --model "
                        "OWNER/NAME")
    e.add_argument("--private", action="store_true",
                   help="with --push-to-hub: create the repository private")
    e.set_defaults(func=run)


def run(args) -> int:
    if args.push_to_hub:  # no token: refused now, not after an hour of export
        from ..publish import require_token

        require_token(args.push_to_hub)
    elif args.private:
        raise PersonaPlexError("--private goes with --push-to-hub OWNER/NAME")
    need_export_extra()
    if args.checkpoint is None:
        return add_transcriber_to(args)
    from ..export.hub import resolve_checkpoint
    from ..export.model_export import export_model
    from ..export.precision_plan import check_plans

    # what cannot run is refused before a checkpoint is downloaded or anything written
    check_plans(args.precision, args.backend, args.kv_dtype, args.depformer_precision,
                (args.transcriber_precision or args.precision) if args.transcriber else None,
                args.compute)
    if args.batch < 1:
        raise PersonaPlexError(f"--batch {args.batch}: the conversations a graph call steps "
                               "must be at least 1")
    from ..runtime.backends.engines_entry import export_builder

    # TensorRT, onnx, the targets (a GPU for mainline TensorRT) are checked now, not after an
    # hour of export
    precisions = [args.precision, args.depformer_precision or args.precision]
    if args.transcriber:  # its graph's engine is built too
        precisions.append(args.transcriber_precision or args.precision)
    builder = export_builder(args, precisions)
    t0 = time.perf_counter()
    ckpt = resolve_checkpoint(args.checkpoint, with_lm=not args.codec_only)
    transcriber = None
    if args.transcriber:
        from ..export.transcriber import resolve_transcriber

        transcriber = resolve_transcriber(args.transcriber)
    export_model(ckpt, args.out, precision=args.precision, backend=args.backend,
                 batch=args.batch, kv_dtype=args.kv_dtype, engine_builder=builder,
                 verify=args.verify, depformer_precision=args.depformer_precision,
                 transcriber=transcriber, transcriber_precision=args.transcriber_precision,
                 compute=args.compute)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    if args.push_to_hub:
        from ..publish import push_model

        print(f"published: {push_model(args.out, args.push_to_hub, args.private)}")
    return 0


def add_transcriber_to(args) -> int:
    """`export --transcriber STT --out DIR` without --checkpoint: the transcriber added to the
    model already exported at DIR (export/transcriber_export.py). The flags that cannot apply
    to it are refused first; the engine flags build its graphs' engines on a TensorRT model;
    --push-to-hub publishes the result."""
    if not args.transcriber:
        raise PersonaPlexError("export needs --checkpoint (or --transcriber STT_CHECKPOINT "
                               "alone, to add a transcriber to the model at --out)")
    if not (Path(args.out) / "manifest.json").is_file():
        raise PersonaPlexError(f"--out {args.out} is not an exported model: give --checkpoint "
                               "to export one with the transcriber, or --out an exported model")
    from ..contract import HELIUM_STEP
    from ..export.transcriber import resolve_transcriber
    from ..export.transcriber_export import add_transcriber, builds_engines, check_add_flags
    from ..manifest import read_manifest

    manifest, _ = read_manifest(Path(args.out) / "manifest.json")
    check_add_flags(args, manifest, args.out)
    builder = None
    if builds_engines(args, manifest):  # checked now, not after the export
        from ..runtime.backends.engines_entry import export_builder

        precision = args.transcriber_precision or manifest.graphs[HELIUM_STEP].precision
        builder = export_builder(argparse.Namespace(**{**vars(args), "backend": "tensorrt"}),
                                 ["fp32", precision])
    t0 = time.perf_counter()
    add_transcriber(args.out, resolve_transcriber(args.transcriber),
                    precision=args.transcriber_precision, verify=args.verify,
                    engine_builder=builder, compute=args.compute)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    if args.push_to_hub:
        from ..publish import push_model

        print(f"published: {push_model(args.out, args.push_to_hub, args.private)}")
    return 0
