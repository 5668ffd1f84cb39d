"""`say`: words an app decides, through the model's inner monologue. The machine and the word
split against moshi's own (`moshi.models.tts.StateMachine`, `script_to_entries`), and the
whole conversation against moshi's streaming pipeline with that machine applied to its sampled
text token: `run --greedy --no-persona --say TEXT --say-at S` on a checkpoint with random
weights and a 16-frame context (the KV ring wraps while the words are said), and one row of a
lockstep batch saying words while the others go on as they would without."""

from __future__ import annotations

import itertools
import json
import random
import shutil

import numpy as np
import pytest
import soundfile as sf

from personaplex_edge.cli import main
from personaplex_edge.runtime.words.say import SayMachine, Word, arrival_step, script_words
from personaplex_edge.streams import TEXT_EPAD, TEXT_PAD

FRAME = 1920
RATE = 12.5  # frames per second


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    """The synthetic SentencePiece model the test checkpoints carry (the real one's ids)."""
    import sentencepiece as spm

    from personaplex_edge.export.synthetic import train_tokenizer

    path = train_tokenizer(tmp_path_factory.mktemp("spm") / "tokenizer.model")
    return path, spm.SentencePieceProcessor(model_file=str(path))


def _moshi():
    from moshi.models import tts

    return tts


def _entries(sp, text: str):
    tts = _moshi()
    return tts.script_to_entries(sp, tts.TokenIds(32001), RATE, [text], multi_speaker=False)


SCRIPTS = ["your tea is ready", "  Two  spaces,\tand a tab\n", "it’s 5: (almost) done",
           'wait <break time="1.5s"/> then go', '<break time="0.3s">first<break time="2s"/>',
           'a<break time="0s"/>b <break  time="1.s" />c', "", "   ", "(", "ünïcödé wörds"]


@pytest.mark.parametrize("text", SCRIPTS)
def test_words_are_split_and_encoded_as_moshis_script_to_entries(spm_model, text):
    _, sp = spm_model
    want = [(e.text, tuple(e.tokens), e.padding) for e in _entries(sp, text)]
    got = script_words(text, lambda w: list(sp.encode(w)), RATE)
    assert [(w.text, w.tokens, w.padding) for w in got] == want
    spoken = [w for w in got if w.tokens]
    assert [w.index for w in spoken] == list(range(len(spoken)))


def test_the_step_words_arrive_at():
    assert [arrival_step(s, RATE) for s in (0, 0.01, 0.08, 0.4, 0.41, 1.0)] == [0, 1, 1, 5, 6, 13]
    with pytest.raises(Exception, match=">= 0"):
        arrival_step(-1, RATE)


def _random_run(rng: random.Random, steps: int):
    """Sampled tokens (EPAD, PAD, pieces) and says at random steps, breaks among the words."""
    tokens = [rng.choice([TEXT_EPAD, TEXT_PAD, TEXT_PAD, 7, 120]) for _ in range(steps)]
    says = {}
    for u in range(1, rng.randint(1, 3) + 1):
        words = [Word(f"w{i}", tuple(rng.randint(4, 150) for _ in range(rng.randint(0, 4))),
                      rng.choice([0, 0, 0, 3]), u, i) for i in range(rng.randint(0, 4))]
        says.setdefault(rng.randrange(steps), []).extend(words)
    return tokens, says


