"""`personaplex-edge batch` and `decode`: a Full-Duplex-Bench-like tree, a folder and a manifest
with per-item personas, each answer equal to `run`'s on the file; reruns that skip, shards
that cover every item once, a broken input among good ones, Ctrl-C part way, codes that decode
to the batch's audio, and lockstep rows of different lengths equal to each item alone."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from interrupt import default_sigint
import soundfile as sf
from signals import voiced

from personaplex_edge.cli import main
from personaplex_edge.runtime.batch import BatchProgress, find_items, parse_shard, shard
from personaplex_edge.runtime.batch import progress as progress_module

PROMPT = "You enjoy having a good conversation."


@pytest.fixture
def fdb_tree(tmp_path):
    """Full-Duplex-Bench's layout: sample folders with input.wav (at 16, 24 and 48 kHz; not
    whole frames) and, in one, v1.5's clean_input.wav and metadata.json."""
    root = tmp_path / "fdb"
    for name, seconds, rate in (("sample_a", 2.3, 16000), ("sample_b", 3.1, 24000),
                                ("sample_c", 1.7, 48000)):
        (root / name).mkdir(parents=True)
        sf.write(root / name / "input.wav", voiced(seconds, rate, len(name) + rate % 7), rate,
                 subtype="PCM_16")
    sf.write(root / "sample_b" / "clean_input.wav", voiced(2.0, 24000, 9), 24000,
             subtype="PCM_16")
    (root / "sample_b" / "metadata.json").write_text("{}")
    return root


def _run(model_dir, source, tmp_path, *flags) -> tuple[np.ndarray, list]:
    """What `run` answers to `source` with `flags`: PCM16 samples and the per-frame records."""
    out, text = tmp_path / "run_answer.wav", tmp_path / "run_answer.json"
    assert main(["run", "--model", str(model_dir), "--input", str(source), "--output",
                 str(out), "--text-out", str(text), "--device", "cpu", *flags]) == 0
    return sf.read(out, dtype="int16")[0], json.loads(text.read_text())


def _batch(model_dir, *args) -> int:
    return main(["batch", "--model", str(model_dir), "--device", "cpu", *args])


@pytest.mark.parametrize("workers", [["--workers", "1"], ["--workers", "2", "--threads", "1"]],
                         ids=["one worker", "two workers"])
def test_a_full_duplex_bench_tree_is_answered_beside_each_input_as_run_answers(
        demo_model_dir, fdb_tree, tmp_path, workers):
    assert _batch(demo_model_dir, "--input", str(fdb_tree), "--greedy", *workers) == 0
    inputs = sorted(fdb_tree.rglob("*input.wav"))
    assert len(inputs) == 4
    for source in inputs:
        answer = source.with_name(source.name.replace("input.wav", "output.wav"))
        info = sf.info(answer)
        assert (info.samplerate, info.channels, info.subtype) == (24000, 1, "PCM_16")
        assert abs(info.duration - sf.info(source).duration) < 1 / 16000
        by_run, _ = _run(demo_model_dir, source, tmp_path, "--greedy")
        np.testing.assert_array_equal(sf.read(answer, dtype="int16")[0], by_run,
                                      err_msg=str(source))
    summary = json.loads((fdb_tree / "batch-summary.json").read_text())
    assert summary["counts"]["done"] == 4 and summary["layout"] == "full-duplex-bench"
    assert {r["key"] for r in summary["items"]} == {
        "sample_a/input.wav", "sample_b/clean_input.wav", "sample_b/input.wav",
        "sample_c/input.wav"}


