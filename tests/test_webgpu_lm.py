"""`--device webgpu`, the language model alone (runtime/backends/ort_webgpu.py on SwiftShader,
tests/webgpu_env.py): greedy tokens on fixed user codes equal onnxruntime CPU's at fp32, int8
and int4 (float32 compute) past the ring's wrap; graph capture where the provider allows it;
a float16 model refused on an adapter without shader-f16. Whole conversations, lockstep,
serve and the other refusals: test_webgpu.py (apart, so that the two xdist workers share the
shader compiles and frames)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from webgpu_env import adapter_or_skip, cli

pytest.importorskip("onnxruntime_ep_webgpu", reason="the webgpu extra (scripts/install.sh "
                    "installs it)")

from personaplex_edge.runtime.backends import DeviceUnavailable, load_graphs  # noqa: E402

CONTEXT = 24  # the ring of the short-context model: 30 frames wrap it
LM_FRAMES = 30


@pytest.fixture(scope="module")
def adapter():
    return adapter_or_skip()


@pytest.fixture(scope="module")
def short_models(tmp_path_factory) -> dict[str, Path]:
    """The demo's widths and vocabulary with a 24-frame context, in the published layout and
    exported in fp32, and its int8 and int4 conversions with float32 compute (what every
    WebGPU adapter runs) - Helium's, the graph whose ring is written; the depformer stays fp32
    (SwiftShader runs its eight steps of MatMulNBits at 3 s a frame)."""
    from personaplex_edge.config import PRESETS, PersonaPlexConfig
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.export.precision_plan import lm_plans
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    data = json.loads(json.dumps(PRESETS["demo"]))
    data["temporal_config"]["max_position_embeddings"] = CONTEXT
    cfg = PersonaPlexConfig.from_dict(data, where="short")
    root = tmp_path_factory.mktemp("webgpu_short")
    ckpt = write_synthetic_checkpoint(cfg, root / "ckpt", seed=5)
    out = {"fp32": root / "fp32"}
    export_model(resolve_checkpoint(str(ckpt)), out["fp32"], progress=lambda s: None)
    for precision in ("int8", "int4"):
        out[precision] = root / precision
        convert_model_dir(out["fp32"], out[precision], precision, progress=lambda s: None,
                          plans=lm_plans(precision, "onnx", depformer_precision="fp32",
                                         compute="float32"))
    return out


def _greedy_lm_tokens(model_dir: Path, device: str, codes: np.ndarray) -> np.ndarray:
    from lm_probe import GreedyLM

    lm = GreedyLM(model_dir, device=device)
    try:
        return lm.run(codes).tokens
    finally:
        lm.close()


def _user_codes(frames: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, (frames, 8))


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_the_lm_on_webgpu_gives_the_cpus_greedy_tokens_past_the_ring_wrap(
        adapter, short_models, precision):
    """helium_step + depformer_step through runtime/lm_frame (the product path), greedy on
    fixed user codes for 48 frames of a 40-slot ring: every text and audio token of every frame
    equals onnxruntime's on the CPU, so the in-place ring write put each row at its slot.
    (Measured once over 48 frames of a 40-slot ring with int4 in both graphs: equal too.)"""
    from personaplex_edge.manifest import load_model_dir

    model_dir = short_models[precision]
    manifest = load_model_dir(model_dir, need="lm")
    assert manifest.config.temporal_config.max_position_embeddings == CONTEXT < LM_FRAMES
    if precision != "fp32":
        assert manifest.graphs["helium_step"].compute == "float32"
        assert not manifest.graphs["helium_step"].float16  # no shader-f16 needed
    codes = _user_codes(LM_FRAMES)
    cpu = _greedy_lm_tokens(model_dir, "cpu", codes)
    gpu = _greedy_lm_tokens(model_dir, "webgpu", codes)
    assert len(np.unique(cpu[:, 0])) > 5 and len(np.unique(cpu[:, 1:])) > 20  # not a constant
    np.testing.assert_array_equal(gpu, cpu)


def test_graph_capture_where_the_provider_allows_it_gives_the_cpus_tokens(
        adapter, short_models, monkeypatch):
    """PERSONAPLEX_WEBGPU_CAPTURE=1: the provider captures a graph only when all its nodes are
    on the adapter. The depformer's are (its sampling gathers in float32, not int64), so its
    step is recorded once per state parity and replayed, the inputs copied into fixed buffers
    each call; so is the ring write. Helium keeps its frames axis's shape arithmetic on the
    CPU: the load says so and it runs uncaptured. The tokens are the CPU's, past the wrap."""
    from lm_probe import GreedyLM

    from personaplex_edge.manifest import load_model_dir
    from personaplex_edge.runtime.backends.ort_webgpu import CAPTURE_SWITCH

    model_dir = short_models["fp32"]
    codes = _user_codes(LM_FRAMES, seed=2)
    cpu = _greedy_lm_tokens(model_dir, "cpu", codes)
    monkeypatch.setenv(CAPTURE_SWITCH, "1")
    said = []
    manifest = load_model_dir(model_dir, need="lm")
    loaded = load_graphs(model_dir, manifest, ["helium_step", "depformer_step"], "webgpu",
                         progress=said.append)
    assert loaded["depformer_step"].capture and not loaded["helium_step"].capture
    assert any(line.startswith("graph capture: depformer_step captured") and
               "refused it for helium_step" in line for line in said), said
    lm = GreedyLM(model_dir, manifest, opener=lambda name: loaded[name].bind())
    try:
        assert lm.helium._rings._run_options.get_run_config_entry("gpu_graph_id") == "1"
        np.testing.assert_array_equal(lm.run(codes).tokens, cpu)
    finally:
        lm.close()


