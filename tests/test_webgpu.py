"""`--device webgpu`: onnxruntime's WebGPU provider runs every graph (runtime/backends/
ort_webgpu.py) on SwiftShader, the software Vulkan device CI has (tests/webgpu_env.py), with the
same tokens as onnxruntime on the CPU.

    the LM alone, fixed user codes   fp32, int8 and int4 (float32 compute), past the ring's wrap;
                                     graph capture replays the same tokens
    whole conversations (the demo)   persona prefill in one call, a restored persona, lockstep
                                     rows joining late and held, served to moshi's client
    refusals                         no adapter, an fp16 model on an adapter without
                                     shader-f16, no Vulkan loader: one message each, exit 2

SwiftShader compiles each shader on its first run (seconds) and runs a frame in about a second:
every model here is loaded once per module and the frame counts are the fewest that prove the
point (a ring of 24 slots wrapped by 30 frames)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ci_parts import not_installable

pytest.importorskip("onnxruntime_ep_webgpu", reason="the webgpu extra (scripts/install.sh "
                    "installs it)")

from personaplex_edge.runtime.backends import DeviceUnavailable, load_graphs  # noqa: E402
from personaplex_edge.runtime.backends.webgpu_adapter import (  # noqa: E402
    SOFTWARE_SWITCH, WebGpuUnavailable, find_adapter)

FRAME = 1920
CONTEXT = 24  # the ring of the short-context model: 30 frames wrap it
LM_FRAMES = 30


@pytest.fixture(scope="module")
def adapter():
    try:
        return find_adapter()
    except WebGpuUnavailable as e:
        pytest.skip(f"no WebGPU adapter here ({e}): scripts/install.sh installs SwiftShader "
                    "(chromium) and libvulkan1")


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
    on the adapter. The ring write is (its ScatterElements, recorded once and replayed each
    frame with the new slots copied into its fixed buffer); the steps as exported keep int64
    nodes on the CPU, which the load says, and run uncaptured. The tokens are the CPU's, past
    the wrap."""
    from lm_probe import GreedyLM

    from personaplex_edge.runtime.backends.ort_webgpu import CAPTURE_SWITCH

    model_dir = short_models["fp32"]
    codes = _user_codes(LM_FRAMES, seed=2)
    cpu = _greedy_lm_tokens(model_dir, "cpu", codes)
    monkeypatch.setenv(CAPTURE_SWITCH, "1")
    said = []
    from personaplex_edge.manifest import load_model_dir

    manifest = load_model_dir(model_dir, need="lm")
    lm = GreedyLM(model_dir, manifest, opener=lambda name: load_graphs(
        model_dir, manifest, [name], "webgpu", progress=said.append)[name].bind())
    try:
        assert lm.helium._rings._run_options.get_run_config_entry("gpu_graph_id") == "1"
        np.testing.assert_array_equal(lm.run(codes).tokens, cpu)
    finally:
        lm.close()
    assert any(line.startswith("graph capture: ") and "refused it for helium_step" in line
               for line in said), said


# -- whole conversations on the demo ---------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_pair(adapter, demo_model_dir):
    """The demo model loaded on the CPU and on WebGPU (its shaders compiled once here)."""
    from personaplex_edge.runtime.api import Model

    said: list[str] = []
    cpu = Model.load(demo_model_dir, device="cpu")
    gpu = Model.load(demo_model_dir, device="webgpu", progress=said.append)
    yield cpu, gpu, said
    cpu.close()
    gpu.close()


def _speech(seconds: float) -> np.ndarray:
    from bench_serve import speech

    return speech(seconds)


def _answer(model, pcm: np.ndarray, **persona) -> tuple[list[str], np.ndarray, bool]:
    with model.conversation(greedy=True, **persona) as conv:
        pieces, audio = [], []
        for out, text in conv.stream(pcm):
            pieces.append(text)
            audio.append(out)
        return pieces, np.concatenate(audio), conv.persona_cached


def test_a_conversation_on_webgpu_answers_as_on_the_cpu(demo_pair):
    """The demo with a voice and a text prompt: the persona's prefill is one call over its
    frames (their K/V rows written at once), then frame by frame; a second conversation with
    the same persona starts from the cache (the rings' prefix written back) - each frame's text
    equals the CPU's and the audio is the CPU's to float rounding. The load said which
    adapter it took."""
    cpu, gpu, said = demo_pair
    assert any("running on WebGPU: SwiftShader" in line for line in said), said
    assert gpu.runs_on == ["onnxruntime-webgpu"]
    persona = {"voice": "NATF2", "text_prompt": "You enjoy having a good conversation."}
    pcm = _speech(2.0)
    want_text, want_audio, _ = _answer(cpu, pcm, **persona)
    text, audio, cached = _answer(gpu, pcm, **persona)
    assert not cached
    assert text == want_text and "".join(text).strip()
    np.testing.assert_allclose(audio, want_audio, atol=2e-3)
    again_text, again_audio, cached = _answer(gpu, pcm[:8 * FRAME], **persona)
    assert cached  # restored, not prefilled
    assert again_text == want_text[:8]
    np.testing.assert_allclose(again_audio, want_audio[:8 * FRAME], atol=2e-3)


