"""The TensorRT engine build (runtime/backends/trt_build.py) and the `engines` command.

Everything here is host-side plumbing on the simulated GPU (tests/fake_gpu.py): which calls the
build makes of TensorRT's documented Python API, what it records, what it says, and what it
leaves on disk when a build fails. Whether TensorRT parses and builds these graphs, and how large
its engines really are, test_rtx_engines.py shows with the real TensorRT for RTX (no GPU
needed); mainline TensorRT's own builds only a GPU machine can show (scripts/gpu_check.sh).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.manifest import load_model_dir, write_manifest


@pytest.fixture(scope="module")
def tiny_fp32(tiny_export) -> Path:
    return tiny_export


@pytest.fixture
def simulated(tiny_fp32, tmp_path, monkeypatch):
    """A copy of the tiny model on the simulated GPU (engines recorded as built there), its
    timing caches in tmp_path."""
    import fake_gpu

    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    return fake_gpu.simulated_copy(tiny_fp32, tmp_path / "model", monkeypatch)


def _tree(path: Path) -> dict[str, bytes]:
    """Every file's bytes (checking a directory writes nothing into it: its hash stamps go to
    the per-user cache)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_simulated_gpu_engine_build_calls_and_record(simulated, tmp_path):
    """Host-side plumbing: build_engines through TensorRT's build API - a strongly typed
    network, TF32 off for float32, the workspace limit, the timing cache written, reused, and
    dropped when it was recorded on another GPU - records the GPU's name and memory and the
    graph's weight bytes, and writes an engine the (simulated) runtime deserialises to the
    graph it was built from."""
    from personaplex_edge.runtime.backends.trt_build import (build_engines, default_timing_cache,
                                                             graph_weight_bytes)

    model, cuda = simulated
    trt = sys.modules["tensorrt"]
    cache = default_timing_cache(trt.__version__, "9.0")
    said = []
    manifest = build_engines(model, graphs=["helium_step", "depformer_step"],
                             workspace_bytes=1 << 30, progress=said.append)
    assert len(trt.builds) == 2 and cache.is_file()
    for network, config in trt.builds:
        assert network.flags == 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        assert trt.BuilderFlag.TF32 not in config.flags  # float32: checked token for token
        assert config.pools == {trt.MemoryPoolType.WORKSPACE: 1 << 30}
        assert config.timing_cache is not None
    spec = manifest.graphs["helium_step"].engine
    assert spec["tensorrt_version"] == trt.__version__ and spec["compute_capability"] == "9.0"
    assert spec["device_name"] == "Simulated GPU" and spec["device_memory"] == 80 << 30
    weights = graph_weight_bytes(model / "helium_step.onnx")
    assert spec["weight_bytes"] == weights.stored > 100_000  # float32 weights of the tiny LM
    assert weights.as_float16 == weights.stored  # nothing quantised: nothing to fold
    assert any(line.startswith("  helium_step.engine: built") and "graph weights" in line
               for line in said), said
    engine = trt.Runtime(None).deserialize_cuda_engine((model / spec["file"]).read_bytes())
    assert "past_key_values.0.key" in engine.names  # helium's graph, not another
    # helium's frames axis gets one optimization profile: kernels chosen for the live step
    # (1 frame), calls up to a whole persona (context - 1 frames); the depformer has none
    (helium_cfg, depformer_cfg) = [c for _, c in trt.builds]
    (profile,) = helium_cfg.profiles
    context = manifest.config.temporal_config.max_position_embeddings
    assert profile.shapes["tokens"] == ((1, 1, 17), (1, 1, 17), (1, context - 1, 17))
    assert set(profile.shapes) == {"tokens", "extra_embedding"}
    assert not getattr(depformer_cfg, "profiles", [])

    write_manifest(model, manifest)
    cache.write_bytes(trt.Builder(None).create_builder_config().create_timing_cache(b"")
                      .serialize().tobytes().replace(b"Simulated GPU", b"Other GPU"))
    build_engines(model, graphs=["depformer_step"], progress=said.append)
    assert any("recorded on another GPU" in line for line in said)
    assert b"Simulated GPU" in cache.read_bytes()  # replaced by this GPU's


