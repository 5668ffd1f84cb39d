"""The prepared GPU check: exports a tiny and a mid-size random model, converts precisions,
builds TensorRT engines, compares greedy tokens with onnxruntime on the CPU, and prints per-stage
ms/frame for each backend and precision, then the full-size 7B bandwidth estimate.

    python scripts/gpu/gpu_check.py [--budget-s S] [--work DIR] [--frames 100] [--cpu-only]
                                    [--configs tiny,codec,mid,demo,7b] [--precisions P-B,...]
                                    [--library auto|tensorrt|rtx] [--skeleton DIR] [--simulate]
                                    [--json out.json]

Run through scripts/gpu_check.sh on a GPU machine (it installs what is needed first). Every
stage is fenced: a failure is printed with its reason and the check goes on; with --budget-s,
stages that would not fit in the time left are skipped and say so. --cpu-only runs the same
script with every GPU stage skipped (for checking the script itself on a machine without a GPU).
The TensorRT stages take mainline TensorRT or TensorRT for RTX (--library: what
scripts/gpu_check.sh installed for the card; auto, mainline where it imports).

Backends timed (each on the same precision's graphs; tokens compared with onnxruntime CPU;
benchmarks/lm_probe.open_lm):
    ort-cpu     onnxruntime CPU, all cores (OrtGraph)
    ort-cuda    onnxruntime CUDA provider, every buffer on the device, KV rings written on the
                device (runtime/backends/ort_cuda.OrtCudaGraph)
    trt         native TensorRT engines (mainline or TensorRT for RTX), each graph through the
                host (backends/trt.TrtGraph)
    trt-graph   the product path: helium + depformer chained on the device and replayed as CUDA
                graphs per frame (runtime/lm_frame.DeviceLinkedLM)

The tiny float32 TensorRT model is also started as downloaded, without engines: they are built
on first use into the per-user cache, keyed per graph, and one graph changed rebuilds its
engine alone (scripts/gpu/cache_check.py).

A GPU machine without a network (no TensorRT or onnxruntime-gpu to install) runs
scripts/gpu/gpu_bare_check.py instead; scripts/gpu_check.sh chooses. An offline machine with
torch but no onnxruntime-gpu gets it carried in pieces: scripts/gpu/ort_gpu_check.sh runs this
check's onnxruntime stages there (demo, 7b, mid, tiny), the 7B's fp16 graphs carried as a
skeleton (scripts/gpu/skeleton.py) and their weights made again on the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_stages import Budget, Stages, say, use_source_tree  # noqa: E402

use_source_tree()

TIMINGS: list[dict] = []
SIMULATED = False  # --simulate
STAGES = Stages(Budget())  # main() replaces it with the run's budget
LIBRARY = "auto"  # --library: which TensorRT builds and runs the engines


# ---- building -------------------------------------------------------------------------------------

def export_fp32(cfg, work: Path) -> Path:
    from bench_precision import build_fp32

    return build_fp32(cfg, work)


def export_codec(work: Path) -> Path:
    """The real-size Mimi codec alone (random weights), float32."""
    from personaplex_edge.config import PersonaPlexConfig
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint
    from personaplex_edge.manifest import load_model_dir, write_manifest

    out = work / "fp32-tensorrt"
    if not (out / "manifest.json").is_file():
        ckpt = write_synthetic_checkpoint(PersonaPlexConfig(), work / "checkpoint", with_lm=False)
        export_model(resolve_checkpoint(str(ckpt), with_lm=False), out, progress=lambda s: None)
        write_manifest(out, dataclasses.replace(load_model_dir(out), backend="tensorrt"))
    return out


def convert(fp32: Path, work: Path, precision: str, backend: str) -> Path:
    from personaplex_edge.export.precision import convert_model_dir

    out = work / f"{precision}-{backend}"
    if not (out / "manifest.json").is_file():
        if precision == "fp32":
            import shutil

            shutil.copytree(fp32, out)
            from personaplex_edge.manifest import load_model_dir, write_manifest

            write_manifest(out, dataclasses.replace(load_model_dir(out), backend=backend))
        else:
            from bench_precision import split

            helium, depformer = split(precision)  # "int4+int8": an int8 depformer
            convert_model_dir(fp32, out, helium, backend=backend, progress=lambda s: None,
                              depformer_precision=depformer)
    return out


def engines(model_dir: Path, graphs: list[str]) -> str:
    from personaplex_edge.runtime.backends.trt_build import build_engines, build_setup
    from personaplex_edge.manifest import load_model_dir, write_manifest

    manifest = load_model_dir(model_dir)
    setup = build_setup([manifest.graphs[g].precision for g in graphs], LIBRARY)
    manifest = build_engines(model_dir, manifest, graphs=graphs, setup=setup,
                             progress=lambda s: say("    " + s.strip()))
    write_manifest(model_dir, manifest)
    sizes = {g: (model_dir / (g + ".engine")).stat().st_size / 1e6 for g in graphs}
    onnx_mb = {g: sum((model_dir / f).stat().st_size for f in
                      (manifest.graphs[g].file, *manifest.graphs[g].data_files)) / 1e6
               for g in graphs}
    # an engine about as big as its graph's weights kept them in the stored precision
    return ", ".join(f"{g}.engine {sizes[g]:.0f} MB (onnx {onnx_mb[g]:.0f} MB)" for g in graphs)


# ---- running --------------------------------------------------------------------------------------

def _simulated_runs() -> dict[str, int]:
    """--simulate: the stand-in CUDA sessions' runs so far, eager and as CUDA graphs."""
    if not SIMULATED:
        return {}
    from standin_engine import RUNS

    return dict(RUNS)


