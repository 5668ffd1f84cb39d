"""`--device`: cpu is honoured on every model (a TensorRT model's graphs run in onnxruntime on
the CPU, said once), cuda where no GPU backend works is one message and exit 2 with nothing
written, auto falls back to the CPU with one line saying why; and onnxruntime's CUDA graphs
are refused where they cannot be right."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import soundfile as sf

from personaplex_edge.cli import main
from personaplex_edge.errors import ModelDirError
from personaplex_edge.manifest import load_model_dir
from personaplex_edge.runtime import backends
from personaplex_edge.runtime.backends.ort_cuda import refuse_cuda_graph
from personaplex_edge.runtime.api import Model
from personaplex_edge.runtime.persona import Persona
from personaplex_edge.runtime.sampling import SamplingParams


def _input(tmp_path):
    t = np.arange(24000) / 24000
    sf.write(tmp_path / "in.wav", 0.2 * np.sin(2 * np.pi * 220 * t), 24000)
    return tmp_path / "in.wav"


def test_device_cuda_without_a_gpu_backend_is_one_message_and_no_output(demo_model_dir,
                                                                         tmp_path, capsys):
    rc = main(["run", "--model", str(demo_model_dir), "--input", str(_input(tmp_path)),
               "--output", str(tmp_path / "out.wav"), "--device", "cuda"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("error:") == 1 and "Traceback" not in err
    assert "--device cuda" in err and "personaplex-edge[gpu]" in err  # what to install
    assert not (tmp_path / "out.wav").exists()


def test_device_auto_falls_back_to_the_cpu_with_one_line(demo_model_dir, monkeypatch):
    """A CUDA provider that is listed but cannot start (missing cuDNN, say): auto runs on the
    CPU and says why, once; cuda refuses with the same reason."""
    monkeypatch.setattr(backends, "choose_providers",
                        lambda device="auto": ["CUDAExecutionProvider", "CPUExecutionProvider"])

    def broken(*args):
        raise backends.DeviceUnavailable("onnxruntime's CUDA provider could not start (test)")

    monkeypatch.setattr(backends, "_gpu_backend", broken)
    said = []
    model = Model.load(demo_model_dir, device="auto", progress=said.append)
    assert [line for line in said if "CPU" in line] == [
        "running on the CPU: the GPU backend cannot be used here (onnxruntime's CUDA provider "
        "could not start (test))"]
    assert all(g.device == "cpu" for g in model.loaded.graphs.values())
    with pytest.raises(backends.DeviceUnavailable, match="--device cuda: onnxruntime's CUDA"):
        Model.load(demo_model_dir, device="cuda")


def test_device_cpu_runs_a_tensorrt_models_graphs_on_the_cpu(demo_model_dir, tmp_path):
    """A model exported for TensorRT keeps its ONNX graphs: --device cpu runs them in
    onnxruntime (no TensorRT import at all) and says so, and answers as the onnx model does."""
    import shutil

    from personaplex_edge.manifest import write_manifest

    trt_dir = tmp_path / "trt"
    shutil.copytree(demo_model_dir, trt_dir)
    write_manifest(trt_dir, dataclasses.replace(load_model_dir(trt_dir), backend="tensorrt"))
    pcm = (np.random.default_rng(0).standard_normal(5 * 1920) * 0.1).astype(np.float32)
    outs = []
    for directory in (demo_model_dir, trt_dir):
        said = []
        model = Model.load(directory, device="cpu", progress=said.append)
        with model.open_conversation(SamplingParams(greedy=True),
                                     Persona(enabled=False)) as conv:
            outs.append(np.concatenate([conv.step(pcm[i * 1920:(i + 1) * 1920])[0].copy()
                                        for i in range(5)]))
    assert said == ["running this TensorRT model's ONNX graphs in onnxruntime on the CPU"]
    np.testing.assert_array_equal(outs[0], outs[1])


def test_onnxruntime_cuda_graphs_are_refused_where_they_cannot_be_right():
    with pytest.raises(ModelDirError, match="gpu_graph_id came in 1.18"):
        refuse_cuda_graph("1.17.3", tensorrt=False)
    with pytest.raises(ModelDirError, match="TensorRT provider"):
        refuse_cuda_graph("1.20.1", tensorrt=True)
    refuse_cuda_graph("1.20.1", tensorrt=False)  # CUDA provider, new enough: allowed
