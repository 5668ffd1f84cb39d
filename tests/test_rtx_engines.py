"""Real TensorRT engines of the tests' graphs, built by TensorRT for RTX without a GPU.

TensorRT for RTX (the `rtx` extra; scripts/install.sh installs it) compiles ahead of time on any
machine and leaves the per-GPU kernels to the user's GPU (runtime/backends/trt_library.py). So
here its real ONNX parser and builder take every graph of every precision the TensorRT export
writes, batch 1 and 2, and what they say is the product's: the records, the refusals, the
messages. What needs an RTX GPU - the JIT, the run, the tokens - is the simulated GPU's part
(test_tensorrt.py) and scripts/gpu_check.sh's.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from personaplex_edge.contract import PRECISIONS, EngineSpec
from personaplex_edge.manifest import load_model_dir, sha256_file, write_manifest

try:
    import tensorrt_rtx
except (ImportError, OSError) as e:  # OSError: the wheel is there, its libraries do not load
    pytestmark = pytest.mark.skip(reason=f"TensorRT for RTX is not installed ({e}): pip install "
                                         "'personaplex-edge[rtx]' (scripts/install.sh does)")

RTX = "tensorrt-rtx"
LM = ["helium_step", "depformer_step"]
CODEC = ["mimi_encoder", "mimi_decoder"]


@pytest.fixture(scope="module")
def tiny_fp32(tiny_export) -> Path:
    return tiny_export


@pytest.fixture(scope="module")
def stt_checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny PersonaPlex checkpoint whose Mimi makes 32 codebooks, and a Kyutai STT checkpoint
    in stt-1b-en_fr's layout sharing its Mimi file (random weights: tests/
    moshi_stt_reference.py): what `export --checkpoint CK --transcriber STT` takes."""
    import sentencepiece as spm
    from conftest_stt import stt_tiny_config
    from moshi_stt_reference import reference_stt, stt_config, write_stt_checkpoint

    from personaplex_edge.export.hub import MIMI_FILE
    from personaplex_edge.export.synthetic import train_tokenizer, write_synthetic_checkpoint

    root = tmp_path_factory.mktemp("stt_checkpoints")
    cfg = stt_tiny_config()
    ckpt = write_synthetic_checkpoint(cfg, root / "personaplex")
    tokenizer = train_tokenizer(root / "stt.model", vocab_size=200)
    config = stt_config(spm.SentencePieceProcessor(model_file=str(tokenizer)).get_piece_size())
    stt = write_stt_checkpoint(root / "stt", config, reference_stt(config, seed=5),
                               ckpt / MIMI_FILE, tokenizer, cfg.mimi_config)
    return ckpt, stt


def _convert(tiny_fp32: Path, out: Path, precision: str, **kw) -> Path:
    from personaplex_edge.export.precision import convert_model_dir

    convert_model_dir(tiny_fp32, out, precision, backend="tensorrt", progress=lambda s: None,
                      **kw)
    return out


def _setup(precisions, targets=None):
    from personaplex_edge.runtime.backends.trt_build import build_setup

    return build_setup(precisions, "rtx", targets)


def _check_engines(model: Path, names: list[str], targets: tuple[str, ...]) -> dict[str, int]:
    """Each engine of `names` is recorded as TensorRT for RTX's for `targets`, its file is what
    its record hashes, and it is larger than the weights it holds; -> {graph: engine bytes}."""
    manifest = load_model_dir(model)  # every hash holds, the engines' included
    sizes = {}
    for name in names:
        spec = EngineSpec.from_dict(manifest.graphs[name].engine)
        assert (spec.library, spec.tensorrt_version) == (RTX, tensorrt_rtx.__version__), name
        assert spec.targets == targets and spec.compute_capability == spec.device_name == ""
        assert spec.precision == manifest.graphs[name].precision
        path = model / spec.file
        assert sha256_file(path) == spec.sha256
        sizes[name] = path.stat().st_size
        assert sizes[name] > spec.weight_bytes > 0, (name, sizes[name], spec.weight_bytes)
    return sizes


