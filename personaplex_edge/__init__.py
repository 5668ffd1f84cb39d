"""personaplex-edge: NVIDIA PersonaPlex as ONNX graphs and TensorRT engines, run without torch.

This package (the torch-free core) holds what export and runtime share: configs, the state and
manifest contract of the exported model directory, audio file helpers and the CLI. The torch side
is `personaplex_edge.export`, the torch-free runtime `personaplex_edge.runtime`.
"""

__version__ = "0.1.0"
