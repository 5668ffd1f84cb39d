"""The bare GPU check (scripts/gpu/gpu_bare_check.py), run here on the simulated device of
tests/fake_gpu.py and the CPU: what these tests check is the check itself - that its stages run
end to end, that they fail when the code they check is wrong, and that the graph interpreter
that carries the exported arithmetic to the GPU machine computes what onnxruntime computes.
None of it says anything about a real GPU; scripts/gpu_check.sh runs it on one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "gpu"
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(Path(__file__).resolve().parent))

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, demo_model_dir) -> Path:
    import gpu_bare_check

    return gpu_bare_check.prepare(tmp_path_factory.mktemp("bundle") / "gpu_bundle",
                                  progress=lambda s: None, source=demo_model_dir)


def test_simulated_bare_check_runs_every_stage(bundle, tmp_path):
    """Host-side plumbing only (simulated device, CPU arithmetic): every stage of the bare check
    runs in its own process and reports ok; each precision's dump really computes in its own
    dtype (float32 exact, float16 < bfloat16 < int4 in hidden-state error)."""
    import gpu_bare_check

    out = tmp_path / "report.json"
    assert gpu_bare_check.main(["--simulate", "--bundle", str(bundle), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    stages = {r["stage"]: r for r in report["stages"]}
    assert report["simulated"] and set(stages) == set(gpu_bare_check.STAGE_TABLE)
    assert all(r["status"] == "ok" for r in stages.values()), stages
    assert stages["tensorrt-path"]["captured"] is True
    fp32, fp16, bf16, int4 = (stages[f"arith-{p}"] for p in ("fp32", "fp16", "bf16", "int4"))
    assert fp32["text_agree"] == 1.0 and fp32["audio_agree"] == 1.0
    assert fp32["hidden_rel_error"] < 1e-5
    assert 1e-6 < fp16["hidden_rel_error"] < bf16["hidden_rel_error"] < int4["hidden_rel_error"]
    assert bf16["hidden_rel_error"] < 1e-2 and fp16["text_agree"] > 0.9


def test_an_arithmetic_stage_fails_past_its_bound(bundle, monkeypatch):
    """Host-side only (the CPU computes): the arith stages have a verdict, not only figures -
    a precision further from float32 than its bound fails its stage."""
    import arith_check
    import gpu_bare_check

    model = gpu_bare_check._model(bundle)
    reference = arith_check.reference_run(model, 20)
    fine = arith_check.compare(model, bundle / "dumps" / "fp16", "cpu", reference=reference,
                               precision="fp16")
    assert 0 < fine["hidden_rel_error"] <= arith_check.HIDDEN_BOUND["fp16"]
    monkeypatch.setitem(arith_check.HIDDEN_BOUND, "fp16", fine["hidden_rel_error"] / 10)
    with pytest.raises(AssertionError, match="fp16: hidden state"):
        arith_check.compare(model, bundle / "dumps" / "fp16", "cpu", reference=reference,
                            precision="fp16")


def test_a_missing_bundle_is_a_skip_that_says_how_to_make_it(tmp_path):
    import gpu_bare_check

    out = tmp_path / "report.json"
    gpu_bare_check.main(["--simulate", "--bundle", str(tmp_path / "none"), "--only",
                         "tensorrt-path", "--json", str(out)])
    [row] = json.loads(out.read_text())["stages"]
    assert row["status"] == "skipped" and "--prepare" in row["detail"]


def test_plumbing_check_fails_when_a_ring_write_is_wrong(monkeypatch):
    """The plumbing stage is not a formality: device rings that drop one row of a strided copy
    must make it fail."""
    import fake_gpu
    import plumbing_check as pc

    from personaplex_edge.runtime.backends import cuda_runtime, device_rings

    cuda = fake_gpu.FakeCuda()
    monkeypatch.setattr(cuda_runtime, "cudart", lambda: cuda)
    pc.check_plumbing(pc.NumpyKernels(cuda))  # as it is: passes
    real = device_rings.copy_rows

    def one_row_short(dst, dst_pitch, src, src_pitch, width, rows, stream, *rest):
        real(dst, dst_pitch, src, src_pitch, width, max(rows - 1, 1), stream, *rest)

    monkeypatch.setattr(device_rings, "copy_rows", one_row_short)
    with pytest.raises(pc.CheckFailed):
        pc.check_plumbing(pc.NumpyKernels(cuda))


def _random_feeds(graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for a dumped graph, greedy sampling settings (noise 0, temperature 1)."""
    import onnx_torch

    rng = np.random.default_rng(seed)
    feeds = {}
    for name, meta in graph.inputs.items():
        dtype = onnx_torch.DTYPES[meta["dtype"]]
        if dtype.is_floating_point:
            value = rng.standard_normal(meta["shape"]) * 0.5
            value = value.astype(np.float16 if dtype == torch.float16 else np.float32)
        else:
            value = rng.integers(0, 50, meta["shape"]).astype(np.int64)
        if "noise" in name or "top_k" in name:
            value[...] = 0
        if "temperature" in name:
            value[...] = 1
        feeds[name] = value
    return feeds


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int4"])
def test_dumped_graphs_compute_what_onnxruntime_computes(demo_model_dir, tmp_path, precision):
    """Each LM graph in the form written for TensorRT (int4: opset-21 DequantizeLinear in
    blocks), dumped and interpreted in torch, equals onnxruntime CPU running the same ONNX
    graph with its graph optimisations off (on, onnxruntime fuses DequantizeLinear + MatMul
    into its own int4 kernel, which is 18 times further from float32 than the graph): the
    interpreter's semantics are ONNX's, so a GPU figure from it is the graph's."""
    import onnx_dump
    import onnx_torch
    import onnxruntime as ort

    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.manifest import load_model_dir

    graphs = demo_model_dir
    if precision != "fp32":
        graphs = tmp_path / precision
        convert_model_dir(demo_model_dir, graphs, precision, backend="tensorrt",
                          progress=lambda s: None)
    manifest = load_model_dir(graphs)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for name, check in (("helium_step", "hidden"), ("depformer_step", "audio_tokens")):
        entry = manifest.graphs[name]
        spec = onnx_dump.dump_graph(graphs / entry.file, tmp_path / f"{name}.npz",
                                    {"frames": 1}, entry.rings)
        ops = {n["op"] for n in spec["nodes"]}
        assert ("DequantizeLinear" in ops) == (precision == "int4")
        graph = onnx_torch.TorchGraph.load(tmp_path / f"{name}.npz")
        feeds = _random_feeds(graph)
        session = ort.InferenceSession(str(graphs / entry.file), options,
                                       providers=["CPUExecutionProvider"])
        want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        got = graph.run({k: torch.from_numpy(v) for k, v in feeds.items()})
        assert set(want) == set(graph.outputs)
        value = got[check].numpy()
        if value.dtype.kind == "f":
            error = np.abs(value - want[check]).max() / np.abs(want[check]).max()
            assert error < (1e-6 if precision == "fp32" else 1e-3), error
        else:
            assert np.array_equal(value, want[check])


