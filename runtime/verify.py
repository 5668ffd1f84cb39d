"""`personaplex-edge verify`: what a CI job (or a user) runs on a finished or downloaded export.

    every file the manifest names    its sha256, all hashed now (no stamp is trusted)
    every graph                      its inputs and outputs against the manifest's (names,
                                     shapes, dtypes), read from the ONNX file's header
    with --checkpoint                each graph against its torch module, as the export checked
                                     it (export/check_export.py; needs the export extra)

Each check is a `Finding`; every one is made, so a report names every disagreement, not just
the first. Torch-free: the torch side is added by the CLI when a checkpoint is given.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from personaplex_edge.errors import ModelDirError
from personaplex_edge.findings import Finding, Report
from personaplex_edge.manifest import (MANIFEST, GraphEntry, Manifest, expected_files,
                                       read_manifest, sha256_file)

from .backends.ort import check_signature

Progress = Callable[[str], None]


def check_hashes(model_dir: Path, manifest: Manifest, progress: Progress) -> list[Finding]:
    files = expected_files(manifest, model_dir / MANIFEST)
    total = sum((model_dir / f).stat().st_size for f in files if (model_dir / f).is_file())
    progress(f"hashing {len(files)} files ({total / 1e9:.2f} GB)")
    out = []
    for rel, digest in sorted(files.items()):
        path = model_dir / rel
        if not path.is_file():
            out.append(Finding("sha256", rel, False, f"missing (named in {MANIFEST})"))
            continue
        actual = sha256_file(path)
        out.append(Finding("sha256", rel, actual == digest,
                           "" if actual == digest else
                           f"expected {digest[:12]}..., found {actual[:12]}..."))
    return out


_ORT_TYPES = {1: "tensor(float)", 10: "tensor(float16)", 16: "tensor(bfloat16)",
              7: "tensor(int64)", 6: "tensor(int32)", 9: "tensor(bool)"}  # onnx.TensorProto


def _signature(path: Path):
    """The graph's inputs and outputs as onnxruntime's session reports them, from the ONNX
    file alone (weights not read) where onnx is installed, else from a session."""
    try:
        import onnx
    except ImportError:
        from .backends.ort import session_options
        from .backends.ort_install import import_onnxruntime

        return import_onnxruntime().InferenceSession(str(path), session_options(1),
                                                     providers=["CPUExecutionProvider"])
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {i.name for i in graph.initializer}

    def args(values):
        return [SimpleNamespace(
            name=v.name, type=_ORT_TYPES.get(v.type.tensor_type.elem_type, "?"),
            shape=[d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                   for d in v.type.tensor_type.shape.dim])
            for v in values if v.name not in weights]

    return SimpleNamespace(get_inputs=lambda: args(graph.input),
                           get_outputs=lambda: args(graph.output))


def check_signatures(model_dir: Path, manifest: Manifest) -> list[Finding]:
    out = []
    for name, entry in manifest.graphs.items():
        try:
            check_signature(entry, _signature(model_dir / entry.file))
            out.append(Finding("signature", name, True, _io(entry)))
        except ModelDirError as e:
            out.append(Finding("signature", name, False, str(e).split("\n", 1)[-1].strip()))
        except Exception as e:  # an unreadable graph: onnx's or onnxruntime's own error
            out.append(Finding("signature", name, False, f"{type(e).__name__}: {e}"))
    return out


def _io(entry: GraphEntry) -> str:
    return (f"{len(entry.inputs)} inputs, {len(entry.outputs)} outputs, {len(entry.state)} "
            f"state tensors, {len(entry.rings)} KV rings as the manifest says")


def verify_model(model_dir: str | Path, name: str | None = None,
                 progress: Progress = print) -> tuple[Report, Manifest]:
    """The torch-free checks of a model directory (module docstring)."""
    model_dir = Path(model_dir)
    manifest, _ = read_manifest(model_dir / MANIFEST)
    report = Report(name or str(model_dir), str(model_dir))
    report.findings += check_hashes(model_dir, manifest, progress)
    report.findings += check_signatures(model_dir, manifest)
    return report, manifest
