"""Lockstep batches: a batch-B model steps B conversations in one call of each graph per tick,
and each row's conversation is exactly what it is alone; `bench --streams` measures it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from personaplex_edge.cli import main
from personaplex_edge.runtime.conversation import step_many
from personaplex_edge.runtime.api import Model
from personaplex_edge.runtime.persona import Persona
from personaplex_edge.runtime.sampling import SamplingParams

FRAME = 1920
BATCH = 3  # conftest.batch_model_dir exports the demo model at this batch


def _noise(frames: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(frames * FRAME) * 0.1).astype(np.float32)


SETTINGS = [(SamplingParams(greedy=True), Persona(text_prompt="You are a helpful robot.")),
            (SamplingParams(seed=3), Persona(text_prompt="Be brief.", voice="NATM1")),
            (SamplingParams(seed=4), Persona(enabled=False))]


def test_rows_joining_and_leaving_equal_each_conversation_alone(batch_model_dir,
                                                                demo_model_dir):
    """Three conversations in one batch of 3: the second joins 6 ticks in, the third 21 ticks
    in (so the rows run at different positions), the second brings no frame to every fifth
    tick (its row is held), the first leaves after 40 frames, and a fourth takes its row.
    Each conversation's answer (greedy and sampled) equals that conversation run alone on the
    same model, and on the batch-1 export of the same weights."""
    model = Model.load(batch_model_dir, device="cpu")
    assert model.batch == BATCH
    n = 40
    pcm = [_noise(n, 10 + k) for k in range(4)]
    settings = SETTINGS + [(SamplingParams(seed=9), Persona(text_prompt="Hello."))]

    def alone(k, on=model):
        with on.open_conversation(*settings[k]) as conv:
            conv.prefill()
            return np.concatenate([conv.step(pcm[k][i * FRAME:(i + 1) * FRAME])[0].copy()
                                   for i in range(n)])

    want = [alone(k) for k in range(4)]
    single = Model.load(demo_model_dir, device="cpu")  # the same checkpoint, --batch 1
    assert single.batch == 1
    for k in range(4):
        np.testing.assert_array_equal(alone(k, single), want[k], err_msg=f"batch 1, conv {k}")
    starts = {0: 0, 1: 6, 2: 21, 3: 44}
    convs: dict[int, object] = {}
    got: dict[int, list] = {k: [] for k in range(4)}
    done = set()
    for tick in range(44 + n):
        for k, start in starts.items():
            if tick == start:
                convs[k] = model.open_conversation(*settings[k])
                convs[k].prefill()
        frames = {}
        for k, conv in convs.items():
            if k in done or (k == 1 and tick % 5 == 0):  # the second misses every fifth tick
                continue
            frames[conv] = pcm[k][len(got[k]) * FRAME:(len(got[k]) + 1) * FRAME]
        for conv, (audio, _) in step_many(frames).items():
            k = next(k for k, c in convs.items() if c is conv)
            got[k].append(audio.copy())
            if len(got[k]) == n:
                done.add(k)
                if k == 0:
                    conv.close()
    assert len({id(c.group) for c in convs.values()}) == 1  # one batch served all four
    assert convs[3].row == convs[0].row  # the free row was taken again
    for k in range(4):
        assert len(got[k]) == n, k
        np.testing.assert_array_equal(np.concatenate(got[k]), want[k], err_msg=f"conv {k}")
    assert not np.array_equal(want[1], want[2])


def test_a_tick_is_one_call_of_each_graph_for_all_rows(batch_model_dir, monkeypatch):
    model = Model.load(batch_model_dir, device="cpu")
    convs = [model.open_conversation(s, p) for s, p in SETTINGS]
    for c in convs:
        c.prefill()
    group = convs[0].group
    calls = []
    for g in (group.encoder, group.decoder, group.helium, group.depformer):
        run = g.run
        monkeypatch.setattr(g, "run", lambda active=None, _run=run, _g=g:
                            (calls.append((_g.entry.file, active)), _run(active))[1])
    graphs = sorted(["mimi_encoder.onnx", "helium_step.onnx", "depformer_step.onnx",
                     "mimi_decoder.onnx"])
    step_many({c: _noise(1, k) for k, c in enumerate(convs)})
    # the conversation without a persona has no complete agent frame yet: nothing to decode
    assert sorted(f for f, _ in calls) == graphs
    assert [sorted(a) for f, a in calls if f == "mimi_decoder.onnx"] == [[0, 1]]
    calls.clear()
    step_many({c: _noise(1, k) for k, c in enumerate(convs)})
    assert sorted(f for f, _ in calls) == graphs
    assert all(sorted(active) == [0, 1, 2] for _, active in calls), calls


def test_bench_streams_json_and_plot(batch_model_dir, tmp_path, capsys):
    """`bench --streams 4` on a batch-3 model: two ticks per round; the JSON holds every
    frame's stage times of every stream; --plot draws them."""
    rc = main(["bench", "--model", str(batch_model_dir), "--frames", "12", "--warmup", "2",
               "--streams", "4", "--no-persona", "--device", "cpu", "--json",
               str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "2 tick(s) of batch 3" in out and "streams keep up" in out
    data = json.loads((tmp_path / "b.json").read_text())
    frames = np.array(data["frames"])  # [streams, frames, stages + 1]
    assert frames.shape == (4, 12, len(data["stages"])) and data["stages"][-1] == "frame"
    assert len(data["rounds"]) == 12 and data["batch"] == 3
    # per stream, the stages add up to the frame's time (host takes what is not a stage)
    np.testing.assert_allclose(frames[..., :-1].sum(-1), frames[..., -1], atol=0.01)  # 3 decimals
    assert data["largest_streams"] % 3 == 0 and data["largest_streams"] >= 3
    # per tick, per stage: 2 ticks per round (3 rows + 1 row), each a call of every graph
    ticks = data["tick_stages"]
    assert ticks["frames"] == 2 * 12
    assert all(ticks[s]["p50"] > 0 for s in ("encode", "temporal", "depformer", "decode"))
    assert ticks["frame"]["p99"] == pytest.approx(data["tick"]["p99"])
    assert "per tick (one call of each graph" in out
    from personaplex_edge.runtime.audio_io import speexdsp

    # the canceller in front of each stream, as --mic runs it; --aec off leaves it out
    assert ("aec" in data["per_stream"][0]) == (speexdsp.load() is not None)
    assert main(["bench", "--model", str(batch_model_dir), "--frames", "3", "--warmup", "1",
                 "--no-persona", "--device", "cpu", "--aec", "off", "--json",
                 str(tmp_path / "off.json")]) == 0
    assert "aec" not in json.loads((tmp_path / "off.json").read_text())["per_stream"][0]
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_plot_without_matplotlib_is_one_message(batch_model_dir, tmp_path):
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'matplotlib':\n"
            "            raise ImportError('blocked')\n"
            "sys.meta_path.insert(0, Block())\n"
            "from personaplex_edge.cli import main\n"
            f"sys.exit(main(['bench', '--model', {str(batch_model_dir)!r}, '--frames', '2', "
            f"'--plot', {str(tmp_path / 'p.png')!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "--plot needs matplotlib" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "p.png").exists()


def test_a_cold_persona_lets_the_other_rows_tick_between_its_calls(batch_model_dir,
                                                                     monkeypatch):
    """A persona prefilled on a row while another row of its group is live runs in calls of
    PREFILL_CHUNK frames, each under its own hold of the group's lock: the live row's ticks
    wait for one call, never for the whole prompt. Alone in its group, it is one call."""
    from personaplex_edge.runtime import lockstep

    model = Model.load(batch_model_dir, device="cpu")
    live = model.open_conversation(SamplingParams(greedy=True), Persona(enabled=False))
    group = live.group

    class Recorded:
        """The group's lock, counting its holds and the Helium calls made in each."""

        def __init__(self, lock):
            self.lock, self.holds = lock, []

        def __enter__(self):
            self.lock.acquire()
            self.holds.append(0)

        def __exit__(self, *exc):
            self.lock.release()

    recorded = Recorded(group.lock)
    monkeypatch.setattr(group, "lock", recorded)
    run_frames = group.helium.run_frames

    def counted(frames, active):
        recorded.holds[-1] += 1
        return run_frames(frames, active)

    monkeypatch.setattr(group.helium, "run_frames", counted)
    with model.open_conversation(SamplingParams(greedy=True),
                                 Persona(text_prompt="You are a helpful robot.")) as cold:
        frames = cold.prefill()
    forced = frames - 1
    assert forced > 2 * lockstep.PREFILL_CHUNK
    calls = [n for n in recorded.holds if n]
    assert calls == [1] * -(-forced // lockstep.PREFILL_CHUNK)  # one call per hold
    live.close()
    recorded.holds.clear()
    with model.open_conversation(SamplingParams(greedy=True),
                                 Persona(text_prompt="You are a helpful robot.",
                                         voice="NATM1")) as alone:
        alone.prefill()
    assert [n for n in recorded.holds if n] == [1]