def test_the_interpreter_names_an_op_it_does_not_know():
    import onnx_torch

    spec = {"name": "g", "inputs": [], "outputs": ["y"], "tensors": {},
            "nodes": [{"op": "Einsum", "inputs": [], "outputs": ["y"], "attrs": {}}]}
    with pytest.raises(NotImplementedError, match="Einsum"):
        onnx_torch.TorchGraph(spec, {})


def test_the_7b_step_reads_the_bytes_the_floor_counts():
    """helium_timing's floor divides the bytes one step reads; on the real 7B config (built on
    the meta device: no memory) they are every linear of Helium plus the whole fp16 KV ring,
    as benchmarks/frame_bytes counts them for the fp16 TensorRT layout."""
    import helium_timing

    from personaplex_edge.config import PersonaPlexConfig
    from frame_bytes import (_weight_bytes, estimate_bytes_per_frame,
                                                     layout_for, linear_shapes)
    from personaplex_edge.export.helium import Helium
    from personaplex_edge.export.precision_plan import plan_for

    cfg = PersonaPlexConfig()
    with torch.device("meta"):
        model = Helium(cfg).to(torch.float16)
        ring = [torch.empty(model.kv_shape(1), dtype=torch.float16)
                for _ in range(2 * model.num_layers)]
    layout = layout_for(plan_for("fp16", "tensorrt"))
    helium_weights = _weight_bytes(linear_shapes(cfg)["helium_step"], layout)
    kv = estimate_bytes_per_frame(cfg, layout)["kv"]
    assert helium_timing.bytes_read(model, ring) == helium_weights + kv
    assert 13e9 < helium_weights < 14e9


