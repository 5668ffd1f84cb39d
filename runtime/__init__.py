"""Torch-free runtime: sessions on onnxruntime (and TensorRT), the codec, the duplex loop.

Never import torch here: a test fails if this package pulls it in."""
