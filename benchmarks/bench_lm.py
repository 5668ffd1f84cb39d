"""The LM per frame: this project's Helium + depformer graphs in onnxruntime vs moshi's LMGen step,
on the same weights (random, stored bf16, run in float32), on N threads, greedy.

    python benchmarks/bench_lm.py [--frames 100] [--threads 2] [--work DIR] [--json out.json]

Default model: a mid config that is memory-bandwidth bound on a CPU: Helium d 1024, 8 layers,
16 heads, MLP 2816, the real context (3000), and the real depformer (1024, 6 layers, 8 active
steps). Prints ms/frame per stage (temporal, depformer) for both, the speed-up, and the fraction
of the memory-bandwidth floor reached: bytes of weights and KV read per frame divided by the
machine's copy bandwidth (numpy, counted as read + write, like STREAM's copy).

Ours runs the way the runtime should: every graph input and output is bound once with IO binding
to numpy buffers (the KV ring included), and the step's new K/V rows are written into the ring in
place, so nothing the size of the cache is copied per frame. Both sides are greedy, so their
tokens must agree; the script checks that too. Built files are kept in --work for reruns.
Needs the dev extra and moshi (see .ci/run).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
os.environ.setdefault("NO_TORCH_COMPILE", "1")


def stats(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"mean": float(a.mean()), "p50": float(np.median(a)),
            "p90": float(np.percentile(a, 90))}


def copy_bandwidth(threads: int, mbytes: int = 512, repeats: int = 5) -> float:
    """Bytes/s moved by parallel numpy copies (read + write counted)."""
    n = mbytes * (1 << 20) // 4
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)
    chunks = np.array_split(np.arange(n), threads)
    bounds = [(int(c[0]), int(c[-1]) + 1) for c in chunks]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(lambda b: np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]]), bounds))
            best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def build(cfg, work: Path, log) -> Path:
    """Checkpoint (from the seeded reference) and graphs, unless already in `work`."""
    from personaplex_edge.export.lm import export_lm_graphs

    ckpt = work / "model.safetensors"
    if not ckpt.is_file():
        from moshi_lm_reference import reference_lm, save_published_lm

        t0 = time.perf_counter()
        save_published_lm(reference_lm(cfg, seed=0), work / "model.partial.safetensors")
        os.replace(work / "model.partial.safetensors", ckpt)
        log(f"reference checkpoint written ({time.perf_counter() - t0:.0f} s)")
        gc.collect()
    graphs = work / "graphs"
    if not (graphs / "done").is_file():
        t0 = time.perf_counter()
        export_lm_graphs(cfg, ckpt, graphs, verify=True)
        (graphs / "done").write_text("ok")
        log(f"graphs exported and checked in onnxruntime ({time.perf_counter() - t0:.0f} s)")
        gc.collect()
    return ckpt


def load_reference(cfg, ckpt: Path):
    """moshi's LMModel holding the checkpoint's weights (built without random init)."""
    import torch
    from moshi.models.lm import LMModel
    from moshi_lm_reference import moshi_lm_kwargs
    from safetensors.torch import load_file

    with torch.device("meta"):
        model = LMModel(**moshi_lm_kwargs(cfg), dtype=torch.float32)
    state = {k: v.float() for k, v in load_file(str(ckpt)).items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def share_one_thread_pool(threads: int) -> bool:
    """Makes every later onnxruntime session use one process-wide pool of `threads` threads.
    With a pool per session, the idle session's threads keep spinning while the other runs and
    take its cores (on 2 cores: temporal 70 instead of 36 ms, depformer 150 instead of 97).
    Must run before the first session is created; False where this build lacks the call."""
    try:
        from onnxruntime.capi import _pybind_state
        _pybind_state.set_global_thread_pool_sizes(threads, 1)
        return True
    except (ImportError, AttributeError, RuntimeError):
        return False


class OrtLM:
    """helium_step + depformer_step with every input and output bound to a numpy buffer."""

    def __init__(self, cfg, graphs: Path, threads: int, shared_pool: bool, k_max: int = 250):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if shared_pool:
            opts.use_per_session_threads = False
        else:  # own pools: at least keep the idle one from spinning
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        prov = ["CPUExecutionProvider"]
        self.helium = ort.InferenceSession(str(graphs / "helium_step.onnx"), opts, providers=prov)
        self.depformer = ort.InferenceSession(str(graphs / "depformer_step.onnx"), opts,
                                              providers=prov)
        h = cfg.temporal_config
        self.T = h.max_position_embeddings
        self.layers = h.num_hidden_layers
        kv = (1, h.num_attention_heads, self.T, h.head_dim)
        row = (1, h.num_attention_heads, 1, h.head_dim)
        f32, i64 = np.float32, np.int64
        self.buf = {"tokens": np.zeros((1, 17), i64),
                    "extra_embedding": np.zeros((1, h.hidden_size), f32),
                    "position": np.zeros(1, i64), "text_noise": np.zeros((1, k_max), f32),
                    "text_temperature": np.full(1, 0.7, f32), "text_top_k": np.full(1, 25, i64),
                    "text_token": np.zeros(1, i64), "hidden": np.zeros((1, h.hidden_size), f32),
                    "audio_noise": np.zeros((1, 8, k_max), f32),
                    "audio_temperature": np.full(1, 0.8, f32),
                    "audio_top_k": np.full(1, 250, i64), "audio_tokens": np.zeros((1, 8), i64)}
        for i in range(self.layers):
            for kind in ("key", "value"):
                self.buf[f"past_key_values.{i}.{kind}"] = np.zeros(kv, f32)
                self.buf[f"present.{i}.{kind}"] = np.zeros(row, f32)
        self.ring_bytes = sum(v.nbytes for k, v in self.buf.items() if k.startswith("past_"))
        self.io_helium = self._bind(self.helium)
        self.io_depformer = self._bind(self.depformer)

    def _bind(self, sess):
        io = sess.io_binding()
        for node, bind in ((sess.get_inputs(), io.bind_input), (sess.get_outputs(),
                                                                 io.bind_output)):
            for n in node:
                a = self.buf[n.name]
                bind(n.name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
        return io

    def temporal(self, tokens: np.ndarray, position: int) -> int:
        self.buf["tokens"][:] = tokens
        self.buf["position"][0] = position
        self.helium.run_with_iobinding(self.io_helium)
        slot = position % self.T
        for i in range(self.layers):  # the step's new rows into the ring, in place
            for kind in ("key", "value"):
                self.buf[f"past_key_values.{i}.{kind}"][:, :, slot] = \
                    self.buf[f"present.{i}.{kind}"][:, :, 0]
        return int(self.buf["text_token"][0])

    def depformer_step(self) -> np.ndarray:
        # hidden and text_token are the very buffers helium_step wrote
        self.depformer.run_with_iobinding(self.io_depformer)
        return self.buf["audio_tokens"].copy()


def run_ours(cfg, graphs: Path, user: np.ndarray, threads: int, shared_pool: bool, warmup: int):
    from personaplex_edge.streams import TokenRing

    lm = OrtLM(cfg, graphs, threads, shared_pool)
    ring = TokenRing(cfg)
    temporal, depth, tokens = [], [], []
    for t, codes in enumerate(user):
        ring.write_user(codes[None])
        col = ring.step_input()
        t0 = time.perf_counter()
        text = lm.temporal(col, ring.position)
        t1 = time.perf_counter()
        audio = lm.depformer_step()
        t2 = time.perf_counter()
        ring.write_generated(np.array([text]), audio)
        tokens.append([text, *audio[0]])
        if t >= warmup:
            temporal.append(1000 * (t1 - t0))
            depth.append(1000 * (t2 - t1))
    return temporal, depth, np.array(tokens), lm.ring_bytes


def run_reference(model, user: np.ndarray, warmup: int, active: int):
    import torch
    from moshi.models.lm import LMGen

    model.dep_q = active  # the agent-only schedule (see tests/moshi_lm_reference.py)
    gen = LMGen(model, use_sampling=False)
    temporal, depth, tokens = [], [], []
    times: dict[str, float] = {}
    rec: dict[str, object] = {}

    def timed(fn, key):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            out = fn(*a, **k)
            times[key] = 1000 * (time.perf_counter() - t0)
            return out
        return wrapper

    with torch.no_grad(), gen.streaming(1):
        state = gen._streaming_state
        state.graphed_main = timed(state.graphed_main, "temporal")
        state.graphed_depth = timed(state.graphed_depth, "depth")
        gen.on_text_hook = lambda x: rec.__setitem__("text", int(x[0]))
        gen.on_audio_hook = lambda x: rec.__setitem__("audio", x[0].tolist())
        for t, codes in enumerate(user):
            gen.step(torch.from_numpy(codes)[None, :, None])
            tokens.append([rec["text"], *rec["audio"]])
            if t >= warmup:
                temporal.append(times["temporal"])
                depth.append(times["depth"])
    return temporal, depth, np.array(tokens)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/personaplex_bench_lm")
    ap.add_argument("--config", choices=("mid", "tiny"), default="mid",
                    help="tiny: the test preset, a quick smoke run of this script")
    ap.add_argument("--json")
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    work = Path(args.work) / args.config
    if not args.build_only and not (work / "graphs" / "done").is_file():
        # the export checks its graphs in onnxruntime sessions of its own, which a process-wide
        # pool would refuse: build in a child process, then measure here with the pool
        import subprocess

        subprocess.run([sys.executable, __file__, "--build-only", "--config", args.config,
                        "--work", args.work], check=True)
    shared_pool = False if args.build_only else share_one_thread_pool(args.threads)

    import torch

    torch.set_num_threads(args.threads)
    from mid_model import mid_config

    from personaplex_edge.config import preset

    def log(msg: str) -> None:
        print(msg, flush=True)

    cfg = preset("tiny") if args.config == "tiny" else mid_config()
    work.mkdir(parents=True, exist_ok=True)
    ckpt = build(cfg, work, log)
    if args.build_only:
        return
    graphs = work / "graphs"
    n = args.frames + args.warmup
    user = np.random.default_rng(0).integers(0, cfg.audio_vocab_size, (n, 8)).astype(np.int64)

    bandwidth = copy_bandwidth(args.threads)
    o_tmp, o_dep, o_tok, ring_bytes = run_ours(cfg, graphs, user, args.threads, shared_pool,
                                               args.warmup)
    gc.collect()
    model = load_reference(cfg, ckpt)
    r_tmp, r_dep, r_tok = run_reference(model, user, args.warmup,
                                        cfg.depformer_config.num_active_codebooks)
    del model
    gc.collect()

    # every weight read once, embedding tables excepted (a few rows), plus the whole KV ring
    from personaplex_edge.export.frame_bytes import graph_bytes_per_frame

    h_bytes = graph_bytes_per_frame(graphs / "helium_step.onnx") + ring_bytes
    d_bytes = graph_bytes_per_frame(graphs / "depformer_step.onnx")
    rows = {"temporal": (o_tmp, r_tmp, h_bytes), "depformer": (o_dep, r_dep, d_bytes),
            "total": ([a + b for a, b in zip(o_tmp, o_dep)],
                      [a + b for a, b in zip(r_tmp, r_dep)], h_bytes + d_bytes)}
    h = cfg.temporal_config
    print(f"\nLM per 80 ms frame, {args.frames} frames after {args.warmup} warm-up, "
          f"{args.threads} threads, float32 (weights stored bf16)")
    print(f"model: Helium d {h.hidden_size}, {h.num_hidden_layers} layers, context "
          f"{h.max_position_embeddings}; depformer d {cfg.depformer_config.hidden_size}, "
          f"{cfg.depformer_config.num_hidden_layers} layers, "
          f"{cfg.depformer_config.num_active_codebooks} steps")
    print("onnxruntime: " + ("one thread pool shared by both sessions" if shared_pool else
                             "a pool per session, spinning off"))
    print(f"copy bandwidth (numpy, read+write, {args.threads} threads): {bandwidth / 1e9:.1f} GB/s")
    print(f"{'stage':<10} {'MB/frame':>9} {'floor ms':>9} {'ours ms':>9} {'p90':>7} "
          f"{'ref ms':>9} {'p90':>7} {'speed-up':>9} {'of floor':>9}")
    result = {"bandwidth_GBps": bandwidth / 1e9, "stages": {}}
    for name, (ours, ref, nbytes) in rows.items():
        so, sr = stats(ours), stats(ref)
        floor = 1000 * nbytes / bandwidth
        print(f"{name:<10} {nbytes / 1e6:>9.0f} {floor:>9.1f} {so['mean']:>9.1f} {so['p90']:>7.1f} "
              f"{sr['mean']:>9.1f} {sr['p90']:>7.1f} {sr['mean'] / so['mean']:>8.2f}x "
              f"{floor / so['mean']:>8.0%}")
        result["stages"][name] = {"ours_ms": so, "reference_ms": sr, "bytes": nbytes,
                                  "floor_ms": floor, "speedup": sr["mean"] / so["mean"],
                                  "fraction_of_floor": floor / so["mean"]}
    same = np.array_equal(o_tok, r_tok)
    first_diff = None if same else int(np.argmax((o_tok != r_tok).any(axis=1)))
    print(f"greedy tokens identical to the reference over {n} frames: {same}"
          + ("" if same else f" (first difference at frame {first_diff})"))
    result["tokens_identical"] = same
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