def test_the_machine_feeds_what_moshis_state_machine_feeds():
    """Random sampled streams, words arriving at random steps (appended to a running machine,
    or starting a new one after the last ended): step for step the same token fed back, the
    same end, each word started at the step moshi's transcript gives it and done when its
    last piece is fed."""
    tts = _moshi()
    machine = tts.StateMachine(tts.TokenIds(32001))  # its defaults: max 6 PADs, initial 2
    assert (machine.max_padding, machine.initial_padding) == (6, 2)
    rng = random.Random(0)
    steered = 0
    for trial in range(400):
        tokens, says = _random_run(rng, rng.randint(5, 90))
        ours, state, transcript = SayMachine(), None, []
        for t, token in enumerate(tokens):
            if t in says:
                entries = [tts.Entry(list(w.tokens), w.text, w.padding) for w in says[t]]
                if state is None or state.end_step is not None:
                    if entries:
                        state = machine.new_state(entries)
                        transcript.append(state.transcript)
                else:
                    state.entries.extend(entries)
                ours.add(says[t])
            want = token
            if state is not None and state.end_step is None:
                want, _ = machine.process(t, state, token)
                steered += 1
            got = ours.feed(token, t) if ours.running else token
            assert got == want, (trial, t)
            assert ours.running == (state is not None and state.end_step is None), (trial, t)
        started = [(e.word, e.step) for e in ours.events if e.kind == "started"]
        assert started == [w for words in transcript for w in words], trial
        lengths = {(w.utterance, w.index): len(w.tokens) for ws in says.values() for w in ws}
        for e in ours.events:
            if e.kind == "done":
                start = next(s.step for s in ours.events if s.kind == "started"
                             and (s.utterance, s.index) == (e.utterance, e.index))
                assert e.step == start + lengths[e.utterance, e.index]
    assert steered > 5000  # the runs exercised the machine, not only idle rows


def test_cancel_drops_the_queue_and_the_spoken_word_ends_at_its_end():
    m = SayMachine()
    words = [Word(w, tuple(range(10 + 3 * i, 13 + 3 * i)), 0, 1, i)
             for i, w in enumerate(["one", "two", "three"])]
    m.add(words)
    # the 2 forced PADs are all the PADs allowed at the start: the first word is then forced
    assert [m.feed(TEXT_PAD, t) for t in range(3)] == [TEXT_PAD, TEXT_PAD, TEXT_EPAD]
    assert m.feed(99, 3) == 10
    m.cancel(4)
    assert [(e.kind, e.word, e.step, e.last) for e in m.events] == [
        ("started", "one", 2, False), ("cancelled", "two", 4, False),
        ("cancelled", "three", 4, False)]
    # the word being spoken goes on to its end whatever is sampled, then the model's own text
    assert [m.feed(TEXT_EPAD, 4), m.feed(TEXT_EPAD, 5)] == [11, 12]
    assert not m.running
    assert (m.events[-1].kind, m.events[-1].step, m.events[-1].last) == ("done", 5, True)
    # cancelled with no word being spoken: the text stream is the model's at once
    m = SayMachine()
    m.add(words)
    m.cancel(0)
    assert not m.running and [e.kind for e in m.events] == ["cancelled"] * 3
    assert m.events[-1].last


# ---- the conversation against moshi's pipeline ---------------------------------------------------

CONTEXT = 16  # frames: the KV ring wraps several times while the words are said
FRAMES = 44  # the script ends near step 40
SAY_AT = 0.4  # seconds: step 5
SCRIPT = 'your tea <break time="0.3s"/> is ready'


@pytest.fixture(scope="module")
def short_context(tmp_path_factory, tiny_mimi_ref, spm_model):
    """moshi's tiny Mimi and an LM with a 16-frame context in one published checkpoint,
    exported at batch 1 and at batch 3."""
    from moshi_lm_reference import reference_lm, save_published_lm
    from moshi_reference import save_published

    from personaplex_edge.config import PersonaPlexConfig, PRESETS
    from personaplex_edge.export.hub import (CONFIG_FILE, MIMI_FILE, TOKENIZER_FILE,
                                             resolve_checkpoint)
    from personaplex_edge.export.model_export import export_model

    raw = json.loads(json.dumps(PRESETS["tiny"]))
    raw["temporal_config"]["max_position_embeddings"] = CONTEXT
    cfg = PersonaPlexConfig.from_dict(raw)
    root = tmp_path_factory.mktemp("say_ckpt")
    lm = reference_lm(cfg, seed=3)
    save_published_lm(lm, root / "model.safetensors")
    save_published(tiny_mimi_ref, root / MIMI_FILE)
    shutil.copyfile(spm_model[0], root / TOKENIZER_FILE)
    (root / CONFIG_FILE).write_text(json.dumps({"model_type": "personaplex", **cfg.to_dict()}))
    out = tmp_path_factory.mktemp("say_models")
    # unchecked exports: the tests below hold them against moshi itself
    for batch in (1, 3):
        export_model(resolve_checkpoint(str(root)), out / f"b{batch}", batch=batch, verify="off",
                     progress=lambda s: None)
    return lm, out / "b1", out / "b3"