def test_a_folder_and_a_manifest_with_personas_answer_as_run_with_those_flags(
        demo_model_dir, tmp_path):
    folder = tmp_path / "calls"
    (folder / "day1").mkdir(parents=True)
    sf.write(folder / "day1" / "a.flac", voiced(2.0, 22050, 1), 22050)
    sf.write(folder / "b.wav", voiced(1.5, 24000, 2), 24000)
    answers = tmp_path / "answers"
    assert _batch(demo_model_dir, "--input", str(folder), "--output", str(answers),
                  "--seed", "4", "--text-prompt", PROMPT) == 0
    for rel in ("day1/a.flac", "b.wav"):
        by_run, records = _run(demo_model_dir, folder / rel, tmp_path, "--seed", "4",
                               "--text-prompt", PROMPT)
        stem = answers / rel.rsplit(".", 1)[0]
        np.testing.assert_array_equal(sf.read(f"{stem}.wav", dtype="int16")[0], by_run)
        assert json.loads(open(f"{stem}.json").read()) == records

    # a manifest: a persona and a seed per item, the same recording twice
    manifest = tmp_path / "items.jsonl"
    lines = [{"input": "calls/b.wav", "output": "out/b-teacher.wav",
              "text_prompt": "You are a wise teacher.", "voice_prompt": "NATM1", "seed": 7},
             {"input": "calls/b.wav", "output": "out/b-default.wav"},
             {"input": "calls/day1/a.flac", "output": "out/a.wav", "seed": 11}]
    manifest.write_text("# one item a line\n" + "\n".join(json.dumps(x) for x in lines) + "\n")
    assert _batch(demo_model_dir, "--input", str(manifest), "--seed", "3") == 0
    expected = {"b-teacher": ["--text-prompt", "You are a wise teacher.", "--voice-prompt",
                              "NATM1", "--seed", "7"],
                "b-default": ["--seed", "3"], "a": ["--seed", "11"]}
    for name, flags in expected.items():
        source = folder / ("b.wav" if name.startswith("b") else "day1/a.flac")
        by_run, records = _run(demo_model_dir, source, tmp_path, *flags)
        np.testing.assert_array_equal(
            sf.read(tmp_path / "out" / f"{name}.wav", dtype="int16")[0], by_run, err_msg=name)
        assert json.loads((tmp_path / "out" / f"{name}.json").read_text()) == records
    teacher = sf.read(tmp_path / "out" / "b-teacher.wav", dtype="int16")[0]
    assert not np.array_equal(teacher, sf.read(tmp_path / "out" / "b-default.wav",
                                               dtype="int16")[0])


def test_a_rerun_skips_finished_items_and_overwrite_redoes_them(demo_model_dir, fdb_tree):
    assert _batch(demo_model_dir, "--input", str(fdb_tree), "--seed", "1") == 0
    answers = sorted(fdb_tree.rglob("*output.wav"))
    stamps = {p: p.stat().st_mtime_ns for p in answers}
    (answers[0]).unlink()  # one missing: only it is answered again
    assert _batch(demo_model_dir, "--input", str(fdb_tree), "--seed", "1") == 0
    summary = json.loads((fdb_tree / "batch-summary.json").read_text())
    assert summary["counts"] == {"done": 1, "skipped": 3, "failed": 0, "interrupted": 0,
                                 "pending": 0}
    assert all(p.stat().st_mtime_ns == stamps[p] for p in answers[1:])  # untouched
    assert _batch(demo_model_dir, "--input", str(fdb_tree), "--seed", "1", "--overwrite") == 0
    summary = json.loads((fdb_tree / "batch-summary.json").read_text())
    assert summary["counts"]["done"] == 4
    assert all(p.stat().st_mtime_ns != stamps[p] for p in answers[1:])


def test_shards_cover_every_item_once(demo_model_dir, fdb_tree, tmp_path):
    out = tmp_path / "answers"
    for k in (1, 2):
        assert _batch(demo_model_dir, "--input", str(fdb_tree), "--output", str(out),
                      "--shard", f"{k}/2", "--greedy") == 0
    done = [json.loads((out / f"batch-summary-{k}-of-2.json").read_text()) for k in (1, 2)]
    keys = [{r["key"] for r in d["items"] if r["status"] == "done"} for d in done]
    assert keys[0] and keys[1] and not keys[0] & keys[1]
    assert keys[0] | keys[1] == {i.key for i in find_items(fdb_tree).items}
    assert len(list(out.rglob("*output.wav"))) == 4 and not list(fdb_tree.rglob("*output.wav"))
    items = find_items(fdb_tree).items
    assert [i.key for i in shard(items, 2, 2)] == [items[1].key, items[3].key]
    with pytest.raises(Exception, match="K/N"):
        parse_shard("2-of-3")
    with pytest.raises(Exception, match="1..N"):
        parse_shard("3/2")


