"""The language model's part of a tick: Helium's step, then the depformer on its hidden state.

On onnxruntime the hidden state and text token pass through the host between the two graphs
(`HostLM`). On TensorRT they do not: the depformer reads Helium's device outputs directly, both
run on one stream, and the pair is captured once as a CUDA graph and replayed with one launch
per tick (`DeviceLinkedLM`) - the path scripts/gpu_check measures is the path a conversation
takes. Set PERSONAPLEX_CUDA_GRAPHS=0 to run the linked pair eagerly instead.

`steer`, when a row of the batch is saying words (runtime/words/say.py), changes the sampled text
tokens [B] in place before the depformer runs on them; what it leaves there is what `run`
returns for the token ring. Through the host that is free. On the device the token must come to
the host and go back, so a frame with words queued runs the pair eagerly, with the text token
read back, steered and written to the depformer's input between the two; frames without any
run as before.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from personaplex_edge.contract import AUDIO_TOKENS, HIDDEN, TEXT_TOKEN

from .backends import Graph, LoadedGraph
from .metrics import FrameMetrics

Steer = Callable[[np.ndarray], None]  # text tokens [B], changed in place


class HostLM:
    def __init__(self, helium: Graph, depformer: Graph):
        self.helium, self.depformer = helium, depformer
        self._hidden, self._text = depformer.inputs[HIDDEN], depformer.inputs[TEXT_TOKEN]

    def run(self, rows: list[int] | None, metrics: FrameMetrics | None = None,
            steer: Steer | None = None) -> tuple[np.ndarray, np.ndarray]:
        """-> (text token [B], the agent's codes [B, 8]): views, valid until the next run."""
        out = self.helium.run(rows)  # also writes the rows' K/V into the rings
        if metrics is not None:
            metrics.mark("temporal")
        np.copyto(self._hidden, out[HIDDEN])
        np.copyto(self._text, out[TEXT_TOKEN])
        if steer is not None:
            steer(self._text)
        audio = self.depformer.run(rows)[AUDIO_TOKENS]
        if metrics is not None:
            metrics.mark("depformer")
        return self._text, audio

    def close(self) -> None:
        self.helium.close()
        self.depformer.close()


class DeviceLinkedLM:
    """Helium and the depformer as TensorRT graphs chained on the device (see the module
    docstring). Both graphs' work is one device sequence, so the tick's temporal stage holds
    the depformer's time too."""

    def __init__(self, helium_engine, depformer_engine, capture: bool = True):
        from .backends.cuda_graphs import CapturedSequence
        from .backends.cuda_runtime import CudaError

        self.helium = helium_engine.bind()
        self.depformer = depformer_engine.bind(stream=self.helium.stream)
        self.depformer.link_input(HIDDEN, self.helium, HIDDEN)
        self.depformer.link_input(TEXT_TOKEN, self.helium, TEXT_TOKEN)
        self.sequence = None
        self.capture_error: str | None = None
        if capture:
            try:
                self.sequence = CapturedSequence([self.helium, self.depformer])
            except CudaError as e:  # capture refused: eager launches still chain on device
                self.capture_error = str(e)

    def run(self, rows: list[int] | None, metrics: FrameMetrics | None = None,
            steer: Steer | None = None) -> tuple[np.ndarray, np.ndarray]:
        if self.sequence is not None and steer is None:
            self.sequence.run(rows)
        else:
            self.helium.enqueue(active=rows)
            if steer is not None:
                # the token comes to the host before the depformer may read it: one more wait
                # on the stream, and no replay (the captured pair cannot stop halfway)
                self.helium.stream.synchronize()
                steer(self.helium.outputs[TEXT_TOKEN])
                self.helium.put_output(TEXT_TOKEN)
            self.depformer.enqueue(active=rows)
            self.helium.stream.synchronize()
            self.helium.finish_call(rows)
            self.depformer.finish_call(rows)
        if metrics is not None:
            metrics.mark("temporal")
            metrics.mark("depformer")
        return self.helium.outputs[TEXT_TOKEN], self.depformer.outputs[AUDIO_TOKENS]

    def close(self) -> None:
        if self.sequence is not None:
            self.sequence.close()
        self.depformer.close()
        self.helium.close()


def lm_frame(helium: LoadedGraph, depformer: LoadedGraph):
    """The LM part of a tick for these loaded graphs: device-linked where both are TensorRT
    engines, through the host otherwise."""
    from .backends import trt_loaded

    if trt_loaded(helium) and trt_loaded(depformer):
        return DeviceLinkedLM(helium, depformer,
                              capture=os.environ.get("PERSONAPLEX_CUDA_GRAPHS", "1") != "0")
    return HostLM(helium.bind(), depformer.bind())