def _speech(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(FRAMES * FRAME) / 24000
    return (rng.standard_normal(t.shape) * (0.05 + 0.25 * np.abs(np.sin(2.1 * t)))
            ).astype(np.float32)


def reference_say(mimi, lm, pcm: np.ndarray, sp, text: str, say_step: int):
    """moshi's greedy pipeline with moshi's StateMachine applied to the sampled text token
    from `say_step` until it reports the end -> (emitted frames [9] or None, audio, state,
    the entries)."""
    from moshi_pipeline import ReferencePipeline

    tts = _moshi()
    machine = tts.StateMachine(tts.TokenIds(lm.text_card + 1), max_padding=6,
                               initial_padding=2)
    entries = _entries(sp, text)
    state = machine.new_state(entries)
    step = itertools.count()

    def on_text(token):
        t = next(step)
        if t >= say_step and state.end_step is None:
            token[0] = machine.process(t, state, int(token[0]))[0]

    frames, audio = [], []
    with ReferencePipeline(mimi, lm) as ref:
        ref.gen.on_text_hook = on_text
        for i in range(FRAMES):
            f, a = ref.step(pcm[i * FRAME:(i + 1) * FRAME])
            frames.append(f)
            audio.append(a)
    return frames, np.concatenate(audio), state, entries


@pytest.fixture(scope="module")
def reference(short_context, tiny_mimi_ref, spm_model):
    from moshi_reference import tie_free

    lm = short_context[0]
    say_step = arrival_step(SAY_AT, RATE)
    pcm, run = tie_free(lambda x: reference_say(tiny_mimi_ref, lm, x, spm_model[1], SCRIPT,
                                                say_step), _speech)
    frames, audio, state, entries = run
    assert state.end_step is not None and state.end_step < FRAMES - 2  # every word was said
    return pcm, frames, audio, state, entries, say_step


def _snr_db(got: np.ndarray, want: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(want ** 2) / max(np.sum((got - want) ** 2), 1e-30)))


def test_run_say_equals_moshis_pipeline_with_its_tts_machine(short_context, reference,
                                                            tmp_path):
    """`run --greedy --no-persona --say TEXT --say-at S` = the reference: the same text record
    per frame, the same agent audio (>= 30 dB SNR at the same alignment), every word said in
    order, each starting at the step moshi's transcript gives it."""
    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.words.text import TextTokenizer

    _, model_dir, _ = short_context
    pcm, ref_frames, ref_audio, state, entries, say_step = reference
    sf.write(tmp_path / "in.wav", pcm, 24000, subtype="FLOAT")
    rc = main(["run", "--model", str(model_dir), "--input", str(tmp_path / "in.wav"),
               "--output", str(tmp_path / "out.wav"), "--text-out", str(tmp_path / "t.json"),
               "--greedy", "--no-persona", "--say", SCRIPT, "--say-at", str(SAY_AT),
               "--device", "cpu"])
    assert rc == 0
    model = Model.load(model_dir, device="cpu")
    text: TextTokenizer = model.text
    want = [text.record(None if f is None else int(f[0])) for f in ref_frames]
    assert json.loads((tmp_path / "t.json").read_text()) == want
    audio, rate = sf.read(tmp_path / "out.wav", dtype="float32")
    assert rate == 24000 and audio.shape == ref_audio.shape
    assert _snr_db(audio, ref_audio) >= 30

    # what was fed between the say and the machine's end: the words' pieces, in order
    ref_text = [int(f[0]) for f in ref_frames[say_step + 1:state.end_step + 2]]
    pieces = [t for t in ref_text if t not in (TEXT_PAD, TEXT_EPAD)]
    assert pieces == [t for e in entries for t in e.tokens]
    assert "tea" in "".join(model.text.piece(t) for t in pieces)

    # the same through the API: tokens exactly, each word started at moshi's step
    with model.conversation(persona=False, greedy=True) as conv:
        got = []
        for i in range(FRAMES):
            if i == say_step:
                utterance = conv.say(SCRIPT)
            conv.step(pcm[i * FRAME:(i + 1) * FRAME])
            got.append(None if conv.core.last_frame is None else conv.core.last_frame.copy())
        events = conv.say_events()
    for i, (g, r) in enumerate(zip(got, ref_frames)):
        assert (g is None) == (r is None), i
        if g is not None:
            np.testing.assert_array_equal(g, r, err_msg=f"frame {i}")
    assert utterance.words == ("your", "tea", "is", "ready")
    assert [(e.word, e.step) for e in events if e.kind == "started"] == state.transcript
    assert [e.word for e in events if e.kind == "done"] == list(utterance.words)
    assert [e.last for e in events if e.kind == "done"] == [False, False, False, True]
    assert not conv.saying