def time_lm(label: str, model_dir: Path, backend: str, user: np.ndarray,
            reference: np.ndarray | None, warmup: int = 5, against: str = "ort-cpu",
            then=None) -> str:
    """Greedy frames of `user` codes on `backend`; `then(lm)`, if given, runs on the same
    open LM before it closes (a 7B's weights are loaded once)."""
    from lm_probe import agreement, open_lm

    runs = _simulated_runs()
    lm = open_lm(model_dir, backend)
    try:
        run = lm.run(user, forced=reference)
        done = then(lm) if then is not None else ""
    finally:
        lm.close()
    runs = {k: v - runs[k] for k, v in _simulated_runs().items()}
    tokens, total = run.tokens, run.temporal_ms + run.depformer_ms
    temporal, depformer = run.temporal_ms[warmup:].mean(), run.depformer_ms[warmup:].mean()
    if backend in ("trt-linked", "trt-graph"):  # one device sequence: no split to report
        temporal = depformer = None
    row = {"model": label, "backend": backend, "total_ms": float(np.mean(total[warmup:])),
           "p90_ms": float(np.percentile(total[warmup:], 90)),
           "temporal_ms": None if temporal is None else float(temporal),
           "depformer_ms": None if depformer is None else float(depformer)}
    if reference is not None:
        row["agreement"] = agreement(tokens, reference)
        row["against"] = against
    else:
        row["tokens"] = tokens
    if SIMULATED:  # how the stand-in sessions were run: eagerly, or as replays of a capture
        row["simulated_runs"] = runs
    TIMINGS.append(row)
    agree = ""
    if reference is not None:
        a = row["agreement"]
        agree = f", tokens vs {against}: text {a['text']:.1%} audio {a['audio']:.1%}"
    return f"{row['total_ms']:.2f} ms/frame (p90 {row['p90_ms']:.2f}){agree}{done}"


