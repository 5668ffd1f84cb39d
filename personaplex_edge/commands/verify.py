"""`personaplex-edge verify`: a finished or downloaded export checked (runtime/verify.py,
and against its checkpoint with --checkpoint)."""

from __future__ import annotations

from pathlib import Path

from ..model_ref import need_export_extra, resolve_model
from .common import MODEL_HELP, note


def add_parser(sub) -> None:
    f = sub.add_parser("verify", help="check a finished or downloaded export: every file's "
                                      "hash, every graph's signature, and with --checkpoint "
                                      "each graph against torch; exit 1 on a disagreement")
    f.add_argument("--model", required=True, help=MODEL_HELP)
    f.add_argument("--checkpoint", help="the checkpoint it was exported from (directory or hub "
                                        "repo): run each graph beside its torch module as the "
                                        "export checks it (needs the export extra)")
    f.add_argument("--transcriber", metavar="STT_CHECKPOINT",
                   help="with --checkpoint: the Kyutai STT checkpoint the transcriber came from, "
                        "to check its step against torch too")
    f.add_argument("--json", help="write every finding here")
    f.set_defaults(func=run)


def run(args) -> int:
    """Hashes, graph signatures and, with --checkpoint, each graph against its torch module;
    every finding printed, exit 1 on any disagreement (2: nothing could be verified)."""
    from ..atomic import write_text_atomic
    from ..runtime.verify import verify_model

    if args.checkpoint:  # before a download or an hour of hashing
        need_export_extra()
    model_dir = resolve_model(args.model, note)
    report, manifest = verify_model(model_dir, args.model, progress=note)
    if args.checkpoint:
        from ..export.check_export import against_checkpoint

        report.findings += against_checkpoint(model_dir, manifest, args.checkpoint, note,
                                              transcriber=args.transcriber)
    from ..devices import model_devices

    for finding in report.findings:
        print(finding.line())
    print("runs on: " + "; ".join(model_devices(manifest)))
    if args.json:
        write_text_atomic(Path(args.json), report.to_json())
    failures = report.failures()
    print(f"{args.model}: " + ("verified" if not failures else
                               f"{len(failures)} disagreement(s): "
                               + ", ".join(f"{f.check} {f.target}" for f in failures)))
    return 0 if not failures else 1