def test_the_step_timed_is_the_exported_step():
    """The timed module (demo shape, CPU, float32) gives the text token the export's reference
    forward gives on the same weights and ring: what is timed is Helium, not a stand-in."""
    import helium_timing

    from personaplex_edge.config import preset

    cfg = preset("demo")
    model, ring = helium_timing.build(cfg, "cpu", torch.float32)
    tokens = torch.zeros((1, 1, 17), dtype=torch.int64)
    extra = torch.zeros((1, 1, cfg.temporal_config.hidden_size))
    position = torch.full((1,), 2000, dtype=torch.int64)  # as time_step
    with torch.no_grad():
        logits, _, _ = model.forward_logits(tokens, extra, position,
                                            list(zip(ring[0::2], ring[1::2])))
    figures = helium_timing.time_step(cfg, "cpu", torch.float32, iters=2, graph=False)
    assert figures["hidden_finite"]
    assert figures["text_token"] == int(logits.argmax(-1)[0])


def test_gpu_check_sh_runs_the_offline_stages_without_a_network(bundle, tmp_path):
    """scripts/gpu_check.sh's offline branch (forced here with GPU_CHECK_OFFLINE=1, as a
    machine without PyPI takes it): no install attempted, the bare check run on the bundle,
    its report written under $OUT."""
    import os
    import subprocess

    env = {**os.environ, "GPU_CHECK_OFFLINE": "1", "PYTHON": sys.executable,
           "GPU_BUNDLE": str(bundle), "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", str(SCRIPTS.parent / "gpu_check.sh"), "--simulate", "--only",
                           "plumbing,arith-fp16"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "gpu_bare_check.json").read_text())
    assert [r["stage"] for r in report["stages"]] == ["plumbing", "arith-fp16"]
    assert all(r["status"] == "ok" for r in report["stages"])
    assert "virtual environment" not in proc.stdout  # nothing installed


def test_the_onnxruntime_gpu_check_runs_its_7b_stages_on_the_simulated_device(
        demo_model_dir, tmp_path):
    """scripts/gpu/ort_gpu_check.sh's measurements of the 7B (gpu_check.py --configs 7b) on a
    skeleton of the demo, simulated (stand-in CUDA sessions computing on the CPU): the weights
    made again, OrtCudaGraph eager with the persona's prefill on the same loaded weights, then
    replayed as CUDA graphs with the eager run's tokens; the JSON report has each figure. Both
    compute on the same CPU here, so equal tokens alone would prove nothing: the stand-in
    sessions also count how onnxruntime was asked to run them, and the graph stage's every run
    must be a replay of a capture, the eager stage's none. Says nothing of a GPU: it keeps the
    prepared check from rotting between runs on one."""
    import subprocess

    import skeleton

    skel = skeleton.make(demo_model_dir, tmp_path / "skeleton", ["helium_step", "depformer_step"],
                         keep_bytes=1024)
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(SCRIPTS / "gpu_check.py"), "--simulate",
                           "--configs", "7b", "--skeleton", str(skel), "--work",
                           str(tmp_path / "work"), "--json", str(report)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(report.read_text())
    stages = {s["stage"]: s for s in result["stages"]}
    assert "SIMULATED" in done.stdout
    made = [s for name, s in stages.items() if "made again" in name]
    eager = [s for name, s in stages.items() if name.endswith("ort-cuda, then the persona's "
                                                              "prefill")]
    graph = [s for name, s in stages.items() if name.endswith("ort-cuda-graph")]
    assert [len(made), len(eager), len(graph)] == [1, 1, 1], list(stages)
    assert all(s["status"] == "ok" for s in (*made, *eager, *graph)), stages
    rows = {t["backend"]: t for t in result["timings"] if "total_ms" in t}
    assert rows["ort-cuda-graph"]["against"] == "ort-cuda"
    assert rows["ort-cuda-graph"]["agreement"]["frames"] == 1.0
    frames = 20 + 5  # gpu_check's 7b stages: 20 frames and 5 of warm-up
    assert rows["ort-cuda-graph"]["simulated_runs"] == {"eager": 0, "graph": 2 * frames}
    assert rows["ort-cuda"]["simulated_runs"]["graph"] == 0
    assert rows["ort-cuda"]["simulated_runs"]["eager"] >= 2 * frames  # and the prefill's
    prefill = [t for t in result["timings"] if "prefill_s" in t]
    assert len(prefill) == 1 and prefill[0]["prefill_frames"] == 82