def test_lockstep_rows_on_webgpu_each_equal_their_single_run(adapter, batch_model_dir):
    """The demo at batch 3 on WebGPU: a second conversation joins three ticks in (its persona
    prefilled while the first row is live: the others' rings held) and misses every fourth
    tick (its row held: its K/V slots and state kept); each answer equals that conversation
    run alone on the CPU."""
    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.conversation import step_many
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.sampling import SamplingParams

    n = 10
    pcm = [_speech(6.0)[k * FRAME:(k + n) * FRAME] for k in (0, 20)]
    settings = [(SamplingParams(greedy=True), Persona(text_prompt="You are a helpful robot.")),
                (SamplingParams(greedy=True), Persona(text_prompt="Be brief.", voice="NATM1"))]
    cpu = Model.load(batch_model_dir, device="cpu")

    def alone(k):
        with cpu.open_conversation(*settings[k]) as conv:
            conv.prefill()
            return np.concatenate([conv.step(pcm[k][i * FRAME:(i + 1) * FRAME])[0].copy()
                                   for i in range(n)])

    want = [alone(k) for k in range(2)]
    gpu = Model.load(batch_model_dir, device="webgpu")
    convs, got = {}, {0: [], 1: []}
    for tick in range(n + 6):
        for k, start in ((0, 0), (1, 3)):
            if tick == start:
                convs[k] = gpu.open_conversation(*settings[k])
                convs[k].prefill()
        frames = {}
        for k, conv in convs.items():
            if len(got[k]) == n or (k == 1 and tick % 4 == 0):
                continue
            frames[conv] = pcm[k][len(got[k]) * FRAME:(len(got[k]) + 1) * FRAME]
        for conv, (audio, _) in step_many(frames).items():
            got[next(k for k, c in convs.items() if c is conv)].append(audio.copy())
    assert convs[0].group is convs[1].group  # one batch, one call per tick
    for k in range(2):
        assert len(got[k]) == n
        np.testing.assert_allclose(np.concatenate(got[k]), want[k], atol=2e-3,
                                   err_msg=f"conversation {k}")
    assert not np.array_equal(want[0], want[1])  # two conversations, not one twice
    gpu.close()
    cpu.close()