def test_a_float16_model_on_an_adapter_without_shader_f16_names_the_export_that_fits(
        adapter, demo_model_dir, tmp_path):
    """SwiftShader has no shader-f16: an fp16 model, and an int4 one with the default float16
    compute, are refused before any graph loads, naming --compute float32; the same int4
    with float32 compute loads."""
    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.export.precision_plan import lm_plans
    from personaplex_edge.manifest import load_model_dir

    assert not adapter.shader_f16
    for precision, compute in (("fp16", None), ("int4", None), ("int4", "float32")):
        out = tmp_path / f"{precision}-{compute}"
        manifest = convert_model_dir(demo_model_dir, out, precision, progress=lambda s: None,
                                     plans=lm_plans(precision, "onnx", compute=compute))
        names = ["helium_step", "depformer_step"]
        if compute == "float32":
            graphs = load_graphs(out, load_model_dir(out), names, "webgpu")
            assert sorted(graphs) == sorted(names)
            continue
        with pytest.raises(DeviceUnavailable) as refused:
            load_graphs(out, manifest, names, "webgpu")
        message = str(refused.value)
        assert "has no shader-f16" in message and "--compute float32" in message, message
    done = cli(["bench", "--model", str(tmp_path / "fp16-None"), "--device", "webgpu",
                 "--frames", "1", "--warmup", "0", "--no-persona"])
    assert done.returncode == 2 and "shader-f16" in done.stderr, done.stderr
    assert done.stderr.count("\n") <= 2, done.stderr  # one message, no traceback




def test_verify_and_the_model_card_say_which_devices_a_model_runs_on(short_models, tmp_path,
                                                                    capsys):
    """fp32, and int4 with float32 compute, run on every WebGPU adapter; fp16 only on adapters
    with shader-f16: `verify` prints it and the model card says it."""
    from personaplex_edge.cli import main
    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.manifest import load_model_dir
    from personaplex_edge.model_card import model_card

    fp16 = convert_model_dir(short_models["fp32"], tmp_path / "fp16", "fp16",
                             progress=lambda s: None)
    said = {}
    for name, model_dir in (("fp32", short_models["fp32"]), ("int4", short_models["int4"]),
                            ("fp16", tmp_path / "fp16")):
        assert main(["verify", "--model", str(model_dir)]) == 0
        said[name] = next(line for line in capsys.readouterr().out.splitlines()
                          if line.startswith("runs on: "))
    for name in ("fp32", "int4"):
        assert "WebGPU (Vulkan, Metal, D3D12), every adapter (--device webgpu)" in said[name]
        assert "the CPU" in said[name]
    assert "adapters with shader-f16 (--device webgpu)" in said["fp16"]
    card = model_card(fp16, "someone/short-fp16")
    assert "adapters with shader-f16" in card
    assert "every adapter" in model_card(load_model_dir(short_models["int4"]), "someone/x")
