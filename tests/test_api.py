"""The public Python API (`import personaplex_edge as pe`): a light import, the same answer
as `personaplex-edge run`, conversations on one model independent of each other, asyncio, and
one exception type whose messages name the fix. (Its live loop on sound devices, and the
the manual's API page run as written: tests/test_live_audio.py.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from signals import voiced

import personaplex_edge as pe
from personaplex_edge.cli import main

PROMPT = "You enjoy having a good conversation."


@pytest.fixture(scope="module")
def model(demo_model_dir):
    with pe.load(demo_model_dir, device="cpu") as m:
        yield m


def test_importing_the_package_loads_no_runtime_and_is_quick():
    code = ("import json, sys, time\n"
            "t = time.perf_counter()\n"
            "import personaplex_edge as pe\n"
            "took = time.perf_counter() - t\n"
            "heavy = ('numpy', 'onnxruntime', 'torch')\n"
            "before = [m for m in heavy if m in sys.modules]\n"
            "pe.load, pe.Conversation  # the API's module: numpy, still no onnxruntime or torch\n"
            "after = [m for m in heavy if m in sys.modules]\n"
            "print(json.dumps({'took': took, 'before': before, 'after': after}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["took"] < 0.5 and seen["before"] == [], seen
    assert seen["after"] == ["numpy"], seen


def test_the_package_names_each_public_name_typed_and_documented():
    import inspect

    from personaplex_edge.runtime import api

    for name in pe.__all__:
        value = getattr(pe, name)
        if name != "__version__":
            assert inspect.getdoc(value), name
    for cls in (api.Model, api.Conversation):
        for name, member in vars(cls).items():
            if not name.startswith("_") and callable(getattr(member, "fget", member)):
                assert inspect.getdoc(member), f"{cls.__name__}.{name}"
    assert (api.__file__ and pe.__file__) and \
        (__import__("pathlib").Path(pe.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("flags,options", [(["--greedy"], {"greedy": True}),
                                           (["--seed", "3"], {"seed": 3})],
                         ids=["greedy", "seeded"])
def test_a_recording_through_the_api_equals_run(model, demo_model_dir, tmp_path, flags,
                                                options):
    """A 16 kHz file: `run` resamples it on reading; the API takes the samples and their rate.
    The answer (as PCM16 in a wav), the per-frame records and the transcript agree exactly,
    through respond() and through stream()."""
    source = tmp_path / "question.wav"
    sf.write(source, voiced(5.3, 16000, seed=1), 16000, subtype="PCM_16")
    out, records = tmp_path / "run.wav", tmp_path / "run.json"
    assert main(["run", "--model", str(demo_model_dir), "--input", str(source), "--output",
                 str(out), "--text-out", str(records), "--device", "cpu",
                 "--text-prompt", PROMPT, *flags]) == 0
    by_run, rate = sf.read(out, dtype="int16")
    run_records = json.loads(records.read_text())

    pcm, file_rate = sf.read(source, dtype="float32")
    with model.conversation(text_prompt=PROMPT, **options) as conv:
        answer = conv.respond(pcm, sample_rate=file_rate)
    pe.write_audio(tmp_path / "api.wav", answer.pcm)
    by_api, _ = sf.read(tmp_path / "api.wav", dtype="int16")
    assert rate == 24000 and by_api.shape == by_run.shape == (int(5.3 * 24000),)
    np.testing.assert_array_equal(by_api, by_run)
    assert answer.records == run_records
    assert any(r not in ("PAD", "EPAD") for r in run_records)  # it said something to compare

    with model.conversation(text_prompt=PROMPT, **options) as conv:
        steps = list(conv.stream(pe.read_audio(source)))
        said = conv.text
    assert all(p.shape == (1920,) and p.dtype == np.float32 for p, _ in steps)
    streamed = np.concatenate([p for p, _ in steps])[:by_run.shape[0]]
    np.testing.assert_array_equal(pe.audio.to_pcm16(streamed), by_run)
    assert [t for _, t in steps if t] == [r for r in run_records if r not in ("PAD", "EPAD", "")]
    assert said == answer.text and said


def test_two_conversations_on_one_model_each_answer_as_alone(model):
    settings = [dict(text_prompt=PROMPT, voice="NATF2", seed=1),
                dict(text_prompt="Be brief.", voice="NATM1", seed=2)]
    audio = [voiced(3.04, 24000, seed=k) for k in range(2)]  # 38 whole frames
    alone = []
    for k in range(2):
        with model.conversation(**settings[k]) as conv:
            alone.append(np.concatenate([p for p, _ in conv.stream(audio[k])]))
    a, b = (model.conversation(**s) for s in settings)
    assert model.open_conversations == 2
    together = [[], []]
    for i in range(0, audio[0].shape[0], 1920):  # interleaved, frame by frame
        for k, conv in enumerate((a, b)):
            together[k].append(conv.step(audio[k][i:i + 1920])[0])
    a.close(), b.close()
    assert model.open_conversations == 0
    for k in range(2):
        np.testing.assert_array_equal(np.concatenate(together[k]), alone[k])
    assert not np.array_equal(alone[0], alone[1])


def test_asyncio_steps_off_the_loop_and_answers_as_stream(model):
    pcm = voiced(2, 24000, seed=4)
    with model.conversation(greedy=True) as conv:
        expected = [(p, t) for p, t in conv.stream(pcm)]

    async def frames():
        for i in range(0, pcm.shape[0], 1920):
            yield np.pad(pcm[i:i + 1920], (0, max(0, i + 1920 - pcm.shape[0])))

    async def main_task():
        ticks = 0

        async def ticker():  # the event loop keeps running while frames are computed
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        background = asyncio.ensure_future(ticker())
        with model.conversation(greedy=True) as conv:
            got = [(p, t) async for p, t in conv.astream(frames())]
            one = await conv.astep(np.zeros(1920, np.float32))
        background.cancel()
        return got, one, ticks

    got, one, ticks = asyncio.run(main_task())
    assert len(got) == len(expected) and ticks > len(got)
    for (p, t), (q, u) in zip(got, expected):
        np.testing.assert_array_equal(p, q)
        assert t == u
    assert one[0].shape == (1920,)


def _refusal(call) -> str:
    with pytest.raises(pe.PersonaPlexError) as caught:
        call()
    return str(caught.value)


def test_bad_arguments_are_one_exception_type_naming_the_fix(model, tmp_path):
    assert "does not exist" in _refusal(lambda: pe.load(tmp_path / "nowhere"))
    said = _refusal(lambda: model.conversation(voice="NOPE1"))
    assert "NOPE1" in said and "NATF2" in said  # the voices there are
    assert model.open_conversations == 0  # the refused conversation gave its row back
    assert "above 0" in _refusal(lambda: model.conversation(temp=0))
    assert "0 or more" in _refusal(lambda: pe.load(model.model_dir, persona_cache_mb=-1))
    with model.conversation(persona=False) as conv:
        assert "1920" in _refusal(lambda: conv.step(np.zeros(1000, np.float32)))
        assert "24000" in _refusal(lambda: conv.step(np.zeros(1920, np.float32),
                                                      sample_rate=16000))
        assert "float32" in _refusal(lambda: conv.step(np.zeros(1920, np.int16)))
        assert "NaN" in _refusal(lambda: conv.step(np.full(1920, np.nan, np.float32)))
        assert "1920" in _refusal(lambda: list(conv.stream([np.zeros(960, np.float32)])))
        assert "mono" in _refusal(lambda: conv.respond(np.zeros((2, 4800), np.float32)))
        assert conv.step(np.zeros(1920, np.float32))[0].shape == (1920,)
    assert "closed" in _refusal(lambda: conv.step(np.zeros(1920, np.float32)))
    assert conv.closed and model.open_conversations == 0


def test_a_built_in_model_from_an_older_version_is_exported_again(demo_model_dir, tmp_path,
                                                                  monkeypatch):
    """The cache's demo left by a version whose demo bank had other voices (no recipe mark) is
    exported again on the next load, said once; the next load uses it as it is. Nothing is
    written into the current directory."""
    import shutil

    from personaplex_edge import model_ref

    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    old = tmp_path / "cache" / "models" / "demo"
    shutil.copytree(demo_model_dir, old)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    said = []
    assert model_ref.resolve_model("demo", said.append) == model_ref.builtin_dir("demo") == old
    assert not any((tmp_path / "work").iterdir())
    assert any("older version" in line for line in said)
    assert (old / model_ref.RECIPE_FILE).read_text().strip() == model_ref.BUILTIN_RECIPE
    stamp = (old / "manifest.json").stat().st_mtime_ns
    said.clear()
    with pe.load("demo", device="cpu", progress=said.append) as model:
        assert "NATF0" in model.voices()
    assert (old / "manifest.json").stat().st_mtime_ns == stamp and not any(
        "export" in line for line in said)