def test_a_broken_input_fails_alone_and_the_run_exits_1(demo_model_dir, fdb_tree, capsys):
    broken = fdb_tree / "sample_broken"
    broken.mkdir()
    (broken / "input.wav").write_bytes(b"RIFF this is not audio")
    assert _batch(demo_model_dir, "--input", str(fdb_tree), "--greedy") == 1
    said = capsys.readouterr()
    assert "sample_broken/input.wav: failed" in said.err and "1 item(s) failed" in said.err
    if (os.cpu_count() or 1) > 1:  # a batch-1 model on the CPU: a worker per core by default
        assert f"by each of {os.cpu_count()} workers" in said.err
    assert not (broken / "output.wav").exists()
    summary = json.loads((fdb_tree / "batch-summary.json").read_text())
    assert summary["counts"]["done"] == 4 and summary["counts"]["failed"] == 1
    [failed] = [r for r in summary["items"] if r["status"] == "failed"]
    assert failed["key"] == "sample_broken/input.wav" and "cannot read" in failed["error"]


def test_ctrl_c_keeps_what_finished_and_leaves_no_partial_file(demo_model_dir, fdb_tree,
                                                               monkeypatch):
    """Ctrl-C arrives during the third item: the two finished keep their answers, the rest
    have none (no temporary either), the summary says so, and the exit status is 130."""
    finished = []
    original = BatchProgress.item_done

    def item_done(self):
        original(self)
        finished.append(1)

    def advance(self, seconds):
        if len(finished) == 2:
            finished.append("the third item's first tick")
        elif len(finished) > 2:
            raise KeyboardInterrupt  # on its second tick
        self.done_seconds += seconds

    monkeypatch.setattr(BatchProgress, "item_done", item_done)
    monkeypatch.setattr(BatchProgress, "advance", advance)
    assert _batch(demo_model_dir, "--input", str(fdb_tree), "--greedy", "--workers", "1") == 130
    summary = json.loads((fdb_tree / "batch-summary.json").read_text())
    status = {r["key"]: r["status"] for r in summary["items"]}
    assert summary["interrupted"] and sorted(status.values()) == [
        "done", "done", "interrupted", "pending"]
    for r in summary["items"]:
        assert os.path.exists(r["output"]) == (r["status"] == "done")
    assert [p.name for p in fdb_tree.rglob(".*")] == []  # no temporary left


