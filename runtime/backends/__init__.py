"""Which engine runs a model directory's graphs - onnxruntime (CPU, CUDA) or native TensorRT -
and the one interface every backend offers.

A graph has two halves. The loaded half (`LoadedGraph`: an onnxruntime session, a TensorRT
engine) holds the weights and is shared read-only by every conversation on a model. The bound
half (`Graph`, from `LoadedGraph.bind()`) is one conversation batch's buffers: its inputs,
outputs, state (ping-pong sets) and KV rings, allocated once. `state.BoundGraph` implements
state save/restore/reset/hold for all backends on top of each one's stores.

`--device`: `cpu` runs onnxruntime on the CPU (a TensorRT model's ONNX graphs included, said
once); `cuda` needs a working NVIDIA backend and `webgpu` a WebGPU adapter (onnxruntime's WebGPU
provider: Vulkan, Metal, D3D12; ort_webgpu.py), each otherwise one clear error; `auto` takes
the NVIDIA backend where it works, else a WebGPU hardware adapter, else the CPU, with one line
saying which (and why not the others).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from personaplex_edge.contract import DEVICES
from personaplex_edge.errors import ModelDirError, PersonaPlexError
from personaplex_edge.manifest import GraphEntry, Manifest

from .ort import OrtModelGraph, choose_providers
from .ort_install import side_by_side


class Graph(Protocol):
    """One conversation batch's half of a graph (see the module docstring)."""

    entry: GraphEntry
    batch: int
    inputs: dict[str, np.ndarray]  # write these, then run()
    outputs: dict[str, np.ndarray]  # valid until the next run()

    def run(self, active: Sequence[int] | None = None) -> dict[str, np.ndarray]: ...
    def reset(self, rows: Sequence[int] | None = None) -> None: ...
    def state(self, rows: Sequence[int] | None = None) -> dict[str, np.ndarray]: ...
    def set_state(self, arrays: dict[str, np.ndarray],
                  rows: Sequence[int] | None = None) -> None: ...
    # the first `slots` slots of every KV ring: a persona's snapshot, and its restore
    def ring_prefix(self, rows: Sequence[int] | None, slots: int) -> dict[str, np.ndarray]: ...
    def set_ring_prefix(self, arrays: dict[str, np.ndarray],
                        rows: Sequence[int] | None) -> None: ...
    # every slot of the KV rings written (bench --position: a long conversation's memory)
    def fill_rings(self, rows: Sequence[int] | None, value: float = 0.0) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class FramedGraph(Graph, Protocol):
    """A Graph whose backend also runs a graph with a frames axis (helium_step) over F frames
    in one call: the persona's prefill. Backends without it prefill frame by frame."""

    def run_frames(self, frames: dict[str, np.ndarray], active: list[int]) -> None: ...


class LoadedGraph(Protocol):
    entry: GraphEntry
    runs_on: str  # what computes it: onnxruntime-cpu, onnxruntime-cuda, onnxruntime-tensorrt,
    #               tensorrt (their numbers differ in the last bits: caches keep them apart)

    def bind(self) -> Graph: ...
    def close(self) -> None: ...


class DeviceUnavailable(PersonaPlexError):
    """--device cuda where no GPU backend can be used."""