def test_one_row_of_a_lockstep_batch_says_words_the_others_go_on_as_without(short_context,
                                                                           reference):
    """A batch-3 export of the same checkpoint: row 1 says the script and equals the
    reference; rows 0 and 2 (greedy, and sampled) equal their own runs
    without any say, alone on the model."""
    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.conversation import step_many
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.sampling import SamplingParams

    _, _, batch_dir = short_context
    pcm, ref_frames, ref_audio, _, _, say_step = reference
    model = Model.load(batch_dir, device="cpu")
    assert model.batch == 3
    settings = [(SamplingParams(greedy=True), Persona(enabled=False)),
                (SamplingParams(greedy=True), Persona(enabled=False)),
                (SamplingParams(seed=5), Persona(enabled=False))]
    inputs = [_speech(40), pcm, _speech(41)]

    def alone(k):
        with model.open_conversation(*settings[k]) as conv:
            conv.prefill()
            return [conv.step(inputs[k][i * FRAME:(i + 1) * FRAME])[0].copy()
                    for i in range(FRAMES)]

    want = {k: np.concatenate(alone(k)) for k in (0, 2)}
    convs = [model.open_conversation(*s) for s in settings]
    for conv in convs:
        conv.prefill()
    assert len({id(c.group) for c in convs}) == 1
    audio, frames = [[] for _ in convs], []
    for i in range(FRAMES):
        if i == say_step:
            convs[1].say(SCRIPT)
        out = step_many({c: inputs[k][i * FRAME:(i + 1) * FRAME] for k, c in enumerate(convs)})
        for k, c in enumerate(convs):
            audio[k].append(out[c][0].copy())
        frames.append(None if convs[1].last_frame is None else convs[1].last_frame.copy())
    for k in (0, 2):
        np.testing.assert_array_equal(np.concatenate(audio[k]), want[k], err_msg=f"row {k}")
    for i, (g, r) in enumerate(zip(frames, ref_frames)):
        assert (g is None) == (r is None), i
        if g is not None:
            np.testing.assert_array_equal(g, r, err_msg=f"frame {i}")
    assert _snr_db(np.concatenate(audio[1]), ref_audio) >= 30
    assert [e.kind for e in convs[1].say_events()].count("done") == 4
    assert convs[0].say_events() == [] and convs[2].say_events() == []


# ---- the rest of the core ------------------------------------------------------------------------

PROMPT = "You are a helpful robot."


def _talk(conv, frames: int, say_at: int | None, text: str = "hello there friend"):
    """Steps `frames` frames of silence, saying `text` before step `say_at`: -> the emitted
    frames [frames, 9], whether words steered each step."""
    out, steered = [], []
    for i in range(frames):
        if i == say_at:
            conv.say(text)
        steered.append(conv.saying)
        conv.step(np.zeros(FRAME, np.float32))
        last = conv.core.last_frame  # None before the first frame without a persona
        out.append(np.full(9, -2) if last is None else last.copy())
    return np.array(out), steered


