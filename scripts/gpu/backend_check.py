"""Stage 2 of the bare GPU check: the GPU backends' host logic over real device memory, every
graph computed by onnxruntime on the CPU behind a stand-in (scripts/gpu/standin_engine.py), so the
tokens must equal the CPU backend's exactly.

- TensorRT, the product path: a model directory with backend tensorrt, loaded by
  runtime.model.Model on --device cuda, one greedy Conversation.step per frame. That takes
  every graph through TrtGraph (device buffers, pinned IO, ping-pong state, DeviceRings,
  positions mirrored from state) and the LM through lm_frame.DeviceLinkedLM (the depformer
  reading Helium's device outputs, the pair captured as CUDA graphs and replayed per frame).
  Compared with the same directory on the CPU backend: every frame's text and audio tokens,
  the output audio; device memory before load and after close.
- onnxruntime CUDA: OrtCudaGraph (IO binding by raw device pointers, rings on the device) for
  the LM (greedy frames, benchmarks/lm_probe) and the codec, compared with OrtGraph on the CPU.
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
import time
from pathlib import Path

import numpy as np


def _copy_model(src: Path, dst: Path, backend: str) -> Path:
    """A copy of the model directory with `backend`; without its tokenizer where sentencepiece
    is missing (the bare machine may lack it, and a persona-less greedy run never reads it)."""
    from personaplex_edge.manifest import load_model_dir, write_manifest

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    manifest = dataclasses.replace(load_model_dir(dst), backend=backend)
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        manifest = dataclasses.replace(manifest, tokenizer=None)
    write_manifest(dst, manifest)
    return dst


def conversation_run(model_dir: Path, device: str, frames: int, seed: int = 0) -> dict:
    """Greedy conversation without a persona over `frames` frames of seeded noise -> tokens
    [frames, 9] (text, agent cb0..7 of the frame emitted at each step; -1 before the first),
    pcm [frames, 1920], the LM part's class and capture outcome, ms per step."""
    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.sampling import SamplingParams

    rng = np.random.default_rng(seed)
    model = Model.load(model_dir, device=device, threads=1)
    try:
        conv = model.open_conversation(SamplingParams(greedy=True), Persona(enabled=False))
        size = model.frame_size
        tokens = np.full((frames, 9), -1, np.int64)
        pcm = np.zeros((frames, size), np.float32)
        t0 = time.perf_counter()
        for t in range(frames):
            out, _ = conv.step((rng.standard_normal(size) * 0.1).astype(np.float32))
            pcm[t] = out
            if conv.last_frame is not None:
                tokens[t] = conv.last_frame
        ms = 1000 * (time.perf_counter() - t0) / frames
        lm = conv.group.lm
        info = {"lm": type(lm).__name__, "captured": getattr(lm, "sequence", None) is not None,
                "capture_error": getattr(lm, "capture_error", None)}
        conv.close()
    finally:
        model.close()
    return {"tokens": tokens, "pcm": pcm, "ms": ms, **info}


def _free_memory() -> int:
    from personaplex_edge.runtime.backends.cuda_runtime import call

    gc.collect()
    return int(call("cudaMemGetInfo")[0])