def test_simulated_gpu_engines_are_built_at_each_graph_own_precision(tiny_fp32, tmp_path,
                                                                     monkeypatch):
    """Host-side plumbing: in an fp16 model with an int8 depformer, the codec's engines are
    built as float32 (TF32 off: its codes must match the CPU's) and each engine records its
    graph's precision."""
    import fake_gpu

    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.runtime.backends.trt_build import build_engines

    model = tmp_path / "mixed"
    convert_model_dir(tiny_fp32, model, "fp16", backend="tensorrt", progress=lambda s: None,
                      depformer_precision="int8")
    fake_gpu.install(monkeypatch, model)
    trt = sys.modules["tensorrt"]
    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    manifest = build_engines(model, progress=lambda s: None)
    built = {name: g.engine["precision"] for name, g in manifest.graphs.items()}
    assert built == {"mimi_encoder": "fp32", "mimi_decoder": "fp32", "helium_step": "fp16",
                     "depformer_step": "int8"}
    tf32 = [trt.BuilderFlag.TF32 in config.flags for _, config in trt.builds]
    assert tf32 == [False, False, True, True]  # in manifest order: the codec first


def test_simulated_t4_bf16_is_refused_before_a_build_and_fp16_builds(tiny_fp32, tmp_path,
                                                                     monkeypatch, capsys):
    """Mainline TensorRT on a T4 (Turing, 7.5, which has no bf16): a bf16 model's engines are
    refused before anything is built, by `engines` and on first use alike, naming the GPU's
    compute capability and the fix; an fp16 model's build there."""
    import fake_gpu
    from dir_state import tree_state

    from personaplex_edge.cli import main
    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.runtime.backends import load_graphs

    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    t4 = fake_gpu.FakeCuda("Tesla T4", 15 << 30, "7.5")
    bf16 = tmp_path / "bf16"
    convert_model_dir(tiny_fp32, bf16, "bf16", backend="tensorrt", progress=lambda s: None)
    fake_gpu.patch(monkeypatch, bf16, t4)
    trt = sys.modules["tensorrt"]
    before = tree_state(bf16)
    assert main(["engines", "--model", str(bf16)]) == 2
    err = capsys.readouterr().err
    assert "bf16 needs compute capability 8.0 or newer; this GPU is 7.5: export another " \
           "precision" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(PersonaPlexError, match="bf16 needs compute capability 8.0 or newer; "
                                               "this GPU is 7.5"):
        load_graphs(bf16, load_model_dir(bf16), ["helium_step"], "cuda")
    assert trt.builds == [] and tree_state(bf16) == before
    assert not (tmp_path / "cache" / "engines").exists()

    fp16 = tmp_path / "fp16"
    convert_model_dir(tiny_fp32, fp16, "fp16", backend="tensorrt", progress=lambda s: None)
    fake_gpu.patch(monkeypatch, fp16, t4)
    assert main(["engines", "--model", str(fp16), "--graphs", "helium_step"]) == 0
    assert [Path(n.onnx_path).name for n, _ in sys.modules["tensorrt"].builds] == [
        "helium_step.onnx"]
    assert load_model_dir(fp16).graphs["helium_step"].engine["compute_capability"] == "7.5"


def test_engine_size_tells_kept_from_folded_weights():
    from personaplex_edge.runtime.backends.trt_build import WeightBytes, weights_verdict

    int4 = WeightBytes(stored=4_000_000_000, as_float16=15_000_000_000)  # a 7B-like Helium
    assert weights_verdict(4_300_000_000, int4).endswith("weights kept quantised")
    assert "FOLDED BACK TO FLOAT16" in weights_verdict(15_200_000_000, int4)
    small = WeightBytes(stored=1_000_000, as_float16=3_000_000)
    assert weights_verdict(40_000_000, small).endswith("too small to tell whether TensorRT "
                                                       "kept them quantised")
    assert "kept" not in weights_verdict(100, WeightBytes(50, 50))  # float: nothing to say