def _gpu_backend(model_dir: Path, manifest: Manifest, names: Sequence[str],
                 progress: Callable[[str], None]) -> dict[str, LoadedGraph]:
    """The graphs on the GPU: TensorRT engines for a TensorRT model (mainline TensorRT or
    TensorRT for RTX; the model directory's own where they run on this GPU, else built on first
    use into the per-user cache),
    else onnxruntime's CUDA provider (rings on the device through cuda-python). Raises
    PersonaPlexError with the reason where that cannot work here."""
    if manifest.backend == "tensorrt":
        from .trt import TrtEngine  # only where TensorRT is installed
        from .trt_build import engines_for_this_gpu
        from .trt_library import TensorRTMissing

        try:
            engines = engines_for_this_gpu(model_dir, manifest, list(names), progress)
        except TensorRTMissing as e:
            raise DeviceUnavailable(f"this model runs on TensorRT engines, and {e}; or export "
                                    "the model again with --backend onnx") from None
        return {n: TrtEngine(model_dir, manifest, engines[n].entry,
                             engine_dir=engines[n].directory) for n in names}
    if "CUDAExecutionProvider" not in choose_providers("auto"):
        raise DeviceUnavailable("this onnxruntime has no CUDA provider (install the gpu extra: "
                                "pip install 'personaplex-edge[gpu]')")
    graphs: dict[str, LoadedGraph] = {}
    for n in names:
        entry = manifest.graphs[n]
        if entry.rings or entry.state:
            from .ort_cuda import OrtCudaModelGraph  # KV rings on the device, written in place

            graphs[n] = OrtCudaModelGraph(model_dir, entry)
        else:
            g = OrtModelGraph(model_dir, entry, choose_providers("cuda"))
            if g.device != "cuda":
                raise DeviceUnavailable("onnxruntime's CUDA provider could not start (its CUDA "
                                        "or cuDNN libraries are missing or do not match)")
            graphs[n] = g
    return graphs


def _no_nvidia(manifest: Manifest) -> bool:
    """No NVIDIA backend is installed that could run this model (an onnx model, no CUDA
    provider)."""
    return manifest.backend != "tensorrt" and \
        "CUDAExecutionProvider" not in choose_providers("auto")


def cpu_only(manifest: Manifest, device: str = "auto") -> bool:
    """Whether load_graphs puts this model on the CPU without trying a GPU backend: asked for,
    or under `auto` no NVIDIA backend is installed and WebGPU offers no GPU adapter."""
    if device in ("cuda", "webgpu"):
        return False
    return device == "cpu" or (_no_nvidia(manifest) and webgpu_refusal(manifest) is not None)


def webgpu_refusal(manifest: Manifest, names: Sequence[str] | None = None,
                   hardware_only: bool = True) -> str | None:
    """Why WebGPU cannot run this model's graphs (`names`, default all) here, or None when it
    can. The provider not installed at all is a reason too ("not installed")."""
    from .webgpu_adapter import WebGpuUnavailable, find_adapter

    try:
        adapter = find_adapter(hardware_only)
    except WebGpuUnavailable as e:
        return str(e)
    names = list(manifest.graphs) if names is None else names
    bf16 = [n for n in names if manifest.graphs[n].compute_dtype == "bfloat16"]
    if bf16:
        return (f"{', '.join(bf16)} computes in bfloat16, which WebGPU has not: export "
                "--precision fp16 (or int8, int4) for it")
    half = [n for n in names if manifest.graphs[n].float16]
    if half and not adapter.shader_f16:
        return (f"{', '.join(half)} computes in float16 and the adapter {adapter.name} has no "
                "shader-f16: export --precision fp32, or int8/int4 with --compute float32, "
                "which every adapter runs")
    return None


def _webgpu_backend(model_dir: Path, manifest: Manifest, names: Sequence[str],
                    hardware_only: bool, threads: int | None,
                    say: Callable[[str], None]) -> dict[str, LoadedGraph]:
    """The graphs on a WebGPU adapter (ort_webgpu.py), or DeviceUnavailable with the reason."""
    from .ort_webgpu import OrtWebGpuModelGraph, capture_asked
    from .webgpu_adapter import find_adapter

    refusal = webgpu_refusal(manifest, names, hardware_only)
    if refusal is not None:
        raise DeviceUnavailable(refusal)
    adapter = find_adapter(hardware_only)
    capture = capture_asked()
    say(f"running on WebGPU: {adapter.describe()}")
    if manifest.backend == "tensorrt":
        say("running this TensorRT model's ONNX graphs on WebGPU")
    graphs = {n: OrtWebGpuModelGraph(model_dir, manifest.graphs[n], adapter, threads, capture)
              for n in names}
    if capture:
        refused = [n for n, g in graphs.items() if g.capture_refused]
        captured = [n for n in names if n not in refused]
        say("graph capture: " + (f"{', '.join(captured)} captured" if captured else "none")
            + (f"; the provider refused it for {', '.join(refused)} (nodes of them run on the "
               "CPU), which run uncaptured" if refused else ""))
    return graphs


