"""Torch side: plain-torch modules with explicit state, checkpoint loading, ONNX export."""