def test_simulated_gpu_build_output_says_kept_or_folded(tiny_fp32, tmp_path, monkeypatch):
    """Host-side plumbing: the build compares each engine's size with the int8 graph's weight
    bytes and says which happened; the simulated builder makes engines of either size."""
    import fake_gpu

    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.runtime.backends import trt_build

    model = tmp_path / "int8"
    convert_model_dir(tiny_fp32, model, "int8", backend="tensorrt", progress=lambda s: None)
    fake_gpu.install(monkeypatch, model)
    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(trt_build, "_VERDICT_MIN_BYTES", 0)  # the tiny model's weights are KB
    trt = sys.modules["tensorrt"]
    weights = trt_build.graph_weight_bytes(model / "depformer_step.onnx")
    # int8 matrices widen to fp16 (the tiny depformer is mostly fp16 embedding tables)
    assert weights.as_float16 > 1.15 * weights.stored
    for size, verdict in ((weights.stored, "weights kept quantised"),
                          (weights.as_float16, "FOLDED BACK TO FLOAT16")):
        trt.plan_padding = lambda graph, size=size: size
        said = []
        manifest = trt_build.build_engines(model, graphs=["depformer_step"], progress=said.append)
        assert verdict in said[-1], said
        assert manifest.graphs["depformer_step"].engine["weight_bytes"] == weights.stored
        write_manifest(model, manifest)


def test_simulated_gpu_failed_rebuild_leaves_the_old_engines_and_manifest(simulated):
    """Host-side plumbing: `rebuild_engines` builds in a staging copy; a build that fails on
    the second graph leaves every file of the model directory as it was and no staging
    directory; a build that succeeds replaces the engines and the manifest in one rename."""
    from personaplex_edge.runtime.backends.trt_build import rebuild_engines

    model, _ = simulated
    trt = sys.modules["tensorrt"]
    before = _tree(model)
    trt.fail_builds = {"mimi_decoder.onnx"}  # the second graph in manifest order
    with pytest.raises(PersonaPlexError, match="could not build an engine for mimi_decoder"):
        rebuild_engines(model, progress=lambda s: None)
    assert len(trt.builds) == 2  # the first engine was built, in the stage
    assert _tree(model) == before
    assert sorted(p.name for p in model.parent.iterdir()
                  if p.name.startswith(".")) == []  # no stage or old copy left beside it

    trt.fail_builds = set()
    trt.plan_padding = lambda graph: 7  # a rebuilt engine differs from the installed one
    manifest = rebuild_engines(model, progress=lambda s: None)
    after = _tree(model)
    assert after["mimi_decoder.engine"] != before["mimi_decoder.engine"]
    assert after["helium_step.onnx.data"] == before["helium_step.onnx.data"]  # weights as they were
    recorded = json.loads(after["manifest.json"])["graphs"]["mimi_decoder"]["engine"]
    assert recorded == manifest.graphs["mimi_decoder"].engine
    assert recorded["device_memory"] == 80 << 30
    load_model_dir(model)  # every hash holds
    assert not [p for p in model.parent.iterdir() if p.name.startswith(".")]


def test_simulated_gpu_engines_command(simulated, capsys):
    """Host-side plumbing: `personaplex-edge engines` rebuilds the graphs it is given and
    refuses an unknown graph with one message and exit status 2."""
    from personaplex_edge.cli import main

    model, _ = simulated
    trt = sys.modules["tensorrt"]
    assert main(["engines", "--model", str(model), "--graphs", "depformer_step"]) == 0
    assert len(trt.builds) == 1
    out = capsys.readouterr()
    assert "depformer_step.engine: built" in out.out and "engines for depformer_step" in out.out
    assert main(["engines", "--model", str(model), "--graphs", "helium"]) == 2
    err = capsys.readouterr().err
    assert "has no graph helium; its graphs: mimi_encoder" in err and "Traceback" not in err