@pytest.mark.parametrize("precision", [p for p in PRECISIONS if p != "int4"])
def test_every_graph_of_every_precision_builds_into_a_portable_rtx_engine(tiny_fp32, tmp_path,
                                                                          precision):
    """fp32 to fp8 (int4: the command line's test, at batch 2): Helium (its frames axis in a
    profile) and the depformer build for RTX 30, 40 and 50 (fp8 for 40 and 50 only, the
    generations with fp8); the codec, fp32 in every precision (the same files, checked), is
    built with the fp32 model."""
    from personaplex_edge.runtime.backends.trt_build import build_engines

    model = _convert(tiny_fp32, tmp_path / precision, precision)
    manifest = load_model_dir(model)
    if precision == "fp32":
        names = CODEC + LM
    else:
        names = LM
        for name in CODEC:
            assert manifest.graphs[name].sha256 == load_model_dir(tiny_fp32).graphs[name].sha256
    said = []
    setup = _setup([manifest.graphs[n].precision for n in names])
    targets = ("8.9", "12.0") if precision == "fp8" else ("8.6", "8.9", "12.0")
    assert setup.targets == targets and setup.device is None
    write_manifest(model, build_engines(model, manifest, names, setup=setup,
                                        progress=said.append))
    sizes = _check_engines(model, names, targets)
    for name in names:
        (line,) = [s for s in said if s.startswith(f"  {name}.engine: built in")]
        assert f"TensorRT for RTX {tensorrt_rtx.__version__}" in line, line
        assert f"engine {sizes[name] / 1e6:.1f} MB" in line, line


def _tamper_top_k(src: Path, dst: Path) -> None:
    """Helium's graph with its TopK's K taken from the text_top_k input: sampling as it would be
    exported if K followed the user's top_k."""
    import onnx
    from onnx import helper

    shutil.copytree(src, dst)
    path = dst / "helium_step.onnx"
    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    (top_k,) = [n for n in g.node if n.op_type == "TopK"]
    g.initializer.append(onnx.numpy_helper.from_array(
        __import__("numpy").array([1], "int64"), "tampered_k_shape"))
    g.node.append(helper.make_node("Reshape", ["text_top_k", "tampered_k_shape"],
                                   ["tampered_k"]))
    top_k.input[1] = "tampered_k"
    onnx.save(model, str(path))  # the weights stay in helium_step.onnx.data


