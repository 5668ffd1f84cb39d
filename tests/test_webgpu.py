"""`--device webgpu`: onnxruntime's WebGPU provider runs every graph (runtime/backends/
ort_webgpu.py) on SwiftShader, the software Vulkan device CI has (tests/webgpu_env.py), with the
same answers as onnxruntime on the CPU.

    whole conversations (the demo)   persona prefill in one call, a restored persona, lockstep
                                     rows joining late and held, `serve` to moshi's protocol
                                     and the openai SDK's Realtime client, `bench`
    refusals                         no adapter, no Vulkan loader: one message each, exit 2
                                     (`auto`: the CPU, saying why)

The language model alone (precisions, the ring's wrap, capture, shader-f16): test_webgpu_lm.py.
SwiftShader compiles each shader on its first run (seconds) and runs a demo frame in about a
second: the demo is loaded once per module and the frame counts are the fewest that prove the
point."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from ci_parts import not_installable

pytest.importorskip("onnxruntime_ep_webgpu", reason="the webgpu extra (scripts/install.sh "
                    "installs it)")

from personaplex_edge.runtime.backends.webgpu_adapter import SOFTWARE_SWITCH  # noqa: E402
from webgpu_env import adapter_or_skip  # noqa: E402

FRAME = 1920


@pytest.fixture(scope="module")
def adapter():
    return adapter_or_skip()


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
    pcm = _speech(1.2)
    want_text, want_audio, _ = _answer(cpu, pcm, **persona)
    text, audio, cached = _answer(gpu, pcm, **persona)
    assert not cached
    assert text == want_text and "".join(text).strip()
    np.testing.assert_allclose(audio, want_audio, atol=2e-3)
    again_text, again_audio, cached = _answer(gpu, pcm[:6 * FRAME], **persona)
    assert cached  # restored, not prefilled
    assert again_text == want_text[:6]
    np.testing.assert_allclose(again_audio, want_audio[:6 * FRAME], atol=2e-3)


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


# -- refusals --------------------------------------------------------------------------------------
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


def test_a_missing_vulkan_loader_is_one_message(demo_model_dir, tmp_path):
    """libvulkan.so.1 hidden from the process (a private mount namespace binds /dev/null over
    it): `--device webgpu` exits 2 naming the package that brings it."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip(not_installable("hiding the loader takes root and unshare"))
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(not_installable(f"no private mount namespace here: {probe.stderr.strip()}"))
    loader = subprocess.run([sys.executable, "-c", (
        "import ctypes, os\n"
        "lib = ctypes.CDLL('libvulkan.so.1')\n"
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