def test_without_tensorrt_the_engines_command_is_one_message(tiny_fp32, capsys, monkeypatch):
    """Neither TensorRT importable: one message naming both install lines, exit 2, and the
    directory untouched."""
    from personaplex_edge.cli import main

    for module in ("tensorrt", "tensorrt_rtx"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    before = _tree(tiny_fp32)
    assert main(["engines", "--model", str(tiny_fp32)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "pip install 'personaplex-edge[rtx]'" in err and "personaplex-edge[trt-cu12]" in err
    assert _tree(tiny_fp32) == before


def test_export_hands_the_staging_directory_to_the_engine_builder(tiny_fp32, tmp_path):
    """export_model builds no engines itself: with backend tensorrt it calls the injected
    builder on its staging directory (the manifest it returns is the one written); without
    one it says how to build them later. int8 for TensorRT is announced as experimental
    before anything is written."""
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model

    ckpt = resolve_checkpoint(str(tiny_fp32.parent / "ckpt"))
    calls = []

    def builder(stage, manifest, *, progress):
        calls.append((Path(stage), manifest.backend))
        assert not (tmp_path / "trt").exists()  # building inside the stage, not the target
        (stage / "helium_step.engine").write_bytes(b"plan")
        graphs = dict(manifest.graphs)
        graphs["helium_step"] = dataclasses.replace(graphs["helium_step"], engine={
            "file": "helium_step.engine", "sha256": "x", "tensorrt_version": "10.0",
            "compute_capability": "9.0", "device_name": "G", "precision": "int8"})
        return dataclasses.replace(manifest, graphs=graphs)

    said = []
    with pytest.raises(Exception, match="helium_step.engine' does not match its sha256"):
        export_model(ckpt, tmp_path / "trt", precision="int8", backend="tensorrt",
                     engine_builder=builder, progress=said.append)
    assert said[0].startswith("warning: helium_step in int8 for TensorRT is experimental")
    assert calls and calls[0][0].name.startswith(".trt.partial-") and calls[0][1] == "tensorrt"
    assert not (tmp_path / "trt").exists()  # the export's read-back refused the bad record

    said.clear()
    export_model(ckpt, tmp_path / "graphs", precision="int4", backend="tensorrt",
                 progress=said.append)
    assert not [s for s in said if s.startswith("warning")]  # int4 is TensorRT's documented path
    assert any("personaplex-edge engines --model" in s for s in said)
    assert not list((tmp_path / "graphs").glob("*.engine"))


def test_bf16_for_onnxruntime_is_refused_before_anything_is_written(tiny_fp32, tmp_path, capsys):
    from personaplex_edge.cli import main

    for flags in (["--precision", "bf16"], ["--precision", "int4", "--depformer-precision",
                                             "bf16"], ["--kv-dtype", "bfloat16"]):
        code = main(["export", "--checkpoint", str(tmp_path / "no-such-checkpoint"), "--out",
                     str(tmp_path / "out"), *flags])
        err = capsys.readouterr().err
        assert code == 2 and "cannot run on onnxruntime" in err and "--backend tensorrt" in err
        assert "fp16" in err or "float16" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("batch", ["0", "-1"])
def test_a_batch_below_one_is_refused_before_anything_is_written(tmp_path, capsys, batch):
    """(--batch 0 divided by zero inside the export, --batch -1 was a traceback.)"""
    from personaplex_edge.cli import main

    code = main(["export", "--checkpoint", str(tmp_path / "no-such-checkpoint"), "--out",
                 str(tmp_path / "out"), "--batch", batch])
    err = capsys.readouterr().err
    assert code == 2 and f"--batch {batch}" in err and "at least 1" in err
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_a_damaged_graph_is_one_build_error(tmp_path):
    """Reading the graph before the build (its ops, its weight bytes) fails with the fix, not
    with protobuf's DecodeError."""
    from personaplex_edge.runtime.backends.trt_build import (EngineBuildError,
                                                             graph_weight_bytes,
                                                             uses_contrib_ops)

    bad = tmp_path / "helium_step.onnx"
    bad.write_bytes(b"\x08\xff\xff not a model" * 8)
    for read in (uses_contrib_ops, graph_weight_bytes):
        with pytest.raises(EngineBuildError, match="cannot read helium_step.onnx.*export"):
            read(bad)


# ---- a model directory the runtime may not write: engines in the per-user cache ------------------

@pytest.fixture
def downloaded(tiny_fp32, tmp_path, monkeypatch):
    """The tiny model exported for TensorRT without engines (what a board downloads), its own
    per-user cache, and the simulated GPU."""
    import fake_gpu

    from personaplex_edge.export.precision import convert_model_dir

    model = tmp_path / "downloaded"
    convert_model_dir(tiny_fp32, model, "fp32", backend="tensorrt", progress=lambda s: None)
    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    fake_gpu.patch(monkeypatch, model)
    return model


def _cached_engines(tmp_path: Path) -> list[Path]:
    """The per-GPU directories of the per-user engine cache."""
    return sorted((tmp_path / "cache" / "engines").glob("*"))


def _graphs_of(cache: Path) -> list[str]:
    """The graphs whose engines a cache directory holds (<graph>-<key>.engine)."""
    return sorted(p.name.split("-")[0] for p in cache.glob("*.engine"))


def test_simulated_gpu_a_read_only_model_gets_its_engines_built_once_into_the_user_cache(
        downloaded, tmp_path, monkeypatch):
    """First use on a GPU builds each engine into the per-user cache (said, once), the next
    start reuses them, a damaged one is built again, another GPU gets its own; the model
    directory is not touched, and the engines compute what onnxruntime computes."""
    import fake_gpu
    from dir_state import read_only, tree_state
    from lm_probe import GreedyLM

    from personaplex_edge.runtime.backends import load_graphs
    from personaplex_edge.user_cache import writable_dir

    model = downloaded
    user = np.random.default_rng(5).integers(0, 2048, (20, 8))
    cpu = GreedyLM(model, device="cpu", threads=1).run(user)
    trt = sys.modules["tensorrt"]
    before = tree_state(model)
    with read_only(model):
        assert not writable_dir(model)
        run = GreedyLM(model, device="cuda").run(user)
        np.testing.assert_array_equal(run.tokens, cpu.tokens)
        assert sorted(Path(n.onnx_path).name for n, _ in trt.builds) == [
            "depformer_step.onnx", "helium_step.onnx"]
        GreedyLM(model, device="cuda").run(user[:3])  # a second start: nothing built
        assert len(trt.builds) == 2
        manifest = load_model_dir(model)
        said = []
        load_graphs(model, manifest, ["mimi_encoder", "mimi_decoder"], "cuda",
                    progress=said.append)
        assert len(trt.builds) == 4
        assert [line for line in said if "building it into" in line and str(model) in line
                and "mimi_encoder, mimi_decoder" in line and "Simulated GPU" in line], said
        (cache,) = _cached_engines(tmp_path)
        assert _graphs_of(cache) == ["depformer_step", "helium_step", "mimi_decoder",
                                     "mimi_encoder"]
        (helium,) = cache.glob("helium_step-*.engine")
        helium.write_bytes(b"damaged")
        GreedyLM(model, device="cuda").run(user[:3])
        assert Path(trt.builds[-1][0].onnx_path).name == "helium_step.onnx"
        assert len(trt.builds) == 5  # that one only

        other = fake_gpu.patch(monkeypatch, model, fake_gpu.FakeCuda("Other GPU", 40 << 30))
        run = GreedyLM(model, device="cuda").run(user)
        np.testing.assert_array_equal(run.tokens, cpu.tokens)
        assert len(sys.modules["tensorrt"].builds) == 2 and other.name == "Other GPU"
    assert tree_state(model) == before
    assert [p.name.split("-")[0] for p in _cached_engines(tmp_path)] == ["Other", "Simulated"]


def _reexport(model: Path, graph: str) -> None:
    """`graph` changed as a re-export changes it (here one more metadata entry: it computes
    the same), its new sha256 in the manifest."""
    import onnx

    from personaplex_edge.manifest import MANIFEST, sha256_file

    path = model / f"{graph}.onnx"
    proto = onnx.load(str(path), load_external_data=False)
    proto.metadata_props.add(key="reexport", value=str(len(proto.metadata_props)))
    onnx.save(proto, str(path))  # its weights stay where they are
    data = json.loads((model / MANIFEST).read_text())
    data["graphs"][graph]["sha256"] = sha256_file(path)
    data["source_revision"] = f"re-exported {graph}"  # the manifest changes beyond the graph
    (model / MANIFEST).write_text(json.dumps(data))


def test_simulated_gpu_the_engine_cache_is_keyed_per_graph_and_pruned(downloaded, tmp_path):
    """Adding a transcriber re-exports the encoder alone, and the manifest changes: only that
    graph's engine is built again, the others are found as they were, and the old encoder's
    engine is removed, said. A second model directory with the same graphs shares their
    engines; once it is gone, the engine only it used goes at the next build, and the ones the
    first model still uses stay. Once the model has builds of a newer TensorRT, the older ones
    go. The layout before (engines keyed by the whole manifest) goes at the first build."""
    import shutil

    from personaplex_edge.runtime.backends import load_graphs

    model = downloaded
    trt = sys.modules["tensorrt"]
    names = ["mimi_encoder", "mimi_decoder", "helium_step", "depformer_step"]

    def start(where: Path) -> tuple[list[str], str]:
        """Loads every graph on the GPU; (the graphs built, what was said)."""
        before, said = len(trt.builds), []
        load_graphs(where, load_model_dir(where), names, "cuda", progress=said.append)
        built = [Path(n.onnx_path).stem for n, _ in trt.builds[before:]]
        return built, "\n".join(said)

    earlier = tmp_path / "cache" / "engines" / ("ab" * 32) / "Simulated-GPU-80GiB-sm90-trt10"
    earlier.mkdir(parents=True)
    (earlier / "helium_step.engine").write_bytes(b"plan" * 1000)
    built, said = start(model)
    assert sorted(built) == sorted(names)
    assert f"{'ab' * 6}... (0 MB): the layout before this version" in said, said
    (cache,) = _cached_engines(tmp_path)
    assert _graphs_of(cache) == sorted(names)

    assert start(model)[0] == []  # found: each engine hashed once and stamped
    _reexport(model, "mimi_encoder")
    old_encoder = sorted(cache.glob("mimi_encoder-*.engine"))
    built, said = start(model)
    assert built == ["mimi_encoder"]
    assert f"{old_encoder[0].name} (0 MB): mimi_encoder of {model.resolve()} changed" in said
    assert _graphs_of(cache) == sorted(names) and not old_encoder[0].exists()
    stamped = json.loads((cache / "verified.json").read_text())  # the old encoder's forgotten
    assert sorted(stamped) == sorted(p.name for p in cache.glob("*.engine")
                                     if not p.name.startswith("mimi_encoder-"))

    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    assert start(copy)[0] == []  # the same graphs: the same engines
    _reexport(copy, "depformer_step")
    assert start(copy)[0] == ["depformer_step"]  # the first model still uses the other one
    assert _graphs_of(cache) == sorted([*names, "depformer_step"])
    shutil.rmtree(copy)
    _reexport(model, "helium_step")
    built, said = start(model)
    assert built == ["helium_step"]
    removed = said.split("removed from the engine cache ")[1].split("\n  ")[1:]
    assert len(removed) == 2, said  # the copy's depformer, the old helium
    assert "/depformer_step-" in removed[0] and removed[0].endswith(f"{copy.resolve()} is gone")
    assert "/helium_step-" in removed[1] and removed[1].endswith(
        f"helium_step of {model.resolve()} changed; {copy.resolve()} is gone")
    assert _graphs_of(cache) == sorted(names)
    assert start(model)[0] == []  # what is left is what the model uses
    assert [p.name for p in _cached_engines(tmp_path)] == [cache.name]

    trt.__version__ = "10.999.1.simulated"  # TensorRT upgraded: the older builds go
    built, said = start(model)
    assert sorted(built) == sorted(names)
    assert said.count(f"of {model.resolve()} for this GPU") == 4, said
    assert [p.name for p in _cached_engines(tmp_path)] == [
        cache.name.replace("10.999.0", "10.999.1")]


def test_simulated_gpu_engines_command_on_a_read_only_directory_writes_the_user_cache(
        downloaded, tmp_path, capsys):
    from dir_state import read_only, tree_state

    from personaplex_edge.cli import main
    from personaplex_edge.runtime.backends import load_graphs

    model = downloaded
    trt = sys.modules["tensorrt"]
    before = tree_state(model)
    with read_only(model):
        assert main(["engines", "--model", str(model)]) == 0
        out = capsys.readouterr().out
        assert "is read-only here" in out and str(tmp_path / "cache") in out
        assert "engines for mimi_encoder, mimi_decoder, helium_step, depformer_step" in out
        assert len(trt.builds) == 4
        manifest = load_model_dir(model)
        load_graphs(model, manifest, list(manifest.graphs), "cuda")  # found, not built again
        assert len(trt.builds) == 4
    assert tree_state(model) == before
    assert len(_cached_engines(tmp_path)) == 1


def test_simulated_gpu_engines_command_refuses_portable_engines_for_a_read_only_directory(
        downloaded, tmp_path, capsys):
    """--targets and --weightless build engines for the model directory itself; the per-user
    cache holds only this GPU's. On a read-only directory they are refused, naming both ways
    on, instead of silently building something else; nothing is built or written."""
    from dir_state import read_only, tree_state

    from personaplex_edge.cli import main

    model = downloaded
    trt = sys.modules["tensorrt"]
    before = tree_state(model)
    with read_only(model):
        for flags, named in ((["--targets", "8.9"], "--targets"),
                             (["--weightless"], "--weightless"),
                             (["--targets", "8.9", "--weightless"], "--targets and --weightless")):
            assert main(["engines", "--model", str(model), "--library", "rtx", *flags]) == 2
            err = capsys.readouterr().err
            assert f"is read-only here (or a Hugging Face snapshot), and {named} build" in err
            assert "copy the model to a directory of your own" in err and err.count("\n") == 1
    assert trt.builds == [] and tree_state(model) == before
    assert _cached_engines(tmp_path) == []


def test_which_directories_the_runtime_may_write(tmp_path):
    from dir_state import read_only

    from personaplex_edge.user_cache import is_hub_snapshot, writable_dir

    plain = tmp_path / "model"
    plain.mkdir()
    assert writable_dir(plain)
    with read_only(plain):
        assert not writable_dir(plain)  # also for root, whom chmod does not stop
    assert writable_dir(plain)
    snapshot = tmp_path / "hub" / "models--nvidia--x" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert is_hub_snapshot(snapshot / "manifest.json") and not writable_dir(snapshot)
    assert not writable_dir(tmp_path / "missing")