def time_codec(label: str, model_dir: Path, backend: str, frames: int = 60) -> str:
    """Mimi encode + decode per frame (random audio), on `backend` (ort-cpu, ort-cuda, trt)."""
    from personaplex_edge.manifest import load_model_dir

    manifest = load_model_dir(model_dir)
    graphs = {}
    for name in ("mimi_encoder", "mimi_decoder"):
        if backend == "ort-cpu":
            from personaplex_edge.runtime.backends.ort import OrtModelGraph

            graphs[name] = OrtModelGraph(model_dir, manifest.graphs[name]).bind()
        elif backend == "ort-cuda":
            from personaplex_edge.runtime.backends.ort_cuda import OrtCudaModelGraph

            graphs[name] = OrtCudaModelGraph(model_dir, manifest.graphs[name]).bind()
        else:
            from personaplex_edge.runtime.backends.trt import TrtEngine

            graphs[name] = TrtEngine(model_dir, manifest, manifest.graphs[name]).bind()
    enc, dec = graphs["mimi_encoder"], graphs["mimi_decoder"]
    rng = np.random.default_rng(0)
    e_ms, d_ms, codes = [], [], []
    for _ in range(frames):
        enc.inputs["pcm"][...] = rng.standard_normal(enc.inputs["pcm"].shape) * 0.1
        t0 = time.perf_counter()
        c = enc.run()["codes"].copy()
        t1 = time.perf_counter()
        dec.inputs["codes"][...] = c
        dec.run()
        t2 = time.perf_counter()
        e_ms.append(1000 * (t1 - t0))
        d_ms.append(1000 * (t2 - t1))
        codes.append(c)
    row = {"model": label, "backend": backend, "encode_ms": float(np.mean(e_ms[5:])),
           "decode_ms": float(np.mean(d_ms[5:])), "codes": np.array(codes)}
    ref = next((t["codes"] for t in TIMINGS if t.get("model") == label
                and t.get("backend") == "ort-cpu" and "codes" in t), None)
    if ref is not None and backend != "ort-cpu":
        row["codes_equal"] = float((row["codes"] == ref).mean())
    TIMINGS.append(row)
    same = f", codes equal to ort-cpu: {row['codes_equal']:.1%}" if "codes_equal" in row else ""
    return f"encode {row['encode_ms']:.2f} ms, decode {row['decode_ms']:.2f} ms per frame{same}"


def time_prefill(label: str, backend: str, lm, frames: int) -> str:
    """A persona's prefill on an open GreedyLM as a backend without a frames axis runs it
    (OrtCudaGraph; the reference too): Helium alone, `frames` forced steps at positions 0..,
    nothing sampled (runtime/lockstep.Lockstep.prefill_call, frame by frame)."""
    helium, cfg = lm.helium, lm.cfg
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, cfg.audio_vocab_size, (frames, helium.inputs["tokens"].shape[-1]))
    tokens[:, 0] = rng.integers(0, cfg.text_vocab_size, frames)
    helium.run()  # the first call's setup is not the prefill's
    t0 = time.perf_counter()
    for t in range(frames):
        helium.inputs["tokens"][...] = tokens[t]
        helium.inputs["position"][...] = t
        helium.run()  # the hidden state comes back to the host: the step has finished
    seconds = time.perf_counter() - t0
    TIMINGS.append({"model": label, "backend": backend, "prefill_frames": frames,
                    "prefill_s": seconds, "prefill_ms_per_frame": 1000 * seconds / frames})
    return (f"; prefill: {frames} frames in {seconds:.2f} s ({1000 * seconds / frames:.2f} ms "
            "a frame, Helium alone, frame by frame)")


def api_conversation(model_dir: Path, device: str, pcm: np.ndarray) -> dict:
    """One greedy conversation with the default persona through the public API (Mimi, the LM
    and the persona on `device`): its prefill, ms per frame and answer."""
    import personaplex_edge as pe

    model = pe.load(model_dir, device=device, persona_cache_mb=0)
    try:
        with model.conversation(greedy=True) as conv:
            t0 = time.perf_counter()
            answer = conv.respond(pcm)
            seconds = time.perf_counter() - t0
            prefill = conv.core.prefill_seconds
        return {"runs_on": model.runs_on, "prefill_s": prefill,
                "ms_per_frame": 1000 * seconds / len(answer.records), "answer": answer}
    finally:
        model.close()