def test_no_sampling_value_is_a_shape_a_graph_where_one_is_is_refused(tiny_fp32, tmp_path):
    """The export samples over a fixed K_max with a runtime mask (export/sampling.py), so no
    input of any graph feeds a shape: every build above passed the check, and here the real
    parser marks every input of every graph a plain tensor. A graph whose top_k drives TopK's K
    - a shape tensor to TensorRT, a new shape for every value - is refused, naming the input."""
    from personaplex_edge.runtime.backends.trt_build import (EngineBuildError, build_engine,
                                                             shape_inputs)

    trt = tensorrt_rtx
    model = tiny_fp32  # sampling is the same graph in every precision
    for entry in load_model_dir(model).graphs.values():
        logger = trt.Logger(trt.Logger.ERROR)
        network = trt.Builder(logger).create_network(
            1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        assert trt.OnnxParser(network, logger).parse_from_file(str(model / entry.file))
        assert shape_inputs(network) == [], entry.file
    _tamper_top_k(model, tmp_path / "tampered")
    with pytest.raises(EngineBuildError, match="helium_step.onnx: text_top_k feeds a shape "
                                               "computation.*export the model again"):
        build_engine(tmp_path / "tampered" / "helium_step.onnx", tmp_path / "h.engine", "fp32",
                     _setup(["fp32"]), progress=lambda s: None)
    assert not (tmp_path / "h.engine").exists()


def test_what_tensorrt_cannot_parse_or_build_fails_with_its_own_message(tiny_fp32, tmp_path):
    """The parser's words for an op it does not know, the builder's for a GPU generation a
    graph cannot run on: Turing has no float32 matrix products in TensorRT for RTX, which is
    why --targets 7.5 is refused before any build (the next test) - should a release build
    them, this fails and the refusal is to be looked at again."""
    import onnx
    from onnx import TensorProto, helper

    from personaplex_edge.runtime.backends.trt_build import (BuildSetup, EngineBuildError,
                                                             build_engine)
    from personaplex_edge.runtime.backends.trt_library import load_library

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"])], "g", [x], [y])
    bad = tmp_path / "unknown.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(bad))
    with pytest.raises(EngineBuildError, match="cannot parse unknown.onnx:\n.*NoSuchOp"):
        build_engine(bad, tmp_path / "u.engine", "fp32", _setup(["fp32"]),
                     progress=lambda s: None)
    turing = BuildSetup(load_library(RTX), ("7.5",))  # past build_targets, which refuses it
    with pytest.raises(EngineBuildError, match="could not build an engine for depformer_step"
                                               ".onnx:\n.*Turing \\(SM75\\): FP32 GEMM is "
                                               "not supported"):
        build_engine(tiny_fp32 / "depformer_step.onnx", tmp_path / "d.engine", "fp32", turing,
                     progress=lambda s: None)
    assert not list(tmp_path.glob("*.engine")) and not list(tmp_path.glob(".*partial"))


def test_turing_is_refused_before_any_build_naming_why_and_what_builds(tiny_fp32, tmp_path,
                                                                        capsys):
    """--targets 7.5 (alone or beside others) on `engines` and on `export --backend tensorrt`:
    one line, exit 2, before a graph is built (the export's before its checkpoint is even
    looked at): Turing has no float32 matrix products in TensorRT for RTX and every graph has
    some (the test above shows the builder's own words), so it names the targets that build
    and mainline TensorRT for the card. Nothing is written."""
    from personaplex_edge.cli import main

    model = tmp_path / "model"
    shutil.copytree(tiny_fp32, model)
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    for targets, fix in (("7.5", "build for 8.6, 8.9, 12.0 (RTX 30, 40, 50: the default)"),
                         ("7.5,8.6", "leave 7.5 out (--targets 8.6)")):
        assert main(["engines", "--model", str(model), "--library", "rtx", "--targets",
                     targets]) == 2
        err = capsys.readouterr().err
        assert err.startswith("personaplex-edge: error: --targets 7.5: TensorRT for RTX has no "
                              "float32 matrix products on Turing"), err
        assert fix in err and "mainline TensorRT (--library tensorrt" in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no stage left

    out = tmp_path / "exported"
    assert main(["export", "--checkpoint", str(tmp_path / "no-such-checkpoint"), "--out",
                 str(out), "--backend", "tensorrt", "--library", "rtx", "--targets", "7.5"]) == 2
    err = capsys.readouterr().err
    assert "--targets 7.5: TensorRT for RTX has no float32 matrix products" in err, err
    assert not out.exists()


def test_auto_on_a_machine_without_a_gpu_builds_with_rtx_though_mainline_is_installed(
        tiny_fp32, tmp_path, capsys, monkeypatch):
    """Both libraries importable (mainline TensorRT the simulated one: its PyPI libraries are
    stubs here), no GPU cuda-python can use (it says what this machine's says: the driver is
    insufficient): --library auto builds with TensorRT for RTX - mainline TensorRT builds only
    on the GPU it builds for - and says why; --library tensorrt is one message naming
    --library rtx; with mainline TensorRT alone, auto's refusal names --library rtx and its
    install line. Nothing is written by a refusal."""
    import fake_gpu

    from personaplex_edge.cli import main
    from personaplex_edge.runtime.backends import cuda_runtime

    model = tmp_path / "model"
    shutil.copytree(tiny_fp32, model)
    gpuless = fake_gpu.FakeCuda()
    gpuless.cudaGetDeviceCount = lambda: (gpuless.cudaError_t.cudaErrorInsufficientDriver, 0)
    monkeypatch.setattr(cuda_runtime, "cudart", lambda: gpuless)
    mainline = fake_gpu.fake_tensorrt(gpuless, model)
    monkeypatch.setitem(sys.modules, "tensorrt", mainline)
    assert main(["engines", "--model", str(model), "--graphs", "helium_step"]) == 0
    out = capsys.readouterr().out
    assert ("--library auto took TensorRT for RTX: mainline TensorRT is installed too, but it "
            "builds only on the GPU it builds for, and this machine has none it can use") in out
    _check_engines(model, ["helium_step"], ("8.6", "8.9", "12.0"))
    assert mainline.builds == []

    before = {p.name: p.read_bytes() for p in model.iterdir()}
    refusals = ((["--library", "tensorrt"], {}),
                ([], {"tensorrt_rtx": None}))  # mainline TensorRT alone
    for flags, modules in refusals:
        with monkeypatch.context() as m:
            for name, module in modules.items():
                m.setitem(sys.modules, name, module)
            assert main(["engines", "--model", str(model), *flags]) == 2
        err = capsys.readouterr().err
        assert f"TensorRT {mainline.__version__} builds engines only on the GPU they are for, " \
               "and this machine has none it can use (cudaGetDeviceCount failed" in err, err
        assert "Build portable engines for RTX GPUs here with --library rtx (pip install " \
               "'personaplex-edge[rtx]'" in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    with monkeypatch.context() as m:  # --targets: TensorRT for RTX's, whatever else is here
        m.setitem(sys.modules, "tensorrt_rtx", None)
        assert main(["engines", "--model", str(model), "--targets", "8.9"]) == 2
    err = capsys.readouterr().err
    assert "--targets are TensorRT for RTX's: TensorRT for RTX cannot be used here" in err, err
    assert mainline.builds == [] and {p.name: p.read_bytes() for p in model.iterdir()} == before


def test_a_user_exports_and_builds_rtx_engines_from_the_command_line(tiny_fp32, stt_checkpoints,
                                                                     tmp_path, capsys,
                                                                     monkeypatch):
    """With TensorRT for RTX the only TensorRT: `export --backend tensorrt --batch 2
    --transcriber STT` builds the five engines in the same run (--library auto finds it), the
    transcriber's step among them; the pair the say path links on the device agrees in
    TensorRT's own eyes (each tensor the depformer reads from Helium has, in the parsed
    networks, the dtype and shape Helium writes); `engines --model DIR --graphs .. --targets`
    rebuilds the depformer's and the transcriber's for other GPUs; weightless engines, which
    TensorRT for RTX builds only on a machine with a GPU, and fp8 asked for a target below 8.9
    are one message each, exit 2, nothing written."""
    from personaplex_edge.cli import main
    from personaplex_edge.contract import HIDDEN, TEXT_TOKEN, TRANSCRIBER_STEP

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # mainline TensorRT not installed
    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    ckpt, stt = stt_checkpoints
    out = tmp_path / "int4"
    assert main(["export", "--checkpoint", str(ckpt), "--transcriber", str(stt), "--out",
                 str(out), "--backend", "tensorrt", "--precision", "int4", "--batch", "2"]) == 0
    said = capsys.readouterr().out
    assert "engines will be built with TensorRT for RTX" in said and "no GPU needed" in said
    _check_engines(out, CODEC + LM + [TRANSCRIBER_STEP], ("8.6", "8.9", "12.0"))
    manifest = load_model_dir(out)
    assert manifest.graphs[TRANSCRIBER_STEP].precision == "int4"
    for name in ("helium_step", TRANSCRIBER_STEP):
        assert manifest.graphs[name].inputs[0].shape[0] == 2

    trt = tensorrt_rtx
    tensors = {}
    for graph in LM:
        logger = trt.Logger(trt.Logger.ERROR)
        network = trt.Builder(logger).create_network(
            1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        assert trt.OnnxParser(network, logger).parse_from_file(str(out / f"{graph}.onnx"))
        ends = ([network.get_output(i) for i in range(network.num_outputs)] if graph ==
                "helium_step" else [network.get_input(i) for i in range(network.num_inputs)])
        tensors[graph] = {t.name: (t.dtype, tuple(t.shape)) for t in ends}
    for name in (HIDDEN, TEXT_TOKEN):
        assert tensors["helium_step"][name] == tensors["depformer_step"][name], name
        assert tensors["helium_step"][name][1][0] == 2

    assert main(["engines", "--model", str(out), "--graphs",
                 f"depformer_step,{TRANSCRIBER_STEP}", "--targets", "8.9,12.1"]) == 0
    assert f"engines for depformer_step, {TRANSCRIBER_STEP}" in capsys.readouterr().out
    _check_engines(out, ["depformer_step", TRANSCRIBER_STEP], ("8.9", "12.1"))

    import fake_gpu

    from personaplex_edge.runtime.backends import cuda_runtime

    gpuless = fake_gpu.FakeCuda()  # a machine without a GPU, whatever this one has
    gpuless.cudaGetDeviceCount = lambda: (gpuless.cudaError_t.cudaErrorNoDevice, 0)
    with monkeypatch.context() as m:
        m.setattr(cuda_runtime, "cudart", lambda: gpuless)
        assert main(["engines", "--model", str(out), "--weightless"]) == 2
    err = capsys.readouterr().err
    assert "--weightless: TensorRT for RTX" in err and "only on a machine with an NVIDIA GPU" in err

    fp8 = _convert(tiny_fp32, tmp_path / "fp8", "fp8")
    before = sorted(p.name for p in fp8.iterdir())
    assert main(["engines", "--model", str(fp8), "--targets", "8.6,8.9"]) == 2
    err = capsys.readouterr().err
    assert "fp8 needs compute capability 8.9 or newer; --targets include 8.6" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert sorted(p.name for p in fp8.iterdir()) == before  # no engine, no stage left
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