def test_say_after_a_persona_and_from_the_persona_cache(demo_model_dir):
    """Sampled, after a voice and text persona: the words are said in order; before they
    arrive the conversation is the one without say; a second conversation whose persona comes
    from the cache says them exactly as the first."""
    from personaplex_edge.runtime.api import Model

    model = Model.load(demo_model_dir, device="cpu")
    runs = []
    for say_at in (None, 6, 6):
        with model.conversation(text_prompt=PROMPT, voice="NATM1", seed=4) as conv:
            frames, steered = _talk(conv, 40, say_at)
            runs.append((conv.persona_cached, frames, conv.say_events(), conv.text, steered))
    assert [r[0] for r in runs] == [False, True, True]
    np.testing.assert_array_equal(runs[1][1], runs[2][1])
    assert runs[1][2] == runs[2][2]
    # the say arrives at step 6: the frames emitted before are the same (the one emitted at
    # step 6 holds codebooks 1..7 that its depformer sampled after the steered token)
    np.testing.assert_array_equal(runs[0][1][:6], runs[1][1][:6])
    assert not np.array_equal(runs[0][1][6], runs[1][1][6])
    assert not np.array_equal(runs[0][1], runs[1][1])
    events = runs[1][2]
    assert [(e.kind, e.word) for e in events] == [
        ("started", "hello"), ("done", "hello"), ("started", "there"), ("done", "there"),
        ("started", "friend"), ("done", "friend")]
    assert " hello there friend" in runs[1][3] and "hello there" not in runs[0][3]
    prompt_frames = events[0].step - 6 - 2  # the first word: 2 forced PADs after its arrival
    assert prompt_frames == model.conversation(text_prompt=PROMPT, voice="NATM1").prompt_frames
    assert runs[1][4][6] and not runs[1][4][-1]  # the model's own text is back at the end


def test_an_idle_queue_leaves_the_frame_as_it_was(demo_model_dir, monkeypatch):
    """Without words queued the LM runs without a steer (nothing extra per frame); with words,
    exactly the frames from their arrival to the machine's end are steered."""
    from personaplex_edge.runtime.api import Model

    model = Model.load(demo_model_dir, device="cpu")
    with model.conversation(persona=False, greedy=True) as conv:
        lm, steers = conv.core.group.lm, []
        run = lm.run
        monkeypatch.setattr(lm, "run", lambda rows, m=None, steer=None:
                            (steers.append(steer), run(rows, m, steer))[1])
        _, steered = _talk(conv, 30, 4, "tea")
    assert [s is not None for s in steers] == steered
    assert steered[:4] == [False] * 4 and steered[4] and not steered[-1]


def test_close_and_restart_drop_the_words_for_the_next_owner(demo_model_dir):
    from personaplex_edge.runtime.api import Model

    model = Model.load(demo_model_dir, device="cpu")
    conv = model.open_conversation()
    conv.prefill()
    conv.say("one two three")
    conv.restart()
    assert [e.kind for e in conv.say_events()] == ["cancelled"] * 3 and not conv.saying
    conv.say("four five")
    conv.close()
    with model.open_conversation() as other:  # the same row, taken again
        assert other.row == conv.row and not other.saying
        other.step(np.zeros(FRAME, np.float32))
        assert other.say_events() == []