def demo_stages(frames: int) -> None:
    """The built-in demo through `pe.load(device=...)`: the product's own path on the GPU
    (the codec, the persona, the LM on onnxruntime's CUDA provider), its words and audio
    against the same conversation on the CPU."""
    from personaplex_edge.audio import read_audio
    from personaplex_edge.model_ref import resolve_model

    model = STAGES.run("demo: the built-in model", lambda: resolve_model("demo", say),
                       need_s=30)
    if model is None:
        return
    hello = Path(__file__).resolve().parents[2] / "personaplex_edge" / "data" / "hello.wav"
    pcm = np.resize(read_audio(hello), frames * 1920)  # the sample repeated to `frames`
    runs: dict[str, dict] = {}

    def one(device: str) -> str:
        runs[device] = r = api_conversation(model, device, pcm)
        runs_on = ", ".join(r["runs_on"])  # Model.runs_on: one entry per engine in use
        row = {"model": "demo (API)", "backend": runs_on, "prefill_s": r["prefill_s"],
               "api_ms_per_frame": r["ms_per_frame"]}
        line = (f"{runs_on}: persona prefill {r['prefill_s']:.2f} s, "
                f"{r['ms_per_frame']:.2f} ms a frame over {frames} frames")
        if device == "cuda" and "cpu" in runs:
            cpu, gpu = runs["cpu"]["answer"], r["answer"]
            same = [a == b for a, b in zip(cpu.records, gpu.records)]
            noise = float(np.mean((cpu.pcm - gpu.pcm) ** 2))
            snr = 10 * np.log10(float(np.mean(cpu.pcm ** 2)) / noise) if noise else float("inf")
            row.update(records_equal=float(np.mean(same)), snr_db=snr,
                       first_difference=next((i for i, s in enumerate(same) if not s), None))
            line += (f"; against the CPU: text records equal {row['records_equal']:.1%} "
                     f"(first difference {row['first_difference']}), audio SNR {snr:.1f} dB")
        TIMINGS.append(row)
        return line

    STAGES.run("demo: conversation on the CPU", lambda: one("cpu"), need_s=30)
    if SIMULATED:
        STAGES.skip("demo: conversation on the GPU (onnxruntime CUDA)", "--simulate: the "
                    "codec's sessions on CUDA hold device OrtValues the stand-in does not make")
        return
    STAGES.run("demo: conversation on the GPU (onnxruntime CUDA)", lambda: one("cuda"),
               need_s=30, gpu=True)


def full_size_stages(skeleton: Path, work: Path, frames: int) -> None:
    """The 7B's fp16 graphs (the GPU recipe) from a skeleton carried here, their weights made
    again (scripts/gpu/skeleton.py): ms per frame through OrtCudaGraph, eager and replayed as
    CUDA graphs, and the default persona's prefill."""
    import skeleton as skel

    if not (skeleton / skel.RECORD).is_file():
        STAGES.skip("7b: fp16 ort-cuda", f"no skeleton at {skeleton}: make one here with "
                    "`python scripts/gpu/skeleton.py make FP16_MODEL_DIR build/carry/7b-skeleton` "
                    "and carry it")
        return
    model = work / "fp16"
    made = STAGES.run("7b: the weights made again from the skeleton",
                      lambda: skel.fill(skeleton, model), need_s=120)
    if made is None:
        return
    from frame_bytes import model_bytes_per_frame
    from personaplex_edge.config import PersonaPlexConfig
    from personaplex_edge.manifest import load_model_dir

    manifest = load_model_dir(model)
    width = manifest.config.temporal_config.hidden_size
    size = "7b" if width == PersonaPlexConfig().temporal_config.hidden_size else "skeleton"
    label = f"{size} {manifest.precision}-{manifest.backend}"
    per_frame = sum(model_bytes_per_frame(model, manifest).values())
    user = np.random.default_rng(0).integers(0, manifest.config.audio_vocab_size,
                                             (frames + 5, 8)).astype(np.int64)
    # the default persona's 82 frames, on the same loaded weights
    prefill = (lambda lm: time_prefill(label, "ort-cuda", lm, 82))
    if STAGES.run(f"{label}: ort-cuda, then the persona's prefill",
                  lambda: time_lm(label, model, "ort-cuda", user, None, then=prefill),
                  need_s=120, gpu=True) is None:
        return
    eager = next(t for t in reversed(TIMINGS) if t.get("model") == label and "tokens" in t)
    say(f"    {per_frame / 1e9:.2f} GB a frame: {per_frame / eager['total_ms'] / 1e6:.0f} GB/s")
    STAGES.run(f"{label}: ort-cuda-graph",
               lambda: time_lm(label, model, "ort-cuda-graph", user, eager["tokens"],
                               against="ort-cuda"),
               need_s=90, gpu=True)