def load_graphs(model_dir: str | Path, manifest: Manifest, names: Sequence[str],
                device: str = "auto", threads: int | None = None,
                progress: Callable[[str], None] | None = None) -> dict[str, LoadedGraph]:
    """The loaded halves of `names`, on the device `device` resolves to (module docstring)."""
    model_dir = Path(model_dir)
    if device not in DEVICES:
        raise ModelDirError(f"unknown device {device!r}; use {', '.join(DEVICES)}")
    say = progress or (lambda line: None)
    both = side_by_side()
    if both:
        say(f"warning: {both}")
    if device == "webgpu":
        try:
            return _webgpu_backend(model_dir, manifest, names, False, threads, say)
        except PersonaPlexError as e:
            raise DeviceUnavailable(f"--device webgpu: {e}") from None
    if device == "auto" and _no_nvidia(manifest) and webgpu_installed():
        try:  # no NVIDIA backend: a WebGPU GPU, where there is one
            return _webgpu_backend(model_dir, manifest, names, True, threads, say)
        except PersonaPlexError as e:
            say(f"running on the CPU: {e}")
            return _cpu_graphs(model_dir, manifest, names, threads, say)
    if not cpu_only(manifest, device):
        try:
            return _gpu_backend(model_dir, manifest, names, say)
        except PersonaPlexError as e:
            if device == "cuda":
                raise DeviceUnavailable(f"--device cuda: {e}") from None
            say(f"running on the CPU: the GPU backend cannot be used here ({e})")
    elif device == "cuda":
        raise DeviceUnavailable("--device cuda: this onnxruntime has no CUDA provider (install "
                                "the gpu extra: pip install 'personaplex-edge[gpu]')")
    return _cpu_graphs(model_dir, manifest, names, threads, say)


def _cpu_graphs(model_dir: Path, manifest: Manifest, names: Sequence[str],
                threads: int | None, say: Callable[[str], None]) -> dict[str, LoadedGraph]:
    bf16 = [n for n in names if manifest.graphs[n].precision == "bf16"]
    if bf16:  # onnxruntime's CPU has no bfloat16 MatMul: its own error names an operator
        raise ModelDirError(
            f"{', '.join(bf16)} {'is' if len(bf16) == 1 else 'are'} bfloat16, which onnxruntime "
            "cannot run on the CPU: run this model on a GPU with TensorRT (its engines), or "
            "export --precision fp16 (or int8, int4) for onnxruntime")
    if manifest.backend == "tensorrt":
        say("running this TensorRT model's ONNX graphs in onnxruntime on the CPU")
    return {n: OrtModelGraph(model_dir, manifest.graphs[n], ["CPUExecutionProvider"], threads)
            for n in names}


def describe_device(graphs: dict[str, LoadedGraph]) -> str:
    """What computes the graphs, in words: "onnxruntime-cpu", or the WebGPU adapter's line."""
    runs = ", ".join(sorted({g.runs_on for g in graphs.values()}))
    adapters = sorted({g.adapter.describe() for g in graphs.values()
                       if getattr(g, "adapter", None) is not None})
    return runs + (f" on {'; '.join(adapters)}" if adapters else "")


def webgpu_installed() -> bool:
    """Whether onnxruntime's WebGPU provider is installed (the webgpu extra)."""
    from importlib.util import find_spec

    return find_spec("onnxruntime_ep_webgpu") is not None


def trt_loaded(graph: LoadedGraph) -> bool:
    """Whether `graph` is a TensorRT engine, of either library (without importing TensorRT
    where it is not)."""
    return type(graph).__name__ == "TrtEngine" and type(graph).__module__.endswith(".trt")
