"""TensorRT engines and the GPU backends.

Without a GPU only the parts that need none run: the engine record and its refusal, and the
backends' host-side plumbing on a simulated GPU (tests/fake_gpu.py, the `test_simulated_*`
tests, with mainline TensorRT's calls or TensorRT for RTX's: buffer sizes, addresses, copy
geometry, ping-pong, ring positions, capture and replay, validity checks and the JIT's runtime
cache - never CUDA or TensorRT themselves). Everything that needs CUDA and TensorRT skips with
the reason; scripts/gpu_check.sh runs the same paths at full size on a GPU machine. The engine
build is tests/test_trt_build.py (its plumbing) and tests/test_rtx_engines.py (real builds).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from ci_parts import not_installable

from personaplex_edge.config import preset
from personaplex_edge.errors import ModelDirError
from personaplex_edge.manifest import RingSpec, load_model_dir
from personaplex_edge.contract import EngineSpec
from personaplex_edge.runtime.backends.trt_engine import check_compatible, engine_spec


def _gpu_reason() -> str | None:
    """None when CUDA (through cuda-python) and a TensorRT (mainline, or TensorRT for RTX on an
    RTX card) are usable, else why not."""
    from personaplex_edge.errors import PersonaPlexError
    from personaplex_edge.runtime.backends.cuda_runtime import device_info, gpu_available
    from personaplex_edge.runtime.backends.trt_library import load_library, unsupported_gpu

    ok, why = gpu_available()
    if not ok:
        return f"no usable CUDA device: {why}"
    try:
        info = device_info(0)
        unsupported_gpu(load_library(None), info.compute_capability, info.name)
    except PersonaPlexError as e:
        return f"no TensorRT for this GPU: {e}"
    return None


needs_gpu = pytest.mark.skipif(_gpu_reason() is not None,
                               reason=not_installable(str(_gpu_reason())))

SPEC = EngineSpec("helium_step.engine", "0" * 64, "10.8.0.43", "9.0", "NVIDIA H200", "fp16",
                  12.5)


# ---- no GPU needed ------------------------------------------------------------------------------

def test_engine_spec_round_trip_and_manifest_record(tmp_path):
    from personaplex_edge.manifest import GraphEntry

    assert EngineSpec.from_dict(json.loads(json.dumps(SPEC.to_dict()))) == SPEC
    entry = GraphEntry("helium_step.onnx", "x", [], [], engine=SPEC.to_dict())
    entry = GraphEntry.from_dict(json.loads(json.dumps(entry.to_dict())))  # as in manifest.json
    assert engine_spec(tmp_path, entry) == SPEC
    with pytest.raises(ModelDirError, match="has no TensorRT engine.*personaplex-edge engines"):
        engine_spec(tmp_path, GraphEntry("depformer_step.onnx", "x", [], []))


def test_engine_from_another_tensorrt_or_gpu_is_refused():
    check_compatible(SPEC, "10.8.0.43", "9.0", "NVIDIA H200", "m")  # the same: fine
    with pytest.raises(ModelDirError) as e:
        check_compatible(SPEC, "10.9.0.34", "8.7", "Orin", "/models/pp")
    message = str(e.value)
    assert "TensorRT 10.8.0.43 built it, this is 10.9.0.34" in message
    assert "compute capability 9.0 (NVIDIA H200), this GPU is 8.7 (Orin)" in message
    assert "personaplex-edge engines --model /models/pp" in message
    with pytest.raises(ModelDirError, match="compute capability"):
        check_compatible(SPEC, "10.8.0.43", "8.9", "RTX 4090", "m")


def test_engine_from_another_gpu_of_the_same_compute_capability_is_refused():
    """H100 and H200 are both 9.0: the GPU's name and memory size tell them apart."""
    h200 = dataclasses.replace(SPEC, device_memory=141 << 30)
    check_compatible(h200, "10.8.0.43", "9.0", "NVIDIA H200", "m", device_memory=141 << 30)
    with pytest.raises(ModelDirError) as e:
        check_compatible(h200, "10.8.0.43", "9.0", "NVIDIA H100 80GB HBM3", "/models/pp",
                         device_memory=80 << 30)
    message = str(e.value)
    assert "built on a NVIDIA H200 (141 GiB), this is a NVIDIA H100 80GB HBM3 (80 GiB)" in message
    assert message.endswith("personaplex-edge engines --model /models/pp")
    # one name, two memory sizes (Jetson AGX Orin 32 GB and 64 GB both call themselves "Orin");
    # a few hundred MB reserved differently by a board's firmware is the same GPU
    orin = dataclasses.replace(SPEC, compute_capability="8.7", device_name="Orin",
                               device_memory=64 << 30)
    check_compatible(orin, "10.8.0.43", "8.7", "Orin", "m", device_memory=(64 << 30) - (300 << 20))
    with pytest.raises(ModelDirError, match=r"Orin \(64 GiB\), this is a Orin \(31 GiB\)"):
        check_compatible(orin, "10.8.0.43", "8.7", "Orin", "m", device_memory=31 << 30)
    # engines recorded before the memory size was: the name alone decides
    check_compatible(SPEC, "10.8.0.43", "9.0", "NVIDIA H200", "m", device_memory=141 << 30)


