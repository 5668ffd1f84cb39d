"""The GPU check's WebGPU stages (scripts/gpu/gpu_check.py --configs ...,webgpu): the same card
through onnxruntime's WebGPU provider (Vulkan on Linux) instead of CUDA, for what the tests can
only run on a software adapter.

    adapter            which adapter the provider offers (the load's own line), shader-f16
    tiny/mid <p>       the LM greedy over fixed user codes on WebGPU against onnxruntime CPU:
                       tokens agreeing, ms per frame per stage (temporal, depformer), uncaptured
                       and with PERSONAPLEX_WEBGPU_CAPTURE=1; p: fp32, int4 with float32 compute,
                       int4 in float16 where the adapter has shader-f16
    demo               the built-in demo through `pe.load(device="webgpu")`: the product's own
                       path, its words against the CPU's

Each stage is fenced by check_stages.Stages: a missing plugin, Vulkan loader or adapter skips
with its reason; the rest go on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from check_stages import Skip, Stages, say

PLANS = (("fp32", None), ("int4", "float32"), ("int4", "float16"))


def adapter_stage():
    from personaplex_edge.runtime.backends.webgpu_adapter import WebGpuUnavailable, find_adapter

    try:
        adapter = find_adapter(hardware_only=True)
    except WebGpuUnavailable as e:
        raise Skip(str(e)) from None
    return {"detail": adapter.describe(), "shader_f16": adapter.shader_f16}


def _model(fp32: Path, work: Path, precision: str, compute: str | None) -> Path:
    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.export.precision_plan import lm_plans

    if precision == "fp32":
        return fp32
    out = work / f"webgpu-{precision}-{compute}"
    if not (out / "manifest.json").is_file():
        convert_model_dir(fp32, out, precision, progress=lambda s: None,
                          plans=lm_plans(precision, "onnx", compute=compute))
    return out


def _greedy(model: Path, device: str, user: np.ndarray, capture: bool = False) -> dict:
    from lm_probe import GreedyLM

    from personaplex_edge.runtime.backends.ort_webgpu import CAPTURE_SWITCH

    os.environ[CAPTURE_SWITCH] = "1" if capture else "0"
    lm = GreedyLM(model, device=device)
    try:
        run = lm.run(user)
    finally:
        lm.close()
        os.environ.pop(CAPTURE_SWITCH, None)
    skip = min(5, len(user) - 1)  # the first frames compile shaders
    return {"tokens": run.tokens, "temporal_ms": float(np.median(run.temporal_ms[skip:])),
            "depformer_ms": float(np.median(run.depformer_ms[skip:]))}


def lm_stages(stages: Stages, label: str, fp32: Path, work: Path, user: np.ndarray,
              shader_f16: bool, timings: list[dict]) -> None:
    for precision, compute in PLANS:
        name = f"{label} webgpu {precision}" + (f" ({compute} compute)" if compute else "")
        if compute == "float16" and not shader_f16:
            stages.skip(name, "the adapter has no shader-f16")
            continue
        model = stages.run(f"{name}: convert", lambda: _model(fp32, work, precision, compute),
                           need_s=30)
        if model is None:
            continue
        cpu: dict = {}

        def reference():
            cpu.update(_greedy(model, "cpu", user))
            return f"temporal {cpu['temporal_ms']:.2f} ms, depformer {cpu['depformer_ms']:.2f} ms"

        stages.run(f"{name}: ort-cpu", reference, need_s=20)
        for capture in (False, True):
            def one(capture=capture):
                r = _greedy(model, "webgpu", user, capture)
                same = (r["tokens"] == cpu["tokens"]).all(axis=1) if cpu else None
                row = {"model": name,
                       "backend": "webgpu" + (", capture asked" if capture else ""),
                       "temporal_ms": r["temporal_ms"], "depformer_ms": r["depformer_ms"],
                       "frames_equal_cpu": None if same is None else float(same.mean())}
                timings.append(row)
                return {"detail": f"temporal {r['temporal_ms']:.2f} ms, depformer "
                                  f"{r['depformer_ms']:.2f} ms a frame"
                                  + ("" if same is None else
                                     f"; {100 * same.mean():.0f}% of frames equal the CPU's"),
                        **{k: v for k, v in row.items() if k != "model"}}
            stages.run(f"{name}: webgpu" + (" (capture asked)" if capture else ""), one, 30)


def demo_stage(stages: Stages, frames: int, timings: list[dict]) -> None:
    """The demo on WebGPU and the CPU through the public API: the same greedy words."""
    def one():
        from personaplex_edge.audio import read_audio
        from personaplex_edge.runtime.api import load

        hello = Path(__file__).resolve().parents[2] / "personaplex_edge" / "data" / "hello.wav"
        pcm = np.resize(read_audio(hello), frames * 1920)
        out = {}
        for device in ("cpu", "webgpu"):
            model = load("demo", device=device)
            try:
                with model.conversation(greedy=True) as conv:
                    t0 = time.perf_counter()
                    out[device] = [text for _, text in conv.stream(pcm)]
                    ms = 1000 * (time.perf_counter() - t0) / frames
            finally:
                model.close()
            timings.append({"model": "demo (API)", "backend": device, "api_ms_per_frame": ms})
        same = np.mean([a == b for a, b in zip(out["cpu"], out["webgpu"])])
        return f"{100 * same:.0f}% of {frames} frames' words equal the CPU's; {ms:.1f} ms a frame"
    stages.run("demo: the API on webgpu", one, need_s=60)


def webgpu_stages(stages: Stages, work: Path, configs: dict, frames: dict,
                  timings: list[dict]) -> None:
    """Every stage above; `configs`: {name: its float32 model directory}."""
    found = stages.run("webgpu: adapter", adapter_stage, need_s=5)
    if found is None:
        return
    for name, fp32 in configs.items():
        user = np.random.default_rng(0).integers(0, 2048, (frames[name], 8)).astype(np.int64)
        lm_stages(stages, name, fp32, work / name, user, found["shader_f16"], timings)
    demo_stage(stages, 60, timings)
    say("webgpu stages done")
