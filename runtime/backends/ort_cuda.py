"""One graph on onnxruntime's CUDA (or TensorRT) provider with every buffer on the device,
KV rings included: the GPU counterpart of OrtGraph, with the same two halves (the shared
session, `OrtCudaModelGraph`; one conversation batch's buffers, `OrtCudaGraph`).

OrtGraph cannot keep KV rings on the GPU: an OrtValue on the device has no numpy view to write
a row into. Here the buffers are our own device allocations (cuda-python), bound to
onnxruntime's IO binding by raw pointer, so the ring write is the same single strided device
copy the native TensorRT backend does (device_rings.DeviceRings). onnxruntime runs on our
stream (`user_compute_stream`), so the copies and the graph are ordered on one stream.

The session is created with our stream as its compute stream, so every conversation bound to
it queues on that one stream; each waits for its own run, so runs from several threads stay
ordered and correct (they do not overlap on the GPU).

Optionally (`cuda_graph=True`) onnxruntime captures each run as a CUDA graph and replays it; it
needs fixed addresses, which ping-pong state breaks, so each state parity gets its own graph id.
A captured graph belongs to the session, so it can serve only one bound buffer set: capture is
refused for a second conversation on the same session, for onnxruntime older than 1.18 (no
`gpu_graph_id`), and with the TensorRT provider (it keeps one graph for the session, which the
ping-pong state would replay with the wrong addresses every other frame).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from personaplex_edge.errors import ModelDirError
from personaplex_edge.manifest import GraphEntry

from .cuda_runtime import Stream, call, copy_to_device, copy_to_host
from .device_graph import DeviceGraph
from .device_rings import bind_rings_to_ort
from .ort import check_signature


def cuda_providers(stream: Stream, device_id: int = 0, tensorrt: bool = False,
                   cuda_graph: bool = False, trt_cache: str | Path | None = None) -> list:
    """Provider list for a session that runs on `stream`; TensorRT's provider first when asked
    (it takes the subgraphs it can, CUDA the rest)."""
    # user_compute_stream alone, as onnxruntime documents it for Python: both providers set
    # has_user_compute_stream from it, and that flag is slated for removal - an option a
    # release no longer knows fails the provider's registration (the session falls back to
    # the CPU)
    cuda = {"device_id": str(device_id), "user_compute_stream": str(stream.handle)}
    if cuda_graph:
        cuda["enable_cuda_graph"] = "1"
    providers: list = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
    if tensorrt:
        trt = {"device_id": str(device_id), "user_compute_stream": str(stream.handle),
               "trt_timing_cache_enable": "True"}
        if trt_cache is not None:
            trt.update({"trt_engine_cache_enable": "True",
                        "trt_engine_cache_path": str(trt_cache),
                        "trt_timing_cache_path": str(trt_cache)})
        if cuda_graph:
            trt["trt_cuda_graph_enable"] = "True"
        providers.insert(0, ("TensorrtExecutionProvider", trt))
    return providers


class OrtCudaModelGraph:
    """The shared half: the session on our stream, its signature checked."""

    def __init__(self, model_dir: str | Path, entry: GraphEntry, stream: Stream | None = None,
                 tensorrt: bool = False, cuda_graph: bool = False, device_id: int = 0,
                 trt_cache: str | Path | None = None):
        import onnxruntime as ort

        from .ort import session_options

        self.runs_on = "onnxruntime-tensorrt" if tensorrt else "onnxruntime-cuda"
        if cuda_graph:
            refuse_cuda_graph(ort.__version__, tensorrt)
        self.entry = entry
        call("cudaSetDevice", device_id)  # our stream and buffers on the session's device
        self.stream = stream or Stream()
        self._own_stream = stream is None
        self.cuda_graph = cuda_graph
        self.device_id = device_id
        self._bound = 0
        path = Path(model_dir) / entry.file
        providers = cuda_providers(self.stream, device_id, tensorrt, cuda_graph, trt_cache)
        try:
            self.session = ort.InferenceSession(str(path), session_options(), providers=providers)
        except Exception as e:
            raise ModelDirError(f"onnxruntime cannot load {path} on the GPU: {e}") from e
        wanted = "TensorrtExecutionProvider" if tensorrt else "CUDAExecutionProvider"
        if wanted not in self.session.get_providers():
            raise ModelDirError(f"onnxruntime did not enable {wanted} for {path.name} (it has "
                                f"{', '.join(self.session.get_providers())}): install "
                                "onnxruntime-gpu built for this CUDA, with its CUDA libraries")
        check_signature(entry, self.session)
        self.providers = self.session.get_providers()

    def bind(self) -> "OrtCudaGraph":
        if self.cuda_graph and self._bound:
            raise ModelDirError(f"{self.entry.file}: onnxruntime's captured CUDA graph belongs "
                                "to its session and serves one conversation; open the model "
                                "without cuda_graph for several")
        self._bound += 1
        return OrtCudaGraph(self)

    def close(self) -> None:
        self.stream.synchronize()
        self.session = None
        if self._own_stream:
            self.stream.close()


def refuse_cuda_graph(ort_version: str, tensorrt: bool) -> None:
    """CUDA graph capture where onnxruntime cannot get it right (see the module docstring)."""
    major, minor = (int(x) for x in ort_version.split(".")[:2])
    if (major, minor) < (1, 18):
        raise ModelDirError(f"onnxruntime {ort_version} cannot replay a graph per state set "
                            "(gpu_graph_id came in 1.18): upgrade onnxruntime-gpu or run "
                            "without CUDA graphs")
    if tensorrt:
        raise ModelDirError("CUDA graphs with onnxruntime's TensorRT provider would replay one "
                            "graph over ping-pong state; use the native TensorRT backend "
                            "(export --backend tensorrt) for captured frames")


class OrtCudaGraph(DeviceGraph):
    def __init__(self, graph: OrtCudaModelGraph):
        import onnxruntime as ort

        self.graph = graph
        self._allocate(graph.entry, graph.stream)  # the session's stream: it runs on it
        self._session = graph.session
        self._device_id = graph.device_id
        self._bindings = [self._bind(read=i, write=1 - i) for i in range(2)]
        self._run_options = []
        for parity in range(2):
            opts = ort.RunOptions()
            if graph.cuda_graph:  # one captured graph per ping-pong parity
                opts.add_run_config_entry("gpu_graph_id", str(parity + 1))
            self._run_options.append(opts)
        self.reset()

    def _bind(self, read: int, write: int):
        # the buffers live on the session's device: a binding naming another one would make
        # onnxruntime copy them over (or read them there) every run
        b, dev = self._session.io_binding(), self._device_id
        for t in self.entry.inputs:
            b.bind_input(t.name, "cuda", dev, np.dtype(t.dtype), list(t.shape),
                         self._dev_in[t.name].ptr)
        for t in self.entry.outputs:
            b.bind_output(t.name, "cuda", dev, np.dtype(t.dtype), list(t.shape),
                          self._dev_out[t.name].ptr)
        for s in self.entry.state:
            b.bind_input(s.input_name, "cuda", dev, np.dtype(s.dtype), list(s.shape),
                         self._state[read][s.name].ptr)
            b.bind_output(s.output_name, "cuda", dev, np.dtype(s.dtype), list(s.shape),
                          self._state[write][s.name].ptr)
        bind_rings_to_ort(b, self.rings, dev)
        return b

    def _call(self, active: list[int] | None) -> None:
        """One call; the new K/V rows are written into the rings before it returns."""
        self._check_open(self._session)
        positions = self._positions.now()  # before the call
        for name, pinned in self._pinned_in.items():
            copy_to_device(self._dev_in[name].ptr, pinned.array, self.stream, pinned.ptr)
        # onnxruntime runs on our stream, after the copies; it synchronizes before returning
        self._session.run_with_iobinding(self._bindings[self._turn],
                                         self._run_options[self._turn])
        self.rings.write(positions, self.stream, active)
        for name, pinned in self._pinned_out.items():
            copy_to_host(pinned.array, self._dev_out[name].ptr, self.stream, pinned.ptr)
        self._positions.after_run(self._state_ptrs(1 - self._turn), self.stream)
        self.stream.synchronize()

    def close(self) -> None:
        self._session = self._bindings = None
        super().close()  # the stream is the session's: it stays
