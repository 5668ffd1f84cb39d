"""Which engine runs a model directory's graphs: onnxruntime (CPU, CUDA) or native TensorRT.

Every backend's graph object offers the same small surface, the one `OrtGraph` defines:
`inputs` / `outputs` (host arrays: write the former, read the latter after `run()`), `run()`,
`reset()`, `state()` / `set_state()`, `close()` (frees what the graph holds now, device
memory on a GPU backend); `run()` also writes the call's new K/V rows into the rings.
"""

from __future__ import annotations

from pathlib import Path

from personaplex_edge.manifest import GraphEntry, Manifest

from .ort import OrtGraph, choose_providers


def open_graph(model_dir: str | Path, manifest: Manifest, name: str, device: str = "auto",
               threads: int | None = None):
    entry: GraphEntry = manifest.graphs[name]
    if manifest.backend == "tensorrt":
        from .trt import TrtGraph  # only where TensorRT is installed

        return TrtGraph(model_dir, manifest, entry)
    providers = choose_providers(device)
    if providers[0] == "CUDAExecutionProvider" and entry.rings:
        from .ort_cuda import OrtCudaGraph  # KV rings on the device, rows written in place

        return OrtCudaGraph(model_dir, entry)
    return OrtGraph(model_dir, entry, providers, threads)
