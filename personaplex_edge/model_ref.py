"""What `--model` names, as a local model directory: a directory, or the name of a built-in
model (random weights, exported on first use). Every front end - the CLI and the public API -
resolves a model here, so a name means the same thing everywhere.

Built-in models are exported by the torch side (personaplex_edge.export), imported only on a
built-in's first use: the runtime stays torch-free for every other model.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .config import PRESETS
from .errors import ModelDirError, PersonaPlexError

BUILTIN_DIR = Path("models")  # where built-in models are exported on first use (cwd-relative)


def need_export_extra():
    """The export extra (torch, onnx) and onnxruntime, or the error naming what to install;
    -> the export package."""
    try:
        import torch  # noqa: F401
        import onnx  # noqa: F401
    except ImportError as e:
        raise PersonaPlexError(
            f"exporting needs the export extra ({e.name} is missing): pip install "
            "'personaplex-edge[export,cpu]' (install the torch build you want first)") from None
    try:
        import onnxruntime  # noqa: F401  (each graph is checked in it against torch)
    except ImportError:
        raise PersonaPlexError(
            "exporting checks each graph in onnxruntime, which is not installed: pip install "
            "'personaplex-edge[cpu]' (or [gpu] on a CUDA machine; never both)") from None
    from . import export

    return export


def resolve_model(spec: str, progress=print) -> Path:
    """A model directory, or the name of a built-in model (random weights, exported on first use
    into models/NAME and reused after)."""
    path = Path(spec).expanduser()
    builtin = [name for name in PRESETS if name != "personaplex-7b-v1"]
    if path.is_dir():
        return path
    if spec not in builtin:
        raise ModelDirError(f"model directory {spec} does not exist; export one with "
                            "'personaplex-edge export --checkpoint ... --out DIR', or use a "
                            f"built-in model: {', '.join(builtin)}")
    target = BUILTIN_DIR / spec
    if (target / "manifest.json").is_file():
        return target
    need_export_extra()
    from .config import preset
    from .export.hub import resolve_checkpoint
    from .export.model_export import export_model
    from .export.synthetic import write_synthetic_checkpoint

    progress(f"first use of the built-in '{spec}' model (random weights; it babbles): "
             f"exporting it to {target}")
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_checkpoint(preset(spec), tmp)
        export_model(resolve_checkpoint(tmp), target, progress=progress)
    return target