@pytest.mark.parametrize("library", ["tensorrt", "tensorrt-rtx"])
def test_simulated_gpu_say_reads_the_token_back_and_replays_the_frame_otherwise(
        tiny_export, tmp_path, monkeypatch, library):
    """Host-side plumbing on the simulated GPU (tests/fake_gpu.py), with either library: on
    TensorRT the steered frames run the linked pair eagerly, the token read back, steered and
    written to the depformer's input on the device; the others replay the captured frame. The
    tokens equal onnxruntime's on the CPU."""
    import dataclasses

    import fake_gpu

    from personaplex_edge.manifest import load_model_dir, write_manifest
    from personaplex_edge.runtime.api import Model

    monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "cache"))
    model_dir, cuda = fake_gpu.simulated_copy(tiny_export, tmp_path / "model", monkeypatch,
                                              library)
    cpu = Model.load(model_dir, device="cpu")
    write_manifest(model_dir, dataclasses.replace(load_model_dir(model_dir), backend="tensorrt"))
    gpu = Model.load(model_dir)
    runs = []
    for model in (cpu, gpu):
        with model.conversation(persona=False, greedy=True) as conv:
            launches = cuda.launches
            runs.append(_talk(conv, 36, 3, "tea is ready"))
            events = conv.say_events()
        assert [e.kind for e in events].count("done") == 3
    np.testing.assert_array_equal(runs[1][0], runs[0][0])
    steered = sum(runs[1][1])
    assert 10 < steered < 36 and cuda.launches - launches == 36 - steered


RUN = ["run", "--model", "demo", "--input", "in.wav", "--output", "out.wav"]


@pytest.mark.parametrize("flags, says", [
    (["--say", "A", "--say", "B", "--say-at", "6"], [("A", None), ("B", 6.0)]),
    (["--say", "A", "--say-at", "2", "--say", "B"], [("A", 2.0), ("B", None)]),
    (["--say", "A", "--say-at", "0.4", "--say", "B", "--say-at", "1"], [("A", 0.4), ("B", 1.0)]),
])
def test_each_say_at_times_the_say_before_it(flags, says):
    from personaplex_edge.cli import parse_args

    assert parse_args(RUN + flags).says == says


@pytest.mark.parametrize("flags, said", [
    (["--say-at", "3", "--say", "hi"], "--say-at 3 before any --say"),
    (["--say", "hi", "--say-at", "1", "--say-at", "2"], "a second --say-at for --say 'hi'"),
    (["--say", "hi", "--say-at", "-1"], "seconds from the start of the input, >= 0"),
    (["--say", "hi", "--say-at", "nan"], "seconds from the start of the input, >= 0"),
])
def test_a_say_at_without_its_say_is_refused(flags, said, capsys):
    from personaplex_edge.cli import parse_args

    with pytest.raises(SystemExit) as exit_:
        parse_args(RUN + flags)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err and err.count("error:") == 1


def test_run_says_each_text_at_its_own_time(demo_model_dir, tmp_path, capsys):
    """`--say one --say two --say-at 2`: "one" from the start (its EPAD 2 steps in), "two" at
    2 s (step 25, its EPAD at 27), whatever the order of the flags' kinds."""
    sf.write(tmp_path / "in.wav", np.zeros(4 * 24000, np.float32), 24000)
    assert main(["run", "--model", str(demo_model_dir), "--input", str(tmp_path / "in.wav"),
                 "--output", str(tmp_path / "out.wav"), "--greedy", "--no-persona",
                 "--device", "cpu", "--say", "one", "--say", "two", "--say-at", "2"]) == 0
    said = capsys.readouterr().err
    assert "said: one @2, two @27" in said, said


def test_bench_say_measures_against_a_tree_without_say(tmp_path):
    """benchmarks/bench_say.py's idle figures compare this tree with one that has no word
    queue: its default baseline has no runtime/words/say.py, and a ref that has one is refused."""
    import subprocess

    import bench_say

    ref = bench_say.default_baseline()
    listed = subprocess.run(["git", "ls-tree", "--name-only", ref, "runtime/words/say.py"],
                            cwd=bench_say.ROOT, capture_output=True, text=True, check=True)
    assert listed.stdout == "" and subprocess.run(
        ["git", "cat-file", "-e", f"{ref}:runtime/lockstep.py"], cwd=bench_say.ROOT).returncode == 0
    with pytest.raises(SystemExit, match="compare the word queue with itself"):
        bench_say.baseline_tree("HEAD", tmp_path)