# ---- report ---------------------------------------------------------------------------------------

def environment(cpu_only: bool) -> str:
    import onnxruntime as ort

    parts = [f"python {sys.version.split()[0]}", f"onnxruntime {ort.__version__} "
             f"({', '.join(ort.get_available_providers())})"]
    from personaplex_edge.runtime.backends.trt_library import CHOICES, load_library

    try:
        parts.append(load_library(CHOICES[LIBRARY]).title)
    except Exception as e:  # noqa: BLE001 - TensorRTMissing, or a wheel that does not load
        parts.append(f"TensorRT: not usable ({type(e).__name__}: {e})")
    if not cpu_only:
        from personaplex_edge.runtime.backends.cuda_runtime import device_info

        info = device_info(0)
        parts.append(f"GPU {info.name}, compute capability {info.compute_capability}, "
                     f"{info.total_memory / 2**30:.0f} GiB, driver CUDA {info.driver_version}")
    return "; ".join(parts)


def _table(title: str, head: list[str], rows: list[list[str]]) -> None:
    """A markdown table under `title` (nothing where there are no rows); the first two columns
    are names, the rest figures."""
    if not rows:
        return
    say(f"\n## {title}\n")
    say("| " + " | ".join(head) + " |")
    say("| --- | --- |" + " ---: |" * (len(head) - 2))
    for row in rows:
        say("| " + " | ".join(row) + " |")


