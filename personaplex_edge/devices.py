"""Which devices a model directory runs on, from its manifest alone: what `verify` prints and
the model card lists. The backends decide for real at load (runtime/backends); this is the same
rule said before anything loads.

    onnxruntime on the CPU      every precision but bf16 (no bfloat16 product there)
    NVIDIA GPUs                 onnxruntime-gpu (CUDA) for an onnx model, TensorRT engines for a
                                tensorrt one
    WebGPU (Vulkan/Metal/D3D12) every adapter when nothing computes in float16 (fp32, or int8 /
                                int4 exported with --compute float32); adapters with shader-f16
                                when something does; none for bf16
"""

from __future__ import annotations

from .manifest import Manifest


def model_devices(manifest: Manifest) -> list[str]:
    """One line per device family that runs this model, with its `--device`."""
    graphs = manifest.graphs.values()
    bf16 = any(g.compute_dtype == "bfloat16" or any(
        t.dtype == "bfloat16" for t in (*g.inputs, *g.outputs, *g.state, *g.rings))
        for g in graphs)
    float16 = any(g.float16 for g in graphs)
    out = []
    if not bf16:
        out.append("the CPU, onnxruntime (--device cpu)")
    out.append("NVIDIA GPUs, " + ("TensorRT engines" if manifest.backend == "tensorrt"
                                  else "onnxruntime-gpu's CUDA provider") + " (--device cuda)")
    if not bf16:
        out.append("WebGPU (Vulkan, Metal, D3D12), "
                   + ("adapters with shader-f16" if float16 else "every adapter")
                   + " (--device webgpu)")
    return out