def test_codes_decode_to_the_batchs_audio(demo_model_dir, batch_model_dir, fdb_tree, tmp_path):
    """The seed's second stage: `decode` on the codes equals the audio the batch wrote, on a
    batch-1 and a batch-3 model (a row other than 0 decoded on row 0)."""
    runs = [(demo_model_dir, []), (demo_model_dir, ["--no-persona"]), (batch_model_dir, [])]
    for k, (model_dir, flags) in enumerate(runs):
        out = tmp_path / f"run{k}"
        assert _batch(model_dir, "--input", str(fdb_tree), "--output", str(out), "--codes",
                      "--seed", "5", *flags) == 0
        for answer in sorted(out.rglob("*output.wav")):
            codes = answer.with_name(answer.stem + ".codes.npz")
            with np.load(codes) as z:
                # with a persona every step emits a frame (the first, the persona's last);
                # without one the first step emits none
                silent = 1 if flags else 0
                assert z["codes"].shape == (-(-z["samples"] // 1920) - silent, 8)
                assert z["text"].shape == (z["codes"].shape[0],)
            decoded = tmp_path / "decoded.wav"
            assert main(["decode", "--model", str(model_dir), "--codes", str(codes),
                         "--output", str(decoded), "--device", "cpu"]) == 0
            np.testing.assert_array_equal(sf.read(decoded, dtype="int16")[0],
                                          sf.read(answer, dtype="int16")[0], err_msg=str(codes))


def test_lockstep_rows_of_different_lengths_equal_each_item_alone(
        demo_model_dir, batch_model_dir, fdb_tree, tmp_path, monkeypatch):
    """Four items of different lengths on a batch-3 model: rows join and leave as items start
    and end; each answer equals that item alone (one row at a time) and run on the batch-1
    export of the same weights. Items are read only when their row starts."""
    from personaplex_edge.runtime.batch import runner

    reads, open_when_read = [], []
    real_read = runner.read_audio

    def counting_read(path, rate):
        open_when_read.append(len(reads) - sum(1 for _ in finished))
        reads.append(path)
        return real_read(path, rate)

    finished = []
    original = BatchProgress.item_done

    def item_done(self):
        original(self)
        finished.append(1)

    monkeypatch.setattr(runner, "read_audio", counting_read)
    monkeypatch.setattr(BatchProgress, "item_done", item_done)
    together, alone = tmp_path / "together", tmp_path / "alone"
    assert _batch(batch_model_dir, "--input", str(fdb_tree), "--output", str(together),
                  "--seed", "8") == 0
    assert max(open_when_read) <= 3  # never more items in memory than rows
    ran = json.loads((together / "batch-summary.json").read_text())
    frames = sum(r["frames"] for r in ran["items"])
    assert ran["batch"] == 3 and frames / 3 <= ran["ticks"] < frames  # rows shared ticks
    assert _batch(batch_model_dir, "--input", str(fdb_tree), "--output", str(alone),
                  "--seed", "8", "--rows", "1") == 0
    for answer in sorted(together.rglob("*output.wav")):
        rel = answer.relative_to(together)
        mine = sf.read(answer, dtype="int16")[0]
        np.testing.assert_array_equal(mine, sf.read(alone / rel, dtype="int16")[0])
        source = fdb_tree / rel.parent / rel.name.replace("output", "input")
        by_run, _ = _run(demo_model_dir, source, tmp_path, "--seed", "8")
        np.testing.assert_array_equal(mine, by_run, err_msg=str(rel))


def test_progress_is_a_bar_on_a_terminal_and_lines_in_a_log(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    clock = iter(range(0, 10000, 1))
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: float(next(clock)))
    tty, log = Terminal(), io.StringIO()
    for stream in (tty, log):
        p = BatchProgress(items=2, audio_seconds=7200.0, stream=stream, interval=5)
        for _ in range(12):
            p.advance(300.0)
        p.item_done()
        p.say("x.wav: failed: cannot read it")
        p.close()
    assert "\r" in tty.getvalue() and "[####" in tty.getvalue()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and "x.wav: failed: cannot read it" in lines
    assert 2 <= sum(line.startswith("batch: ") for line in lines) <= 6  # every 5 s, not per call
    import re

    last = re.fullmatch(r"batch: 1/2 items, 1:00:00 of 2:00:00 of audio, ([\d.]+)x real time, "
                        r"0:(\d\d) elapsed, 0:(\d\d) left", lines[-1])
    assert last, lines[-1]
    speed, elapsed, left = float(last[1]), int(last[2]), int(last[3])
    assert abs(speed * elapsed - 3600) <= speed and left == elapsed  # half done, steady pace


def test_a_real_ctrl_c_with_two_workers_stops_cleanly(demo_model_dir, tmp_path):
    """SIGINT to the process while two worker threads step items: exit 130, the summary
    written, each answer there exactly when its item is done, no temporary left."""
    import signal
    import subprocess
    import sys
    import time

    root = tmp_path / "long"
    for k in range(6):
        (root / f"s{k}").mkdir(parents=True)
        sf.write(root / f"s{k}" / "input.wav", voiced(40.0, 24000, k), 24000, subtype="PCM_16")
    proc = subprocess.Popen([sys.executable, "-m", "personaplex_edge.cli", "batch", "--model",
                             str(demo_model_dir), "--device", "cpu", "--input", str(root),
                             "--greedy", "--no-persona", "--workers", "2", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)
    deadline = time.time() + 120
    while not list(root.rglob("output.wav")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    summary = json.loads((root / "batch-summary.json").read_text())
    assert summary["interrupted"] and 1 <= summary["counts"]["done"] < 6
    for r in summary["items"]:
        assert os.path.exists(r["output"]) == (r["status"] == "done"), r
    assert [p.name for p in root.rglob(".*")] == []
    assert b"Traceback" not in err