def report(bytes_mid: dict[str, int]) -> None:
    from bench_precision import split

    from personaplex_edge.config import PersonaPlexConfig
    from frame_bytes import (DEVICES, estimate_bytes_per_frame,
                                                     floor_ms, layout_for)
    from personaplex_edge.export.precision import plan_for

    STAGES.summary()
    say("\n## LM per frame (greedy, tokens compared with onnxruntime CPU on the same graphs, "
        "or where a row says so another backend)\n")
    say("| model | backend | temporal ms | depformer ms | total ms | p90 ms | text agree | "
        "audio agree |")
    say("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in TIMINGS:
        if "total_ms" not in t:
            continue
        a = t.get("agreement")
        fmt = (lambda v: "" if v is None else f"{v:.2f}")
        say(f"| {t['model']} | {t['backend']} | {fmt(t['temporal_ms'])} | "
            f"{fmt(t['depformer_ms'])} | {t['total_ms']:.2f} | {t['p90_ms']:.2f} | "
            + (f"{a['text']:.1%} | {a['audio']:.1%} |" if a else "(reference) | |")
            + (f" (vs {t['against']})" if a and t.get("against") != "ort-cpu" else ""))
    _table("Persona prefill, and the demo through the public API",
           ["model", "backend", "prefill s", "ms a frame", "against the CPU"],
           [[t["model"], t["backend"], f"{t['prefill_s']:.2f}",
             f"{t.get('prefill_ms_per_frame', t.get('api_ms_per_frame')):.2f}",
             f"text records {t['records_equal']:.1%}, audio {t['snr_db']:.1f} dB"
             if "records_equal" in t else ""]
            for t in TIMINGS if "prefill_s" in t])
    _table("Codec per frame (float32)",
           ["model", "backend", "encode ms", "decode ms", "codes equal to ort-cpu"],
           [[t["model"], t["backend"], f"{t['encode_ms']:.2f}", f"{t['decode_ms']:.2f}",
             f"{t['codes_equal']:.1%}" if "codes_equal" in t else "(reference)"]
            for t in TIMINGS if "encode_ms" in t])
    say("\n## Full 7B: bytes per frame and bandwidth floor (estimate, not measured)\n")
    cfg = PersonaPlexConfig()
    say("| precision | GB/frame | " + " | ".join(f"{d} ms" for d in DEVICES) + " |")
    say("| --- | ---: |" + " ---: |" * len(DEVICES))
    for label, plan, *depformer in (("fp16", plan_for("fp16", "tensorrt")),
                        ("bf16", plan_for("bf16", "tensorrt")),
                        ("int8 (TensorRT)", plan_for("int8", "tensorrt")),
                        ("int4 (TensorRT)", plan_for("int4", "tensorrt")),
                        ("int4 + int8 depformer (TensorRT)", plan_for("int4", "tensorrt"),
                         plan_for("int8", "tensorrt")),
                        ("int4 (onnxruntime), KV fp16", plan_for("int4", kv_dtype="float16"))):
        b = estimate_bytes_per_frame(cfg, layout_for(plan),
                                     layout_for(depformer[0]) if depformer else None)["total"]
        say(f"| {label} | {b / 1e9:.2f} | "
            + " | ".join(f"{floor_ms(b, bw):.1f}" for bw in DEVICES.values()) + " |")
    # projection from the measured mid model: achieved bandwidth carried over to the 7B bytes
    for t in TIMINGS:
        key = t["model"]
        if "total_ms" in t and key in bytes_mid and t["backend"].startswith("trt"):
            helium, depformer = split(key.split(" ")[-1].split("-")[0])
            try:
                plan = plan_for(helium, "tensorrt")
                dep = plan_for(depformer, "tensorrt") if depformer else None
            except Exception:  # noqa: BLE001
                continue
            gbps = bytes_mid[key] / (t["total_ms"] / 1000) / 1e9
            full = estimate_bytes_per_frame(cfg, layout_for(plan),
                                            layout_for(dep) if dep else None)["total"]
            say(f"- {key} on {t['backend']}: {bytes_mid[key] / 1e6:.0f} MB/frame in "
                f"{t['total_ms']:.2f} ms = {gbps:.0f} GB/s; at that rate the 7B "
                f"({full / 1e9:.1f} GB/frame) would take {full / (gbps * 1e9) * 1000:.1f} ms "
                "(target: <= 10 ms/frame on an H200 in fp16)")


# ---- stages of one model --------------------------------------------------------------------------

def lm_stages(label, model, precision, backend, engine_graphs, user, have_trt, bytes_mid,
              big: bool) -> None:
    from frame_bytes import model_bytes_per_frame
    from personaplex_edge.manifest import load_model_dir

    manifest = load_model_dir(model)
    bytes_mid[label] = sum(model_bytes_per_frame(model, manifest).values())
    ref = None
    if precision != "bf16":  # onnxruntime's CPU has no bf16 MatMul
        if STAGES.run(f"{label}: ort-cpu", lambda: time_lm(label, model, "ort-cpu", user, None),
                      need_s=20) is not None:
            ref = next(t["tokens"] for t in reversed(TIMINGS)
                       if t.get("model") == label and "tokens" in t)
        if backend == "onnx" or precision in ("fp32", "fp16"):
            STAGES.run(f"{label}: ort-cuda", lambda: time_lm(label, model, "ort-cuda", user, ref),
                       20, gpu=True)
    if backend != "tensorrt":
        return
    if not have_trt:
        STAGES.skip(f"{label}: TensorRT", "tensorrt is not installed")
        return
    graphs = engine_graphs or list(manifest.graphs)
    built = STAGES.run(f"{label}: build TensorRT engines ({', '.join(graphs)})",
                       lambda: engines(model, graphs), need_s=90 if big else 30, gpu=True)
    if built is None:
        return
    for trt_backend in ("trt", "trt-graph"):
        STAGES.run(f"{label}: {trt_backend}",
                   lambda: time_lm(label, model, trt_backend, user, ref), 20, gpu=True)


def codec_stages(root: Path, have_trt: bool) -> None:
    """The real-size Mimi codec (float32) on each backend, codes compared with ort-cpu."""
    model = STAGES.run("codec: export real-size Mimi (random weights)",
                       lambda: export_codec(root), need_s=60)
    if model is None:
        return
    STAGES.run("codec: ort-cpu", lambda: time_codec("Mimi fp32", model, "ort-cpu"), 30)
    STAGES.run("codec: ort-cuda", lambda: time_codec("Mimi fp32", model, "ort-cuda"), 20,
               gpu=True)
    if not have_trt:
        return
    graphs = ["mimi_encoder", "mimi_decoder"]
    if STAGES.run("codec: build TensorRT engines", lambda: engines(model, graphs), 60,
                  gpu=True) is not None:
        STAGES.run("codec: trt", lambda: time_codec("Mimi fp32", model, "trt"), 20, gpu=True)


# ---- main -----------------------------------------------------------------------------------------

def main() -> None:
    global STAGES
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip the stages that would not finish within S seconds (default: "
                         "no limit)")
    ap.add_argument("--library", default="auto", choices=["auto", "tensorrt", "rtx"],
                    help="the TensorRT of the TensorRT stages (auto: mainline where it "
                         "imports, else TensorRT for RTX)")
    ap.add_argument("--work", default="/tmp/personaplex_gpu_check")
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--configs", default="tiny,codec,mid,webgpu",
                    help="tiny and mid: the LM (random weights) in each precision; codec: the "
                    "real-size Mimi; demo: the built-in demo through the public API on the "
                    "GPU and the CPU; 7b: the 7B's fp16 graphs from --skeleton; webgpu: the "
                    "tiny and mid LM and the demo on the card through WebGPU "
                    "(scripts/gpu/webgpu_check.py)")
    ap.add_argument("--skeleton", default=str(Path(__file__).resolve().parents[2] / "build"
                                              / "carry" / "7b-skeleton"),
                    help="the 7B's fp16 skeleton (scripts/gpu/skeleton.py make)")
    ap.add_argument("--precisions", default="",
                    help="only these of tiny's and mid's models, as PRECISION-BACKEND "
                    "(e.g. fp16-tensorrt,int4-onnx); default: every one")
    ap.add_argument("--cpu-only", action="store_true")
    ap.add_argument("--simulate", action="store_true",
                    help="the onnxruntime CUDA stages on tests/fake_gpu's simulated device, "
                    "onnxruntime's CPU computing behind the CUDA sessions: checks this script "
                    "here, says nothing of a GPU (TensorRT and the public API's GPU path skip)")
    ap.add_argument("--json")
    args = ap.parse_args()
    STAGES = Stages(Budget(args.budget_s), cpu_only=args.cpu_only)
    global SIMULATED, LIBRARY
    SIMULATED, LIBRARY = args.simulate, args.library
    if SIMULATED:
        import contextlib

        from check_stages import simulated_cuda
        from standin_engine import cuda_sessions

        simulated_cuda()
        stack = contextlib.ExitStack()  # held for the whole run
        stack.enter_context(cuda_sessions(threads=2))
    work = Path(args.work)
    from bench_precision import config

    say(f"# PersonaPlex-edge GPU check ({time.strftime('%Y-%m-%d %H:%M')})"
        + (" - SIMULATED: no GPU" if SIMULATED else ""))
    STAGES.run("environment", lambda: environment(STAGES.cpu_only or SIMULATED))
    if not STAGES.cpu_only and not SIMULATED:
        import onnxruntime as ort

        from personaplex_edge.runtime.backends.cuda_runtime import gpu_available

        if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from their pip wheels (onnxruntime-gpu)
            try:
                ort.preload_dlls()
            except Exception as e:  # noqa: BLE001
                say(f"onnxruntime.preload_dlls failed: {e}")

        ok, why = gpu_available()
        if not ok:
            say(f"no usable GPU ({why}): GPU stages are skipped")
            STAGES.cpu_only = True
    try:
        if SIMULATED:
            raise ImportError("--simulate")
        from personaplex_edge.runtime.backends.trt_library import CHOICES, load_library

        say(f"TensorRT stages: {load_library(CHOICES[LIBRARY]).title}")
        have_trt = True
    except Exception as e:  # noqa: BLE001 - TensorRTMissing, or OSError from its libraries
        say(f"no TensorRT ({type(e).__name__}: {e}): TensorRT stages are skipped")
        have_trt = False
    bytes_mid: dict[str, int] = {}
    frames = {"tiny": 60, "mid": args.frames}
    lm, everything = ["helium_step", "depformer_step"], None
    # per config: (precision, backend, graphs to build engines for), most important first
    plans = {"tiny": [("fp32", "tensorrt", everything), ("fp16", "tensorrt", everything),
                      ("int4", "onnx", None), ("int4", "tensorrt", lm)],
             "mid": [("fp16", "tensorrt", lm), ("int4", "tensorrt", lm),
                     ("int4+int8", "tensorrt", lm), ("int4", "onnx", None),
                     ("fp32", "tensorrt", lm), ("bf16", "tensorrt", lm), ("int8", "tensorrt", lm),
                     ("fp8", "tensorrt", lm)]}
    for name in [c for c in args.configs.split(",") if c]:
        root = work / name
        root.mkdir(parents=True, exist_ok=True)
        if name == "codec":
            codec_stages(root, have_trt)
            continue
        if name == "demo":
            demo_stages(60)
            continue
        if name == "7b":
            full_size_stages(Path(args.skeleton), root, 20)
            continue
        if name == "webgpu":
            from webgpu_check import webgpu_stages

            built = {c: STAGES.run(f"webgpu: {c} float32 (random weights)",
                                   lambda c=c: export_fp32(config(c), work / c), need_s=60)
                     for c in ("tiny", "mid")}
            webgpu_stages(STAGES, root, {c: d for c, d in built.items() if d is not None},
                          frames, TIMINGS)
            continue
        cfg = config(name)
        fp32 = STAGES.run(f"{name}: export float32 (random weights)",
                          lambda: export_fp32(cfg, root), need_s=60)
        if fp32 is None:
            continue
        user = np.random.default_rng(0).integers(0, cfg.audio_vocab_size,
                                                 (frames[name] + 5, 8)).astype(np.int64)
        chosen = {p for p in args.precisions.split(",") if p}
        for precision, backend, engine_graphs in plans[name]:
            if chosen and f"{precision}-{backend}" not in chosen:
                continue
            label = f"{name} {precision}-{backend}"
            model = STAGES.run(f"{label}: convert",
                               lambda: convert(fp32, root, precision, backend),
                               need_s=30 if name == "tiny" else 120)
            if model is None:
                continue
            lm_stages(label, model, precision, backend, engine_graphs, user, have_trt,
                      bytes_mid, big=name != "tiny")
        if name == "tiny":
            model = root / "fp32-tensorrt"
            if (model / "manifest.json").is_file():
                for b in ("ort-cpu", "ort-cuda", "trt"):
                    if b == "trt" and not have_trt:
                        STAGES.skip(f"tiny codec: {b}", "tensorrt is not installed")
                        continue
                    STAGES.run(f"tiny codec: {b}", lambda: time_codec("tiny fp32", model, b),
                               15, gpu=b != "ort-cpu")
                ref = next((t["tokens"] for t in TIMINGS if t.get("model") ==
                            "tiny fp32-tensorrt" and "tokens" in t), None)
                if have_trt and ref is not None:
                    from cache_check import first_use

                    STAGES.run("tiny fp32: engines on first use (the per-user cache, keyed per "
                               "graph)", lambda: first_use(model, root, user, ref), 30, gpu=True)
    report(bytes_mid)
    if args.json or os.environ.get("OUT"):
        path = Path(args.json or Path(os.environ["OUT"]) / "gpu_check.json")
        clean = [{k: v for k, v in t.items() if k not in ("tokens", "codes")} for t in TIMINGS]
        path.write_text(json.dumps({"stages": STAGES.results, "timings": clean}, indent=2))
        say(f"\nwrote {path}")


if __name__ == "__main__":
    main()