class _FakeDevice:
    """Device memory as one numpy byte array; pointers are offsets into it (+ a base, so that
    0 is never valid)."""

    BASE = 1 << 20

    def __init__(self):
        self.mem = np.zeros(1 << 20, np.uint8)
        self.top = 0

    def malloc(self, nbytes):
        ptr, self.top = self.top, self.top + ((nbytes + 255) // 256) * 256
        return self.BASE + ptr

    def view(self, ptr, nbytes):
        return self.mem[ptr - self.BASE:ptr - self.BASE + nbytes]

    def copy_rows(self, dst, dpitch, src, spitch, width, rows, stream):
        for r in range(rows):  # what cudaMemcpy2D does
            self.view(dst + r * dpitch, width)[:] = self.view(src + r * spitch, width)


def _fake_ring_device(monkeypatch):
    """device_rings on simulated device memory (a numpy byte array; no CUDA): returns
    (device, the list of 2D copies made, a Stream, array(ptr, shape, dtype) -> a view)."""
    from personaplex_edge.runtime.backends import device_rings

    dev = _FakeDevice()
    copies = []

    class Buffer:
        def __init__(self, nbytes):
            self.nbytes, self.ptr = nbytes, dev.malloc(nbytes)

    def copy_rows(*args):
        copies.append(args)
        dev.copy_rows(*args[:7])

    monkeypatch.setattr(device_rings, "DeviceBuffer", Buffer)
    monkeypatch.setattr(device_rings, "copy_rows", copy_rows)
    monkeypatch.setattr(device_rings, "fill_zero",
                        lambda ptr, n, stream: dev.view(ptr, n).fill(0))

    class Stream:
        def synchronize(self):
            pass

    def array(ptr, shape, dtype):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return dev.view(ptr, n).view(dtype).reshape(shape)

    return dev, copies, Stream(), array


def _ring_specs(B):
    # Helium-like rings (1 row per call, position an input) and Mimi-like ones (2 rows per
    # call, position a state tensor), in one graph
    specs = [RingSpec(f"past_key_values.{i}.{k}", f"present.{i}.{k}", (B, 3, 5, 4), "float16")
             for i in range(3) for k in ("key", "value")]
    specs += [RingSpec(f"past.kv{i}", f"rows.kv{i}", (B, 2, 7, 8), "float32", 2, "past.offset",
                       2) for i in range(2)]
    return specs


def _cpu_reference(spec, ring, rows, positions, active):
    """What the CPU backend does (state.write_ring_rows)."""
    from personaplex_edge.runtime.backends.state import write_ring_rows

    write_ring_rows(spec, ring, rows, positions, active)


def test_simulated_gpu_one_strided_copy_writes_every_ring_in_place(monkeypatch):
    """Host-side plumbing on simulated device memory: DeviceRings' address arithmetic. With
    every row at one position, row r of every ring's output lands at slot (p + r) % T of that
    ring - one strided copy for all rings alike - exactly as the CPU backend puts it, and
    nothing else changes."""
    from personaplex_edge.runtime.backends import device_rings

    dev, copies, stream, array = _fake_ring_device(monkeypatch)
    rng = np.random.default_rng(0)
    specs = _ring_specs(1)
    rings = device_rings.DeviceRings(specs, stream)
    assert len(rings._groups) == 2
    # TensorRT takes only 256-byte aligned tensor addresses: the rings of a group are padded
    # apart (these rows are 8 and 64 bytes long) and still share one copy
    for ptr in (*rings.ring_ptr.values(), *rings.row_ptr.values()):
        assert ptr % 256 == 0, ptr
    expect = {s.input_name: np.zeros(s.shape, np.dtype(s.dtype)) for s in specs}
    for step, (position, offset) in enumerate([(0, 0), (1, 2), (4, 4), (7, 6), (9, 12)]):
        positions = {"position": np.array([position]), "past.offset": np.array([offset])}
        for s in specs:
            rows = rng.standard_normal(s.rows_shape).astype(s.dtype)
            array(rings.row_ptr[s.output_name], s.rows_shape, s.dtype)[...] = rows
            _cpu_reference(s, expect[s.input_name], rows, positions[s.position], [0])
        copies.clear()
        rings.write(positions, stream)
        assert len(copies) == 1 + 2  # one copy for all six 1-row rings, one per row for Mimi's
        for s in specs:
            np.testing.assert_array_equal(
                array(rings.ring_ptr[s.input_name], s.shape, s.dtype), expect[s.input_name],
                err_msg=f"{s.input_name} after call {step}")


def test_simulated_gpu_rows_of_a_batch_go_to_their_own_slots(monkeypatch):
    """Host-side plumbing on simulated device memory: batch rows at different positions (a
    lockstep batch) each get their new rows at their own slot, a row left out of `active` is
    not written at all, and the result equals the CPU backend's."""
    from personaplex_edge.runtime.backends import device_rings

    dev, copies, stream, array = _fake_ring_device(monkeypatch)
    rng = np.random.default_rng(1)
    B = 3
    specs = _ring_specs(B)
    rings = device_rings.DeviceRings(specs, stream)
    expect = {s.input_name: np.zeros(s.shape, np.dtype(s.dtype)) for s in specs}
    calls = [([0, 3, 9], [0, 4, 2], None), ([1, 4, 10], [2, 6, 4], [0, 2]),
             ([2, 4, 11], [4, 6, 6], [0, 1, 2]), ([5, 5, 5], [8, 8, 8], [1])]
    for step, (position, offset, active) in enumerate(calls):
        positions = {"position": np.array(position), "past.offset": np.array(offset)}
        for s in specs:
            rows = rng.standard_normal(s.rows_shape).astype(s.dtype)
            array(rings.row_ptr[s.output_name], s.rows_shape, s.dtype)[...] = rows
            _cpu_reference(s, expect[s.input_name], rows, positions[s.position],
                           range(B) if active is None else active)
        rings.write(positions, stream, active)
        for s in specs:
            np.testing.assert_array_equal(
                array(rings.ring_ptr[s.input_name], s.shape, s.dtype), expect[s.input_name],
                err_msg=f"{s.input_name} after call {step}")


def test_simulated_gpu_ring_positions_come_from_inputs_or_mirrored_state(monkeypatch):
    """Host-side plumbing (pinned memory and the device copy simulated): each batch row's ring
    position comes from an input, or from a state tensor mirrored to the host after a run and
    on sync."""
    from personaplex_edge.manifest import GraphEntry, StateSpec
    from personaplex_edge.runtime.backends import device_rings

    class Pinned:
        def __init__(self, shape, dtype):
            self.array, self.ptr = np.zeros(shape, dtype), 0

        def close(self):
            pass

    device = {1000: np.array([3, 5], np.int64), 2000: np.array([8, 1], np.int64)}

    def copy_to_host(host, src, stream, ptr=None):
        host[...] = device[src]

    class Stream:
        def synchronize(self):
            pass

    monkeypatch.setattr(device_rings, "PinnedArray", Pinned)
    monkeypatch.setattr(device_rings, "copy_to_host", copy_to_host)
    entry = GraphEntry("g.onnx", "x", [], [], [StateSpec("offset", (2,), "int64", 3.0)],
                       rings=[RingSpec("a", "b", (2, 1, 4, 2), "float32", 2, "past.offset", 2),
                              RingSpec("c", "d", (2, 1, 4, 2), "float32", 2, "position")])
    inputs = {"position": np.array([11, 4], np.int64)}
    pos = device_rings.RingPositions(entry, inputs, np.dtype)
    pos.sync({"offset": 1000}, Stream())
    now = pos.now()
    assert now["past.offset"].tolist() == [3, 5] and now["position"].tolist() == [11, 4]
    pos.after_run({"offset": 2000}, Stream())
    inputs["position"][0] = 12
    now = pos.now()
    assert now["past.offset"].tolist() == [8, 1] and now["position"].tolist() == [12, 4]
    with pytest.raises(ValueError, match="neither an input nor a state"):
        device_rings.RingPositions(GraphEntry("g.onnx", "x", [], [], rings=[
            RingSpec("a", "b", (1, 1, 4, 2), "float32", 2, "past.nothing")]), {}, np.dtype)


def test_onnxruntime_gpu_provider_options_are_documented_ones():
    """The provider options onnxruntime-gpu's Python API takes (an unknown one makes the
    provider fail to register): the stream as a decimal address, flags as strings."""
    from personaplex_edge.runtime.backends.ort_cuda import cuda_providers

    class Stream:
        handle = 140245000000512

    providers = cuda_providers(Stream(), 1, tensorrt=True, cuda_graph=True, trt_cache="/c")
    assert [p if isinstance(p, str) else p[0] for p in providers] == [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    trt, cuda = providers[0][1], providers[1][1]
    assert cuda == {"device_id": "1", "user_compute_stream": "140245000000512",
                    "enable_cuda_graph": "1"}
    assert set(trt) == {"device_id", "user_compute_stream", "trt_timing_cache_enable",
                        "trt_engine_cache_enable", "trt_engine_cache_path",
                        "trt_timing_cache_path", "trt_cuda_graph_enable"}
    assert all(isinstance(v, str) for v in (*trt.values(), *cuda.values()))


def test_without_cuda_python_or_a_usable_driver_the_error_says_what_to_do(monkeypatch):
    """gpu_available() without cuda-python names the package to install; with a cuda-python
    newer than the driver (CUDA's insufficient-driver error, what a CUDA 13 cuda-python gives
    on JetPack 6) it names the version mismatch."""
    import fake_gpu

    from personaplex_edge.runtime.backends import cuda_runtime

    def missing():
        raise cuda_runtime.CudaError(cuda_runtime._INSTALL)

    monkeypatch.setattr(cuda_runtime, "cudart", missing)
    ok, why = cuda_runtime.gpu_available()
    assert not ok and "pip install 'cuda-python" in why

    cuda = fake_gpu.FakeCuda()
    cuda.cudaGetDeviceCount = lambda: (cuda.cudaError_t.cudaErrorInsufficientDriver, 0)
    monkeypatch.setattr(cuda_runtime, "cudart", lambda: cuda)
    ok, why = cuda_runtime.gpu_available()
    assert not ok and why.startswith("cudaGetDeviceCount failed")
    assert "cuda-python's major version matches the driver's CUDA" in why


# ---- the GPU backends' host logic on a simulated GPU (tests/fake_gpu.py) -----------------------

@pytest.fixture(scope="module")
def tiny_fp32(tiny_export) -> Path:
    return tiny_export


@pytest.fixture
def simulated(tiny_fp32, tmp_path, monkeypatch):
    """A copy of the tiny model with simulated engines, cuda-python and TensorRT patched."""
    import fake_gpu

    return fake_gpu.simulated_copy(tiny_fp32, tmp_path / "model", monkeypatch)


def test_simulated_gpu_trt_backend_runs_the_lm_like_onnxruntime(simulated):
    """Host-side plumbing on the simulated GPU (engines are onnxruntime CPU sessions): greedy
    frames through TrtGraph (device buffers, one 2D copy per ring write, positions
    from the input) equal OrtGraph's on the CPU, past the ring's wrap (context 40)."""
    from lm_probe import GreedyLM

    model, cuda = simulated
    manifest = load_model_dir(model)
    user = np.random.default_rng(3).integers(0, 2048, (50, 8))
    cpu = GreedyLM(model, manifest, device="cpu", threads=1).run(user)
    gpu = GreedyLM(model, dataclasses.replace(manifest, backend="tensorrt")).run(user)
    np.testing.assert_array_equal(gpu.tokens, cpu.tokens)
    # the simulated engines are CPU sessions on every core, the reference one thread: the same
    # arithmetic up to how the kernels split it, so rounding may differ; tokens may not
    np.testing.assert_allclose(gpu.hidden, cpu.hidden, rtol=1e-5, atol=1e-5)
    assert cuda.copies_2d == 50  # all 4 rings of helium in one copy per frame


def test_simulated_gpu_trt_backend_runs_the_codec_like_onnxruntime(simulated):
    """Host-side plumbing on the simulated GPU: Mimi's graphs (ping-pong state, rings of 2 rows per call whose position is a state
    tensor mirrored to the host) through TrtGraph equal OrtGraph, past the ring's wrap; state()
    / set_state() / reset() round-trip through the device."""
    from personaplex_edge.runtime.backends.ort import OrtModelGraph
    from personaplex_edge.runtime.backends.trt import TrtEngine

    model, _ = simulated
    manifest = load_model_dir(model)
    rng = np.random.default_rng(0)
    pcm = (rng.standard_normal((30, *manifest.graphs["mimi_encoder"].inputs[0].shape)) * 0.1
           ).astype(np.float32)
    graphs = {}
    for kind, make in (("cpu", lambda e: OrtModelGraph(model, e).bind()),
                       ("gpu", lambda e: TrtEngine(model, manifest, e).bind())):
        enc, dec = make(manifest.graphs["mimi_encoder"]), make(manifest.graphs["mimi_decoder"])
        graphs[kind] = (enc, dec)
    out = {}
    for kind, (enc, dec) in graphs.items():
        codes, audio = [], []
        for frame in pcm:
            enc.inputs["pcm"][...] = frame
            codes.append(enc.run()["codes"].copy())
            dec.inputs["codes"][...] = codes[-1]
            audio.append(dec.run()["pcm"].copy())
        out[kind] = (np.array(codes), np.array(audio))
    np.testing.assert_array_equal(out["gpu"][0], out["cpu"][0])
    np.testing.assert_allclose(out["gpu"][1], out["cpu"][1], rtol=1e-5, atol=1e-5)

    enc_cpu, enc_gpu = graphs["cpu"][0], graphs["gpu"][0]
    saved = enc_gpu.state()
    for name, value in enc_cpu.state().items():  # rings included
        np.testing.assert_array_equal(saved[name], value, err_msg=name)
    enc_gpu.inputs["pcm"][...] = pcm[0]
    after = enc_gpu.run()["codes"].copy()
    enc_gpu.set_state(saved)
    np.testing.assert_array_equal(enc_gpu.run()["codes"], after)  # same state, same result
    enc_gpu.reset()
    enc_cpu.reset()
    for kind, enc in (("cpu", enc_cpu), ("gpu", enc_gpu)):
        enc.inputs["pcm"][...] = pcm[0]
    np.testing.assert_array_equal(enc_gpu.run()["codes"], enc_cpu.run()["codes"])


def test_simulated_gpu_captured_frame_replays_like_eager_runs(simulated):
    """Host-side plumbing on the simulated GPU (a capture records the queued work, a launch
    replays it; no CUDA graph is made): helium + depformer linked on the device and captured as one graph (ring write queued
    after each replay) give the eager tokens; a stateful graph (the encoder) captures both
    ping-pong parities and alternates them."""
    from personaplex_edge.runtime.backends.cuda_graphs import CapturedSequence
    from lm_probe import GreedyLM, linked_frame
    from personaplex_edge.runtime.backends.trt import TrtEngine
    from personaplex_edge.streams import TokenRing

    model, cuda = simulated
    manifest = load_model_dir(model)
    user = np.random.default_rng(4).integers(0, 2048, (45, 8))
    eager = GreedyLM(model, dataclasses.replace(manifest, backend="tensorrt")).run(user).tokens

    helium, depformer = linked_frame(model, manifest)
    seq = CapturedSequence([helium, depformer])
    ring, tokens = TokenRing(manifest.config), []
    for codes in user:
        ring.write_user(codes[None])
        helium.inputs["tokens"][...] = ring.step_input()
        helium.inputs["position"][...] = ring.position
        seq.launch()
        seq.synchronize()
        tokens.append([helium.outputs["text_token"][0], *depformer.outputs["audio_tokens"][0]])
        ring.write_generated(np.array(tokens[-1][:1]), np.array(tokens[-1][1:])[None])
    np.testing.assert_array_equal(np.array(tokens), eager)
    assert cuda.launches == len(user)

    enc = TrtEngine(model, manifest, manifest.graphs["mimi_encoder"]).bind()
    ref = TrtEngine(model, manifest, manifest.graphs["mimi_encoder"]).bind()
    seq = CapturedSequence([enc])
    assert set(seq._execs) == {0, 1}
    pcm = np.random.default_rng(1).standard_normal((20, *enc.inputs["pcm"].shape)) * 0.1
    for frame in pcm:
        enc.inputs["pcm"][...] = ref.inputs["pcm"][...] = frame
        seq.run()
        np.testing.assert_array_equal(enc.outputs["codes"], ref.run()["codes"])


def test_simulated_gpu_fp16_graphs_with_narrow_kv_rows(tiny_fp32, tmp_path, monkeypatch):
    """Host-side plumbing on the simulated GPU (which holds to TensorRT's 256-byte address
    rule; the fp16 arithmetic is onnxruntime's): the tiny fp16 graphs' K/V rows are 128 bytes per ring, so rings packed end to end would
    put every other row output at an address TensorRT refuses; padded, the engine takes them
    and the tokens equal onnxruntime's on the CPU."""
    import fake_gpu

    from personaplex_edge.export.precision import convert_model_dir
    from lm_probe import GreedyLM

    model = tmp_path / "fp16"
    convert_model_dir(tiny_fp32, model, "fp16", backend="tensorrt", progress=lambda s: None)
    cuda = fake_gpu.install(monkeypatch, model)
    manifest = load_model_dir(model)
    ring = manifest.graphs["helium_step"].rings[0]
    assert ring.dtype == "float16" and np.prod(ring.rows_shape) * 2 % 256 != 0
    user = np.random.default_rng(5).integers(0, 2048, (45, 8))
    cpu = GreedyLM(model, dataclasses.replace(manifest, backend="onnx"), device="cpu",
                   threads=1).run(user)
    gpu = GreedyLM(model, manifest).run(user)
    np.testing.assert_array_equal(gpu.tokens, cpu.tokens)
    assert cuda.copies_2d == len(user)  # still one copy for all of helium's rings


def test_simulated_gpu_device_memory_is_freed_by_close_and_by_dropping_a_model(simulated):
    """Host-side plumbing on simulated device memory: a voice assistant that reloads its model
    must not leak GPU memory. Model.close() frees the device buffers at once and a closed
    model's conversation refuses to run; a model merely dropped frees everything when it is
    collected; an output the caller still holds stays readable (its pinned buffer goes with the
    last view, not under it)."""
    import gc

    from personaplex_edge.errors import PersonaPlexError
    from personaplex_edge.manifest import write_manifest
    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.sampling import SamplingParams

    model, cuda = simulated
    write_manifest(model, dataclasses.replace(load_model_dir(model), backend="tensorrt"))
    idle = len(cuda._memory)
    pcm = np.zeros(1920, np.float32)
    loaded = Model.load(model)
    conv = loaded.open_conversation(SamplingParams(greedy=True), Persona(enabled=False))
    for _ in range(3):
        audio, _ = conv.step(pcm)
    running = len(cuda._memory)
    assert running > idle + 20  # rings, state, inputs, outputs of four graphs
    kept = audio.copy()
    loaded.close()
    assert len(cuda._memory) < idle + (running - idle) // 2  # device buffers gone at once
    with pytest.raises(PersonaPlexError, match="closed"):
        loaded.open_conversation()
    del loaded, conv
    gc.collect()
    np.testing.assert_array_equal(audio, kept)  # still readable: its buffer is still held
    assert 0 < len(cuda._memory) - idle <= 2
    del audio
    gc.collect()
    assert len(cuda._memory) == idle

    loaded = Model.load(model)
    loaded.open_conversation(SamplingParams(greedy=True), Persona(enabled=False)).step(pcm)
    del loaded
    gc.collect()
    assert len(cuda._memory) == idle


def test_simulated_gpu_gpu_check_stages(simulated, tmp_path, monkeypatch):
    """Host-side plumbing on the simulated GPU: scripts/gpu/gpu_check.py's TensorRT stages - engine build, eager and captured LM frames,
    codec - on the simulated GPU: each prints ms/frame and compares with onnxruntime CPU
    (agreement 100 % here: the simulated engines are onnxruntime CPU sessions)."""
    import importlib.util

    model, _ = simulated
    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", path)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    monkeypatch.setattr(gpu_check, "TIMINGS", [])

    assert "helium_step.engine" in gpu_check.engines(model, ["helium_step", "depformer_step",
                                                             "mimi_encoder", "mimi_decoder"])
    user = np.random.default_rng(7).integers(0, 2048, (25, 8))
    assert "ms/frame" in gpu_check.time_lm("m", model, "ort-cpu", user, None)
    ref = gpu_check.TIMINGS[-1]["tokens"]
    for backend in ("trt", "trt-graph"):
        line = gpu_check.time_lm("m", model, backend, user, ref)
        assert "ms/frame" in line and "text 100.0% audio 100.0%" in line, line
    assert "codes equal" not in gpu_check.time_codec("c", model, "ort-cpu", frames=8)
    line = gpu_check.time_codec("c", model, "trt", frames=8)
    assert "codes equal to ort-cpu: 100.0%" in line, line


def test_simulated_gpu_engine_record_and_tampering(simulated):
    """Host-side plumbing on the simulated GPU: an engine changed after its build, built by
    another TensorRT, missing, or never recorded is refused before it is deserialised, each
    naming the rebuild command."""
    from personaplex_edge.manifest import MANIFEST
    from personaplex_edge.runtime.backends.trt import TrtEngine

    model, _ = simulated
    entry = load_model_dir(model).graphs["depformer_step"]
    engine = model / "depformer_step.engine"
    built = engine.read_bytes()
    engine.write_bytes(built + b" ")  # changed after the build
    with pytest.raises(ModelDirError, match="'depformer_step.engine' does not match its sha256"):
        load_model_dir(model)
    engine.write_bytes(built)
    data = json.loads((model / MANIFEST).read_text())
    data["graphs"]["depformer_step"]["engine"]["tensorrt_version"] = "10.0.0"
    (model / MANIFEST).write_text(json.dumps(data))
    manifest = load_model_dir(model)
    with pytest.raises(ModelDirError, match="TensorRT 10.0.0 built it, this is 10.999.0.simulated"):
        TrtEngine(model, manifest, manifest.graphs["depformer_step"]).bind()
    engine.unlink()
    with pytest.raises(ModelDirError,
                       match="depformer_step.engine is missing.*personaplex-edge engines"):
        TrtEngine(model, manifest, entry).bind()  # entry: the record as built
    data["graphs"]["depformer_step"].pop("engine")
    (model / MANIFEST).write_text(json.dumps(data))
    manifest = load_model_dir(model)
    with pytest.raises(ModelDirError, match="has no TensorRT engine.*personaplex-edge engines"):
        TrtEngine(model, manifest, manifest.graphs["depformer_step"]).bind()


# ---- GPU --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_fp16_engines(tmp_path_factory):
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint
    from personaplex_edge.manifest import write_manifest
    from personaplex_edge.runtime.backends.trt_build import build_engines

    root = tmp_path_factory.mktemp("trt")
    ckpt = write_synthetic_checkpoint(preset("tiny"), root / "ckpt")
    export_model(resolve_checkpoint(str(ckpt)), root / "fp32", progress=lambda s: None)
    convert_model_dir(root / "fp32", root / "fp16", "fp16", backend="tensorrt",
                      progress=lambda s: None)
    manifest = build_engines(root / "fp16", progress=lambda s: None)
    write_manifest(root / "fp16", manifest)
    return root


@needs_gpu
def test_tensorrt_greedy_tokens_agree_with_onnxruntime_cpu(tiny_fp16_engines):
    from lm_probe import GreedyLM, agreement

    model = tiny_fp16_engines / "fp16"
    user = np.random.default_rng(1).integers(0, 2048, (60, 8))
    cpu_manifest = dataclasses.replace(load_model_dir(model), backend="onnx")
    cpu = GreedyLM(model, cpu_manifest, device="cpu", threads=1).run(user)
    gpu = GreedyLM(model, device="cuda").run(user, forced=cpu.tokens)
    a = agreement(gpu.tokens, cpu.tokens)
    assert a["text"] >= 0.95 and a["audio"] >= 0.9, a


@needs_gpu
def test_captured_frame_equals_eager(tiny_fp16_engines):
    from personaplex_edge.runtime.backends.cuda_graphs import CapturedSequence
    from lm_probe import linked_frame

    model = tiny_fp16_engines / "fp16"
    manifest = load_model_dir(model)

    def frames(capture: bool):
        helium, depformer = linked_frame(model, manifest)
        seq = CapturedSequence([helium, depformer]) if capture else None
        out = []
        for t in range(12):
            helium.inputs["tokens"][...] = (np.arange(17) * 7 + t) % 2048
            helium.inputs["position"][...] = t
            if capture:
                seq.launch()
            else:
                helium.enqueue()  # writes its K/V rows after the run
                depformer.enqueue()
            helium.stream.synchronize()
            out.append(np.concatenate([helium.outputs["text_token"],
                                       depformer.outputs["audio_tokens"][0]]))
        return np.array(out)

    np.testing.assert_array_equal(frames(capture=True), frames(capture=False))


@needs_gpu
def test_engine_of_another_gpu_is_refused_at_load(tiny_fp16_engines, tmp_path):
    import shutil

    from personaplex_edge.manifest import MANIFEST
    from personaplex_edge.runtime.backends.trt import TrtEngine

    model = tmp_path / "m"
    shutil.copytree(tiny_fp16_engines / "fp16", model)
    data = json.loads((model / MANIFEST).read_text())
    # another GPU's engine, of either library
    data["graphs"]["depformer_step"]["engine"].update(compute_capability="1.0", targets=["1.0"])
    (model / MANIFEST).write_text(json.dumps(data))
    manifest = load_model_dir(model)
    entry = manifest.graphs["depformer_step"]
    with pytest.raises(ModelDirError, match="compute capabilit(y|ies) 1.0"):
        TrtEngine(model, manifest, entry).bind()


@needs_gpu
def test_state_ping_pong_and_reset_on_device(tiny_fp16_engines):
    """The codec's state round-trips through the device and reset restores the initial one."""
    from personaplex_edge.runtime.backends.trt import TrtEngine

    model = tiny_fp16_engines / "fp16"
    manifest = load_model_dir(model)
    enc = TrtEngine(model, manifest, manifest.graphs["mimi_encoder"]).bind()
    first = {k: v.copy() for k, v in enc.state().items()}
    enc.inputs["pcm"][...] = np.random.default_rng(0).standard_normal(enc.inputs["pcm"].shape)
    codes = [enc.run()["codes"].copy() for _ in range(3)]
    assert any(not np.array_equal(first[k], v) for k, v in enc.state().items())
    enc.reset()
    for k, v in enc.state().items():
        np.testing.assert_array_equal(v, first[k])
    again = [enc.run()["codes"].copy() for _ in range(3)]
    np.testing.assert_array_equal(np.array(codes), np.array(again))


def test_gpu_runtime_and_precision_modules_do_not_import_torch():
    """The GPU backends and the engine build ship with the runtime (no torch); converting
    precisions, counting bytes, reading safetensors headers and writing external data need only
    onnx and numpy, so they run where torch is not installed either."""
    import subprocess
    import sys

    modules = ["personaplex_edge.runtime.backends." + m for m in (
        "trt", "cuda_graphs", "ort_cuda", "device_rings", "cuda_runtime", "trt_engine",
        "trt_build")]
    modules += ["personaplex_edge.export." + m for m in (
        "precision", "precision_plan", "graph_edit", "transpose_fold", "linear_quant",
        "cast_islands", "weight_quant", "external_data", "safetensors_file",
        "frugal")]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("library", ["tensorrt", "tensorrt-rtx"])
def test_simulated_gpu_persona_prefill_in_one_engine_call(tiny_fp32, tmp_path, monkeypatch,
                                                          library):
    """Host-side plumbing on the simulated GPU, with either library: on a TensorRT model the
    persona's forced frames run as one call of helium's engine (its own execution context, the
    frames axis inside the optimization profile) and land in the device rings at their slots,
    in a few strided copies per ring; the conversation after equals the one after
    frame-by-frame prefill, and the one onnxruntime runs on the CPU."""
    import fake_gpu

    from personaplex_edge.manifest import write_manifest
    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.persona import Persona, build_persona
    from personaplex_edge.runtime.sampling import SamplingParams

    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    model_dir, cuda = fake_gpu.simulated_copy(tiny_fp32, tmp_path / "model", monkeypatch,
                                              library)
    cpu_model = Model.load(model_dir, device="cpu")
    write_manifest(model_dir, dataclasses.replace(load_model_dir(model_dir), backend="tensorrt"))
    gpu_model = Model.load(model_dir)
    persona = Persona(text_prompt="Hello there.", voice="NATF2")
    pcm = (np.random.default_rng(4).standard_normal(30 * 1920) * 0.1).astype(np.float32)
    runs = {}
    for name, model, frame_by_frame in (("gpu, one call", gpu_model, False),
                                        ("gpu, per frame", gpu_model, True),
                                        ("cpu, one call", cpu_model, False)):
        with model.open_conversation(SamplingParams(greedy=True), persona) as conv:
            assert conv.group.framed
            plan = build_persona(model.loaded, persona)
            copies = cuda.copies_2d
            conv.group.prefill_forced(conv.row, plan, frame_by_frame=frame_by_frame)
            if name == "gpu, one call":  # 4 rings, no wrap: one copy each
                assert cuda.copies_2d - copies == 4
            rings = conv.group.helium.ring_prefix([conv.row], len(plan) - 1)
            conv.group.prefill_last(conv.row, plan)
            frames = []
            for i in range(30):
                conv.step(pcm[i * 1920:(i + 1) * 1920])
                frames.append(conv.last_frame.copy())
            runs[name] = (rings, np.array(frames))
    for name in ("gpu, per frame", "cpu, one call"):
        np.testing.assert_array_equal(runs[name][1], runs["gpu, one call"][1], err_msg=name)
        for ring, value in runs[name][0].items():
            np.testing.assert_allclose(value, runs["gpu, one call"][0][ring], atol=1e-5)
    # the same TensorRT model on the CPU computes other last bits: its personas are cached apart
    from personaplex_edge.runtime.persona import persona_key

    cpu_on_trt = Model.load(model_dir, device="cpu")
    assert gpu_model.runs_on == [library] and cpu_on_trt.runs_on == ["onnxruntime-cpu"]
    assert persona_key(gpu_model.loaded, persona) != persona_key(cpu_on_trt.loaded, persona)


# ---- TensorRT for RTX on the simulated GPU ---------------------------------------------------------

@pytest.fixture
def simulated_rtx(tiny_fp32, tmp_path, monkeypatch):
    """A copy of the tiny model with simulated TensorRT for RTX engines (portable: 8.6, 8.9,
    12.0) on a simulated RTX 4090 (8.9), mainline TensorRT not installed."""
    import fake_gpu

    from personaplex_edge.manifest import write_manifest

    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    model, cuda = fake_gpu.simulated_copy(tiny_fp32, tmp_path / "model", monkeypatch,
                                          "tensorrt-rtx")
    write_manifest(model, dataclasses.replace(load_model_dir(model), backend="tensorrt"))
    return model, cuda


def _lm(model, manifest):
    """Helium and the depformer as a conversation runs them on a GPU (load_graphs picks the
    library and checks the engines; lm_frame links and captures them)."""
    from personaplex_edge.runtime.backends import load_graphs
    from personaplex_edge.runtime.lm_frame import lm_frame

    graphs = load_graphs(model, manifest, ["helium_step", "depformer_step"], "cuda")
    return lm_frame(graphs["helium_step"], graphs["depformer_step"])


def test_simulated_rtx_gpu_runs_the_lm_like_onnxruntime_and_every_sampling_value_on_one_engine(
        simulated_rtx):
    """Host-side plumbing on a simulated RTX 4090 (TensorRT for RTX's runtime calls,
    tests/fake_gpu.py): the portable engines pass their header's validity check before they are
    deserialised, are JIT-compiled through a runtime config (shape-specialised kernels eager,
    TensorRT's own CUDA graphs off: ours capture the frame), and the captured, replayed frames
    give onnxruntime's tokens. Every temperature and top-k then runs on the same contexts and
    the same capture: no shape set, nothing compiled again. A second start takes the kernels
    from the runtime cache."""
    from lm_probe import GreedyLM

    model, cuda = simulated_rtx
    trt = sys.modules["tensorrt_rtx"]
    manifest = load_model_dir(model)
    user = np.random.default_rng(8).integers(0, 2048, (30, 8))
    cpu = GreedyLM(model, dataclasses.replace(manifest, backend="onnx"), device="cpu",
                   threads=1).run(user)
    lm = _lm(model, manifest)
    assert lm.sequence is not None  # captured
    np.testing.assert_array_equal(GreedyLM(model, manifest, lm=lm).run(user).tokens, cpu.tokens)
    assert cuda.launches == len(user)
    assert trt.deserialized == ["helium_step.onnx", "depformer_step.onnx"]
    assert len(trt.validity_checks) == 2  # each before its deserialisation
    assert trt.jit_compiles == ["helium_step.onnx", "depformer_step.onnx"]
    engines = [lm.helium.graph.engine, lm.depformer.graph.engine]
    for engine in engines:
        (config,) = engine.contexts
        assert config.dynamic_shapes_kernel_specialization_strategy.name == "EAGER"
        assert config.cuda_graph_strategy.name == "DISABLED"
    shapes = [list(e.shapes_set) for e in engines]
    launches = cuda.launches
    rng = np.random.default_rng(9)
    for t in range(12):  # sampling values a user may send, frame by frame
        lm.helium.inputs["text_temperature"][...] = rng.uniform(0.1, 2.0)
        lm.helium.inputs["text_top_k"][...] = rng.integers(0, 300)
        lm.depformer.inputs["audio_temperature"][...] = rng.uniform(0.1, 2.0)
        lm.depformer.inputs["audio_top_k"][...] = rng.integers(0, 300)
        lm.helium.inputs["text_noise"][...] = rng.gumbel(size=lm.helium.inputs["text_noise"].shape)
        lm.helium.inputs["position"][...] = len(user) + t
        lm.run(None)
    assert cuda.launches - launches == 12  # the one capture replayed
    assert [list(e.shapes_set) for e in engines] == shapes
    assert [len(e.contexts) for e in engines] == [1, 1] and len(trt.jit_compiles) == 2
    lm.close()

    again = _lm(model, manifest)  # a second start
    assert len(trt.jit_compiles) == 2  # the runtime cache held the kernels
    assert sorted(p.suffix for p in (model.parent / "cache" / "tensorrt-rtx").iterdir()) == [
        ".cache", ".cache"]
    again.close()


def test_simulated_rtx_gpu_refuses_a_damaged_or_unfit_engine_and_rebuilds_a_foreign_one(
        simulated_rtx, monkeypatch):
    """A damaged engine is refused by its sha256 before TensorRT sees a byte of it; one whose
    header says it was not built for this GPU (its record says otherwise) is refused with that
    reason before it is deserialised; one recorded for other targets is rebuilt for this GPU
    into the per-user cache (no timing cache: TensorRT for RTX has none); a GPU TensorRT for RTX
    does not run on is one message naming mainline TensorRT."""
    import fake_gpu

    from personaplex_edge.manifest import MANIFEST, HashMismatch, sha256_file
    from personaplex_edge.runtime.backends import DeviceUnavailable, load_graphs
    from personaplex_edge.runtime.backends.trt import TrtEngine

    model, cuda = simulated_rtx
    trt = sys.modules["tensorrt_rtx"]
    engine = model / "depformer_step.engine"
    built = engine.read_bytes()
    engine.write_bytes(built[:-2] + b"!\n")
    with pytest.raises(HashMismatch, match="depformer_step.engine"):
        load_graphs(model, load_model_dir(model), ["depformer_step"], "cuda")
    assert trt.validity_checks == [] and trt.deserialized == []

    # the header says 8.6 only; the record still says 8.6, 8.9, 12.0
    engine.write_bytes(b"depformer_step.onnx\n" + fake_gpu.rtx_header(trt.__version__, ["SM86"]))
    data = json.loads((model / MANIFEST).read_text())
    data["graphs"]["depformer_step"]["engine"]["sha256"] = sha256_file(engine)
    (model / MANIFEST).write_text(json.dumps(data))
    manifest = load_model_dir(model)
    with pytest.raises(ModelDirError, match="cannot run on this Simulated RTX 4090: it was not "
                                            "built for this GPU's compute capability"):
        TrtEngine(model, manifest, manifest.graphs["depformer_step"])
    assert len(trt.validity_checks) == 1 and trt.deserialized == []

    # recorded (truly) for 8.6 only: built again for this GPU, into the cache
    data["graphs"]["depformer_step"]["engine"]["targets"] = ["8.6"]
    (model / MANIFEST).write_text(json.dumps(data))
    said = []
    manifest = load_model_dir(model)
    loaded = load_graphs(model, manifest, ["depformer_step"], "cuda", progress=said.append)
    assert [s for s in said if "no engine of depformer_step for this Simulated RTX 4090 "
            "(TensorRT for RTX" in s and "building it into" in s], said
    ((network, config),) = trt.builds
    assert [c.name for c in config.targets] == ["SM89"] and config.timing_cache is None
    loaded["depformer_step"].bind()
    assert trt.deserialized == ["depformer_step.onnx"]

    fake_gpu.patch(monkeypatch, model, fake_gpu.FakeCuda("Simulated H100", 80 << 30, "9.0"),
                   "tensorrt-rtx")
    with pytest.raises(DeviceUnavailable, match="TensorRT for RTX does not run on Simulated "
                                                "H100 \\(compute capability 9.0\\): use "
                                                "mainline TensorRT"):
        load_graphs(model, manifest, ["helium_step"], "cuda")


def test_simulated_rtx_gpu_weightless_engines_are_refit_from_the_graphs(simulated_rtx, capsys,
                                                                       monkeypatch):
    """`engines --weightless` (on a machine with a GPU) builds engines without their weights
    (STRIP_PLAN and REFIT), recorded so; loading one refits it from the model's own ONNX graph
    before it runs, and one that cannot be refit is refused, naming the graph."""
    from lm_probe import GreedyLM

    from personaplex_edge.cli import main
    from personaplex_edge.runtime.backends.trt import TrtEngine

    model, _ = simulated_rtx
    trt = sys.modules["tensorrt_rtx"]
    assert main(["engines", "--model", str(model), "--graphs", "helium_step,depformer_step",
                 "--weightless"]) == 0
    out = capsys.readouterr().out
    assert out.count("weightless, refit from the graph when loaded") == 2, out
    manifest = load_model_dir(model)
    assert [manifest.graphs[n].engine["weightless"] for n in manifest.graphs] == [
        False, False, True, True]
    for _, config in trt.builds:
        assert {trt.BuilderFlag.STRIP_PLAN, trt.BuilderFlag.REFIT} <= config.flags
    user = np.random.default_rng(2).integers(0, 2048, (12, 8))
    cpu = GreedyLM(model, dataclasses.replace(manifest, backend="onnx"), device="cpu",
                   threads=1).run(user)
    np.testing.assert_array_equal(GreedyLM(model, manifest, lm=_lm(model, manifest)).run(user)
                                  .tokens, cpu.tokens)
    assert trt.refits == ["helium_step.onnx", "depformer_step.onnx"]
    monkeypatch.setattr(trt.OnnxParserRefitter, "refit_from_file", lambda self, path: False)
    with pytest.raises(ModelDirError, match="depformer_step.engine is weightless and could not "
                                            "be refit: depformer_step.onnx does not hold"):
        TrtEngine(model, manifest, manifest.graphs["depformer_step"])


def test_with_both_libraries_installed_a_model_runs_on_the_one_that_built_it(simulated_rtx,
                                                                           monkeypatch):
    """Mainline TensorRT and TensorRT for RTX side by side on an RTX card: a model's RTX
    engines are run by TensorRT for RTX; a model without engines gets the default, mainline;
    on a GPU TensorRT for RTX does not run on, mainline again."""
    import fake_gpu

    from personaplex_edge.runtime.backends.trt_build import runtime_library

    model, cuda = simulated_rtx
    monkeypatch.setitem(sys.modules, "tensorrt", fake_gpu.fake_tensorrt(cuda, model))
    manifest = load_model_dir(model)
    names = list(manifest.graphs)
    assert runtime_library(manifest, names).name == "tensorrt-rtx"
    bare = dataclasses.replace(manifest, graphs={n: dataclasses.replace(g, engine=None)
                                                 for n, g in manifest.graphs.items()})
    assert runtime_library(bare, names).name == "tensorrt"
    cuda.compute_capability = "9.0"
    assert runtime_library(manifest, names).name == "tensorrt"


def test_simulated_gpu_ort_cuda_checks_its_graph_and_its_one_captured_conversation(simulated):
    """Host-side plumbing on the simulated GPU (onnxruntime CPU behind a stand-in CUDA
    session): OrtCudaModelGraph refuses a graph whose signature disagrees with the manifest,
    as the other backends do, and with cuda_graph serves one conversation only."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "gpu"))
    from standin_engine import cuda_sessions

    from personaplex_edge.manifest import TensorSpec
    from personaplex_edge.runtime.backends.ort_cuda import OrtCudaModelGraph

    model, _ = simulated
    entry = load_model_dir(model).graphs["depformer_step"]
    first = entry.inputs[0]
    wrong = dataclasses.replace(entry, inputs=[TensorSpec(first.name, (first.shape[0], 7),
                                                          first.dtype), *entry.inputs[1:]])
    with cuda_sessions():
        with pytest.raises(ModelDirError, match="re-export|disagrees"):
            OrtCudaModelGraph(model, wrong)
        loaded = OrtCudaModelGraph(model, entry, cuda_graph=True)
        loaded.bind()
        with pytest.raises(ModelDirError, match="serves one conversation"):
            loaded.bind()
        loaded.close()