def test_serve_on_webgpu_holds_conversations_on_both_protocols(demo_pair, demo_model_dir,
                                                                tmp_path):
    """`serve --device webgpu`'s server on the WebGPU model, two sessions at once: moshi's
    protocol (Ogg/Opus pages, decoded with sphn as moshi's client does) and the openai SDK's
    Realtime client. Each hears `run --greedy --device cpu`'s answer to what it sent: the same
    text, the same audio to float rounding (Realtime's PCM16)."""
    pytest.importorskip("aiohttp")
    pytest.importorskip("sphn")
    openai = pytest.importorskip("openai")
    from bench_serve import ServerThread, opus_pages, opus_round_trip, reference_run, talk
    from realtime_sdk import sdk_events

    from personaplex_edge.runtime.sampling import SamplingParams
    from personaplex_edge.runtime.serve import ServeOptions

    _, gpu, _ = demo_pair
    pages = opus_pages(_speech(1.2))
    heard = opus_round_trip(pages)
    samples = np.round(_speech(1.2) * 32767).astype(np.int16)
    want_moshi, _ = reference_run(demo_model_dir, heard, tmp_path / "moshi", "--greedy",
                                  "--device", "cpu")
    want_text, want_audio = reference_run(demo_model_dir, samples, tmp_path / "rt",
                                          "--greedy", "--device", "cpu")
    n = samples.shape[0] // FRAME
    audio = bytearray()

    def enough(event) -> bool:
        if event.type == "response.output_audio.delta":
            import base64

            audio.extend(base64.b64decode(event.delta))
        return len(audio) >= n * FRAME * 2

    with ServerThread(ServeOptions(demo_model_dir, port=0, sampling=SamplingParams(greedy=True),
                                   max_backlog=100_000, max_ahead_s=None), model=gpu) as srv:
        client = openai.AsyncOpenAI(api_key="any key", base_url=srv.url + "v1")

        async def both():
            return await asyncio.gather(
                talk(srv.url, pages, pace=None, tail_s=300, handshake_timeout=300,
                     until_frames=heard.shape[0] // FRAME),
                sdk_events(client.realtime.connect(model="personaplex-7b-v1"),
                           {"type": "realtime"}, samples.tobytes(), 3 * FRAME * 2, enough))

        moshi, events = asyncio.run(asyncio.wait_for(both(), 600))
    assert not moshi.errors and moshi.text == want_moshi and len(want_moshi) > 3, moshi
    assert not [e for e in events if e["type"] == "error"]
    transcript = "".join(e["delta"] for e in events
                         if e["type"] == "response.output_audio_transcript.delta")
    assert transcript == want_text and len(audio) == n * FRAME * 2
    got = np.frombuffer(bytes(audio), "<i2").astype(np.int32)
    assert np.abs(got - want_audio.astype(np.int32)).max() <= 64  # 2e-3 of full scale


# -- refusals ---------------------------------------------------------------------------------------
def _cli(args: list[str], env: dict | None = None, prefix: list[str] = ()):
    return subprocess.run([*prefix, sys.executable, "-m", "personaplex_edge.cli", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _without_software_switch() -> dict:
    env = dict(os.environ)
    env.pop(SOFTWARE_SWITCH, None)
    return env


def _hardware_adapter() -> bool:
    done = subprocess.run([sys.executable, "-c", (
        "from personaplex_edge.runtime.backends.webgpu_adapter import find_adapter\n"
        "find_adapter(hardware_only=True)")], env=_without_software_switch(),
        capture_output=True, text=True)
    return done.returncode == 0


def test_no_adapter_is_one_message_and_auto_runs_on_the_cpu(demo_model_dir, tmp_path):
    """Without a GPU and without the provider's software switch: `--device webgpu` exits 2 with
    one line saying so and how to run on a software adapter; `--device auto` runs on the CPU
    and says why not WebGPU."""
    if _hardware_adapter():
        pytest.skip(not_installable("this machine has a WebGPU GPU adapter"))
    wav = tmp_path / "in.wav"
    from personaplex_edge.audio import write_audio

    write_audio(wav, _speech(0.4), 24000)
    args = ["run", "--model", str(demo_model_dir), "--input", str(wav), "--output",
            str(tmp_path / "out.wav"), "--greedy", "--no-persona"]
    env = _without_software_switch()
    done = subprocess.run([sys.executable, "-m", "personaplex_edge.cli", *args, "--device",
                           "webgpu"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "--device webgpu: WebGPU found no GPU adapter" in done.stderr
    assert SOFTWARE_SWITCH in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out.wav").exists()
    done = subprocess.run([sys.executable, "-m", "personaplex_edge.cli", *args, "--device",
                           "auto"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "running on the CPU: WebGPU found no GPU adapter" in done.stdout + done.stderr
    assert (tmp_path / "out.wav").is_file()


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
    done = _cli(["bench", "--model", str(tmp_path / "fp16-None"), "--device", "webgpu",
                 "--frames", "1", "--warmup", "0", "--no-persona"])
    assert done.returncode == 2 and "shader-f16" in done.stderr, done.stderr
    assert done.stderr.count("\n") <= 2, done.stderr  # one message, no traceback


def test_a_missing_vulkan_loader_is_one_message(demo_model_dir, tmp_path):
    """libvulkan.so.1 hidden from the process (a private mount namespace binds /dev/null over
    it): `--device webgpu` exits 2 naming the package that brings it."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip(not_installable("hiding the loader takes root and unshare"))
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(not_installable(f"no private mount namespace here: {probe.stderr.strip()}"))
    import ctypes.util  # noqa: F401

    loader = subprocess.run([sys.executable, "-c", (
        "import ctypes, os\n"
        "lib = ctypes.CDLL('libvulkan.so.1')\n"
        "import _ctypes\n"
        "print(os.path.realpath(next(l.split()[-1] for l in open('/proc/self/maps') "
        "if 'libvulkan.so' in l)))")], capture_output=True, text=True)
    assert loader.returncode == 0, loader.stderr
    real = loader.stdout.strip()
    script = (f'mount --bind /dev/null {real} && exec "$0" "$@"')
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable,
         "-m", "personaplex_edge.cli", "bench", "--model", str(demo_model_dir), "--device",
         "webgpu", "--frames", "1", "--warmup", "0", "--no-persona"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Vulkan loader (libvulkan.so.1) is missing" in done.stderr
    assert "apt install libvulkan1" in done.stderr and "Traceback" not in done.stderr


def test_bench_on_webgpu_names_the_adapter(demo_pair, demo_model_dir, capsys):
    """`bench --device webgpu` prints the adapter it ran on beside ms a frame per stage."""
    from personaplex_edge.cli import main

    assert main(["bench", "--model", str(demo_model_dir), "--device", "webgpu", "--frames",
                 "2", "--warmup", "1", "--no-persona", "--aec", "off"]) == 0
    out = capsys.readouterr().out
    assert "SwiftShader Device" in out and "Vulkan" in out
    for stage in ("encode", "temporal", "depformer", "decode"):
        assert stage in out
