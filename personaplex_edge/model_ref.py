"""What `--model` (and `personaplex_edge.load(model)`) may name, resolved to a local directory:

    a directory              itself (a path that exists wins over everything below)
    a built-in name          demo, tiny: random weights, exported on first use into the
                             per-user cache (user_cache.py: ~/.cache/personaplex-edge/models/NAME);
                             the demo with a transcriber of random weights too, so that every
                             surface of the user's words works on it
    OWNER/NAME[@REVISION]    an exported model on the Hugging Face hub (hub_model.py), unless
                             OWNER is a directory here: models/NAME is a path, not an id

Torch-free: only a built-in model's first use needs the export extra. Without it (a board that
only runs the runtime) a built-in is used when one is already in the cache - copied there from a
machine that exported it - and otherwise refused with one message saying where to copy it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from .atomic import write_text_atomic
from .config import PRESETS
from .errors import ModelDirError, PersonaPlexError
from .hub_model import fetch_model, parse_model_id
from .manifest import MANIFEST
from .user_cache import user_cache_dir

# What a built-in model holds, as export/synthetic.py makes it: bumped when that changes, so a
# built-in exported by an older version is exported again instead of used (2: the voice bank's
# published names, NATF0-3, NATM0-3, VARF0-4, VARM0-4; 3: the demo's transcriber; 4: graphs
# whose int64 side a WebGPU adapter runs, so the codec and depformer capture)
BUILTIN_RECIPE = "4"
RECIPE_FILE = ".builtin-recipe"


def builtin_models() -> list[str]:
    """The names of the built-in models (the presets but the real model, which has weights)."""
    return [name for name in PRESETS if name != "personaplex-7b-v1"]


def builtin_dir(name: str) -> Path:
    """Where the built-in model `name` lives: in the per-user cache, whatever the current
    directory (a copy made elsewhere may be put there)."""
    return user_cache_dir("models", name)


def _missing_export_module() -> str | None:
    try:
        import torch  # noqa: F401
        import onnx  # noqa: F401
    except ImportError as e:
        return e.name
    return None


def need_export_extra():
    """The export package, or one message naming the extras it needs."""
    missing = _missing_export_module()
    if missing:
        raise PersonaPlexError(
            f"exporting needs the export extra ({missing} is missing): pip install "
            "'personaplex-edge[export,cpu]' (install the torch build you want first)")
    try:
        import onnxruntime  # noqa: F401  (each graph is checked in it against torch)
    except ImportError:
        raise PersonaPlexError(
            "exporting checks each graph in onnxruntime, which is not installed: pip install "
            "'personaplex-edge[cpu]' (or [gpu] on a CUDA machine; never both)") from None
    from . import export

    return export


def _builtin(name: str, progress: Callable[[str], None]) -> Path:
    target = builtin_dir(name)
    recipe = target / RECIPE_FILE
    if (target / MANIFEST).is_file():
        if recipe.is_file() and recipe.read_text().strip() == BUILTIN_RECIPE:
            return target
        if _missing_export_module():  # an older copy beats no model where it cannot be remade
            progress(f"{target} was made by an older version of personaplex-edge; using it "
                     "as it is (exporting it again needs torch)")
            return target
        progress(f"{target} was made by an older version of personaplex-edge; exporting the "
                 f"built-in '{name}' model again")
    missing = _missing_export_module()
    if missing:
        raise PersonaPlexError(
            f"the built-in '{name}' model is exported on its first use, which needs torch "
            f"({missing} is missing). Copy the {name} directory from a machine where it ran "
            f"(~/.cache/personaplex-edge/models/{name} there) to {target}, or give --model a "
            "model directory or an exported model on the Hugging Face hub (OWNER/NAME), or "
            "install the export extra: pip install 'personaplex-edge[export,cpu]'")
    need_export_extra()
    from .export.hub import resolve_checkpoint
    from .export.model_export import export_model
    from .export.synthetic import write_builtin
    from .export.transcriber import resolve_transcriber

    progress(f"first use of the built-in '{name}' model (random weights; it babbles): "
             f"exporting it to {target}")
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, stt = write_builtin(name, tmp)
        export_model(resolve_checkpoint(str(ckpt)), target, progress=progress,
                     transcriber=None if stt is None else resolve_transcriber(str(stt),
                                                                              progress))
    write_text_atomic(recipe, BUILTIN_RECIPE + "\n")
    return target


def model_kind(spec: str) -> str:
    """What `spec` names (module docstring), nothing fetched or exported: "dir", "builtin" or
    "hub"; one ModelDirError naming `spec` and what to do when it is none of them."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return "dir"
    if spec in builtin_models():
        return "builtin"
    if parse_model_id(spec) is not None and not path.parent.is_dir():
        return "hub"
    raise ModelDirError(f"model directory {spec} does not exist; export one with "
                        "'personaplex-edge export --checkpoint ... --out DIR', name an exported "
                        "model on the Hugging Face hub (OWNER/NAME[@REVISION]), or use a "
                        f"built-in model: {', '.join(builtin_models())}")


def resolve_model(spec: str, progress: Callable[[str], None] = print) -> Path:
    """The local directory `spec` names (module docstring). Every failure is one
    PersonaPlexError naming `spec` and what to do."""
    kind = model_kind(spec)
    if kind == "dir":
        return Path(spec).expanduser()
    if kind == "builtin":
        return _builtin(spec, progress)
    return fetch_model(*parse_model_id(spec), progress=progress)
