"""The one interface of runtime/backends: every backend's bound and loaded halves offer each
member of the `Graph` and `LoadedGraph` protocols, with the protocol's parameters, so a
conversation never asks a backend for something only another one has. (Imports only: the GPU
backends' modules load without a GPU.)"""

from __future__ import annotations

import inspect

import pytest

from personaplex_edge.runtime.backends import FramedGraph, Graph, LoadedGraph
from personaplex_edge.runtime.backends.ort import OrtGraph, OrtModelGraph
from personaplex_edge.runtime.backends.ort_cuda import OrtCudaGraph, OrtCudaModelGraph
from personaplex_edge.runtime.backends.trt import TrtEngine, TrtGraph


def _methods(protocol) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(protocol).items()
            if callable(fn) and not name.startswith("_")}


def _params(sig: inspect.Signature) -> list[str]:
    return [p for p in sig.parameters if p != "self"]


@pytest.mark.parametrize("cls", [OrtGraph, OrtCudaGraph, TrtGraph])
def test_every_bound_graph_offers_the_graph_interface(cls):
    methods = _methods(Graph)
    assert {"run", "reset", "state", "set_state", "ring_prefix", "set_ring_prefix",
            "close"} <= set(methods)
    for name, sig in methods.items():
        assert callable(getattr(cls, name, None)), f"{cls.__name__} has no {name}()"
        assert _params(inspect.signature(getattr(cls, name)))[:len(_params(sig))] == \
            _params(sig), f"{cls.__name__}.{name} takes other parameters than Graph.{name}"


@pytest.mark.parametrize("cls", [OrtModelGraph, OrtCudaModelGraph, TrtEngine])
def test_every_loaded_graph_binds_and_closes(cls):
    for name in _methods(LoadedGraph):
        assert callable(getattr(cls, name, None)), f"{cls.__name__} has no {name}()"


def test_which_backends_prefill_in_one_call():
    """onnxruntime on the CPU and TensorRT run the persona's frames in one call; onnxruntime's
    CUDA provider prefills frame by frame (no frames binding there yet)."""
    framed = {cls.__name__ for cls in (OrtGraph, OrtCudaGraph, TrtGraph)
              if callable(getattr(cls, "run_frames", None))}
    assert framed == {"OrtGraph", "TrtGraph"}
    assert "run_frames" in _methods(FramedGraph)
