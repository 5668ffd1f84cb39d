"""personaplex-edge: NVIDIA PersonaPlex as ONNX graphs and TensorRT engines, run without torch.

The front door for code (details in runtime/api.py and the README's Python section):

    import personaplex_edge as pe

    model = pe.load("demo")                      # a model directory or a built-in name
    with model.conversation(voice="NATF2", seed=1) as conv:
        pcm_out, text = conv.step(pcm)          # float32 [1920] at 24 kHz in and out

Importing the package loads none of the runtime (no numpy, onnxruntime or torch): each name
below is imported on first use. The package itself is the torch-free core that export and
runtime share (configs, the contract of the model directory, audio files, the CLI); the torch
side is `personaplex_edge.export`, the runtime `personaplex_edge.runtime`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Conversation", "Heard", "Model", "PersonaPlexError", "Response", "__version__",
           "load", "read_audio", "write_audio"]

# public name -> the module that defines it
_LAZY = {
    "load": "personaplex_edge.runtime.api",
    "Model": "personaplex_edge.runtime.api",
    "Conversation": "personaplex_edge.runtime.api",
    "Response": "personaplex_edge.runtime.api",
    "Heard": "personaplex_edge.runtime.api",
    "PersonaPlexError": "personaplex_edge.errors",
    "read_audio": "personaplex_edge.audio",
    "write_audio": "personaplex_edge.audio",
}

if TYPE_CHECKING:
    from .audio import read_audio, write_audio
    from .errors import PersonaPlexError
    from .runtime.api import Conversation, Heard, Model, Response, load


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'personaplex_edge' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