def check_tensorrt_path(model_src: Path, work: Path, host, frames: int = 60) -> dict:
    """The product path on the stand-in TensorRT (module docstring); raises AssertionError on a
    difference. `host`: standin_engine.host_functions()'s, or None (synchronous runs)."""
    from standin_engine import record_engines, tensorrt_installed

    cpu = conversation_run(_copy_model(model_src, work / "cpu", "onnx"), "cpu", frames)
    trt_dir = _copy_model(model_src, work / "trt", "onnx")
    record_engines(trt_dir)
    with tensorrt_installed(trt_dir, host):
        before = _free_memory()
        gpu = conversation_run(trt_dir, "cuda", frames)
        left = before - _free_memory()
    errors = getattr(host, "errors", [])
    if errors:
        raise AssertionError(f"the stand-in engine failed in a host function: {errors[0]}")
    if gpu["lm"] != "DeviceLinkedLM":
        raise AssertionError(f"the TensorRT model ran its LM through {gpu['lm']}, not the "
                             "device-linked frame")
    emitted = int((cpu["tokens"][:, 0] >= 0).sum())
    same = gpu["tokens"] == cpu["tokens"]
    if not same.all():
        t = int(np.argmin(same.all(axis=1)))
        raise AssertionError(f"tokens differ from onnxruntime CPU first at frame {t}: "
                             f"{gpu['tokens'][t].tolist()} vs {cpu['tokens'][t].tolist()}")
    pcm_err = float(np.abs(gpu["pcm"] - cpu["pcm"]).max())
    if pcm_err > 1e-5:
        raise AssertionError(f"output audio differs from onnxruntime CPU by {pcm_err:.2e}")
    captured = "captured as CUDA graphs" if gpu["captured"] else \
        f"NOT captured ({gpu['capture_error']})"
    return {"detail": f"{frames} frames ({emitted} emitted) through Model/Conversation.step on "
                      f"TrtGraph + DeviceLinkedLM {captured}: tokens equal onnxruntime CPU, "
                      f"audio within {pcm_err:.1e}; {left / 2**20:+.1f} MiB device memory "
                      f"left after close",
            "frames": frames, "captured": gpu["captured"], "capture_error": gpu["capture_error"],
            "pcm_max_error": pcm_err, "device_mib_left": left / 2**20, "ms_per_step": gpu["ms"]}


def check_ort_cuda(model_src: Path, frames: int = 60, codec_frames: int = 30) -> dict:
    """OrtCudaGraph over the stand-in CUDA sessions (module docstring)."""
    from lm_probe import agreement, open_lm
    from standin_engine import cuda_sessions

    from personaplex_edge.contract import MIMI_DECODER, MIMI_ENCODER
    from personaplex_edge.manifest import load_model_dir
    from personaplex_edge.runtime.backends.ort import OrtModelGraph
    from personaplex_edge.runtime.backends.ort_cuda import OrtCudaModelGraph
    from personaplex_edge.runtime.codec import Codec

    manifest = load_model_dir(model_src)
    user = np.random.default_rng(1).integers(0, manifest.config.audio_vocab_size, (frames, 8))
    cpu = open_lm(model_src, "ort-cpu", threads=1).run(user)
    with cuda_sessions():
        gpu = open_lm(model_src, "ort-cuda").run(user)
    a = agreement(gpu.tokens, cpu.tokens)
    if a["frames"] != 1.0:
        raise AssertionError(f"OrtCudaGraph tokens differ from onnxruntime CPU first at frame "
                             f"{a['first_difference']}")
    hidden_err = float(np.abs(gpu.hidden - cpu.hidden).max())
    if hidden_err > 1e-5:
        raise AssertionError(f"OrtCudaGraph hidden state differs by {hidden_err:.2e}")

    pcm = (np.random.default_rng(2).standard_normal(
        codec_frames * manifest.config.mimi_config.samples_per_frame) * 0.1).astype(np.float32)
    out = {}
    for kind, graph in (("cpu", lambda e: OrtModelGraph(model_src, e, threads=1)),
                        ("cuda", lambda e: OrtCudaModelGraph(model_src, e))):
        with cuda_sessions():
            codec = Codec(manifest, graph(manifest.graphs[MIMI_ENCODER]),
                          graph(manifest.graphs[MIMI_DECODER]))
            codes = codec.encode(pcm)
            out[kind] = (codes, codec.decode(codes))
            codec.close()
    if not np.array_equal(out["cuda"][0], out["cpu"][0]):
        raise AssertionError("OrtCudaGraph codec codes differ from onnxruntime CPU")
    pcm_err = float(np.abs(out["cuda"][1] - out["cpu"][1]).max())
    if pcm_err > 1e-5:
        raise AssertionError(f"OrtCudaGraph decoded audio differs by {pcm_err:.2e}")
    return {"detail": f"LM {frames} greedy frames and codec {codec_frames} frames through "
                      f"OrtCudaGraph: tokens and codes equal onnxruntime CPU (hidden within "
                      f"{hidden_err:.1e}, audio within {pcm_err:.1e})",
            "frames": frames, "codec_frames": codec_frames}
