"""A frame's TensorRT graphs captured once as a CUDA graph and replayed with one launch.

Without capture every frame costs one host round trip per kernel: TensorRT launches hundreds of
small kernels per step (a 7B step is ~10 kernels x 32 layers), a few microseconds of host time
each, which is where NVIDIA's own port and vllm-omni found most of their eager time. Captured,
the whole sequence - host-to-device copies of the tokens, the engines, device-to-host copies of
the results - is one cudaGraphLaunch.

What can be captured is fixed addresses and fixed work. The graphs' pinned host arrays and
device buffers never move, and ping-pong state alternates between two address sets, so two
captures (one per parity) cover every frame. The KV ring write is not captured: its destination
slot changes every frame, so `launch()` queues it after the replay (one cudaMemcpy2DAsync per
row), ordered on the same stream, at the positions read before the launch - as `run()` does.

    seq = CapturedSequence([helium, depformer])   # after depformer.link_input(...) calls
    per frame: fill helium.inputs; seq.launch(); seq.synchronize(); read the outputs
"""

from __future__ import annotations

from .cuda_runtime import CudaError, call, cudart
from .trt import TrtGraph


class CapturedSequence:
    def __init__(self, graphs: list[TrtGraph]):
        if not graphs:
            raise ValueError("nothing to capture")
        self.graphs = list(graphs)
        self.stream = graphs[0].stream
        if any(g.stream is not self.stream for g in graphs):
            raise ValueError("the captured graphs must share one stream")
        self._stateful = [g for g in graphs if g.entry.state]
        if len({g._turn for g in self._stateful}) > 1:
            raise ValueError("stateful graphs must be in step (reset them together) before "
                             "capture")
        self._warm_up()
        self._execs = {}
        parities = (0, 1) if self._stateful else (None,)
        turns = [g._turn for g in self._stateful]
        try:
            for parity in parities:
                for g in self._stateful:
                    g._turn = parity  # capture records the address set of this parity
                self._execs[parity] = self._capture()
        finally:
            for g, t in zip(self._stateful, turns):
                g._turn = t

    def _warm_up(self) -> None:
        """TensorRT wants one real enqueue before a capture (lazy initialisation inside). It
        changes the state and the rings, so both are saved and restored around it."""
        keep = [g for g in self.graphs if g.entry.state or g.entry.rings]
        saved = [g.state() for g in keep]
        turns = [g._turn for g in self.graphs]
        for g in self.graphs:
            g.enqueue()
        self.stream.synchronize()
        for g, t in zip(self.graphs, turns):
            g._turn = t
        for g, state in zip(keep, saved):
            g.set_state(state)

    def _capture(self):
        rt = cudart()
        call("cudaStreamBeginCapture", self.stream.raw,
             rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal)
        try:
            for g in self.graphs:
                g.enqueue(rings=False)
        except BaseException:
            try:
                call("cudaStreamEndCapture", self.stream.raw)
            except CudaError:
                pass
            raise
        graph = call("cudaStreamEndCapture", self.stream.raw)
        try:
            # cudaGraphInstantiate took (graph, log buffer size) and returned three values
            # before CUDA 12, (graph, flags) since; the WithFlags form is (graph, flags) with
            # one value in every cuda-python from 11.4 to 13.
            return call("cudaGraphInstantiateWithFlags", graph, 0)
        finally:
            call("cudaGraphDestroy", graph)

    def launch(self, active: list[int] | None = None) -> None:
        """Queues the whole sequence, then each graph's ring writes for the `active` batch rows
        (None: all; the others are held, as BoundGraph.run holds them); the graphs' host
        `inputs` are read when it runs. The previous launch must have been waited for
        (positions kept in state are mirrored to the host by it)."""
        positions = [g._positions.now() for g in self.graphs]  # host values, read now
        parity = self._stateful[0]._turn if self._stateful else None
        call("cudaGraphLaunch", self._execs[parity], self.stream.raw)
        for g, p in zip(self.graphs, positions):
            if g.entry.rings:
                g.rings.write(p, self.stream, active)
        for g in self._stateful:
            g.finish_call(active)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def run(self, active: list[int] | None = None) -> list[dict]:
        self.launch(active)
        self.synchronize()
        return [g.outputs for g in self.graphs]

    def close(self) -> None:
        for exe in self._execs.values():
            call("cudaGraphExecDestroy", exe)
        self._execs = {}
