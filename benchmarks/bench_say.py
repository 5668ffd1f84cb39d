"""`say` in figures: how soon words start, how fast they go, and what an idle word queue costs a
frame, side by side with a baseline tree that has no word queue at all (by default the commit
before runtime/say.py, now runtime/words/say.py, was added).

    python benchmarks/bench_say.py [--model demo|tiny|mid] [--frames 400] [--rounds 5]
                                   [--baseline REF] [--work DIR] [--json out.json]

1. Latency: texts said at several steps of a conversation (sampled, seeded; and greedy): steps
   from say() to the first word's EPAD (the "started" event; moshi's machine forces it at
   initial_padding = 2 steps, 160 ms, when the model does not ask sooner), and to the frame that
   carries it out of the conversation (one step later).
2. Pace: words per second from the first word's EPAD to the last word's last token, and frames
   per word. On random weights the model rarely asks for a word by itself, so the machine forces
   one after max_padding (6) PADs: a real model's pace is its own and faster.
3. The idle queue: frame times of a conversation that never says anything, this tree against
   `--baseline` (a git ref without the word queue, exported with `git archive` into the work
   directory and imported instead of this tree; a ref that has it is refused: the comparison
   would be of the queue with itself), in alternating child processes, so the machine's other
   load falls on both alike; plus the idle path's own host time per frame, timed alone.

Run it on a quiet machine: the idle difference is far below the frame time's own jitter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

TEXT = "the kettle has boiled and your tea is ready in the kitchen"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def signal(frames: int, seed: int = 0) -> np.ndarray:
    """Voiced noise, frames x 1920 samples (the conversation hears something)."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames * 1920) / 24000
    return (rng.standard_normal(t.shape) * (0.05 + 0.25 * np.abs(np.sin(2.1 * t)))
            ).astype(np.float32)


# -- 1 and 2: latency and pace --------------------------------------------------------------------
def say_figures(model_dir: Path, says: int = 6) -> dict:
    from personaplex_edge.runtime.api import Model

    model = Model.load(model_dir, device="cpu")
    words = len(TEXT.split())
    rows = []
    for k in range(says):
        greedy = k % 2 == 1
        with model.conversation(persona=False, greedy=greedy, seed=k) as conv:
            pcm, at = signal(200, seed=k), 5 + 7 * k
            for i in range(200):
                if i == at:
                    conv.say(TEXT)
                conv.step(pcm[i * 1920:(i + 1) * 1920])
                if i > at and not conv.saying:
                    break
            events = conv.say_events()
        started = [e.step for e in events if e.kind == "started"]
        done = [e.step for e in events if e.kind == "done"]
        assert len(started) == len(done) == words, "the text was not said within 200 frames"
        frames = done[-1] - started[0] + 1
        rows.append({"greedy": greedy, "say_step": at, "to_epad": started[0] - at,
                     "to_epad_out": started[0] - at + 1, "frames": frames,
                     "words_per_s": words / (frames / 12.5), "frames_per_word": frames / words})
    return {"text": TEXT, "words": words, "runs": rows,
            "to_epad_steps": sorted({r["to_epad"] for r in rows}),
            "words_per_s_median": float(np.median([r["words_per_s"] for r in rows]))}


# -- 3: the idle queue ----------------------------------------------------------------------------
def child(model_dir: str, frames: int) -> None:
    """In a child process: per-frame ms of a conversation without say (whichever tree is
    imported), as JSON on stdout."""
    from personaplex_edge.runtime.api import Model

    model = Model.load(model_dir, device="cpu")
    pcm = signal(frames + 20, seed=3)
    with model.conversation(persona=False, greedy=True) as conv:
        times = []
        for i in range(frames + 20):
            t0 = time.perf_counter()
            conv.step(pcm[i * 1920:(i + 1) * 1920])
            times.append(1000 * (time.perf_counter() - t0))
    import personaplex_edge

    print(json.dumps({"tree": str(Path(personaplex_edge.__file__).parent.parent),
                      "ms": times[20:]}))


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def default_baseline() -> str:
    """The last commit without the word queue: the parent of the one that added runtime/say.py
    (since moved into runtime/words/)."""
    added = _git("log", "--diff-filter=A", "--format=%H", "--", "runtime/say.py").split()
    return added[-1] + "^"


def baseline_tree(ref: str, work: Path) -> Path:
    """`ref` of this repository laid out as an importable package (pyproject's package-dir:
    runtime/ and export/ inside personaplex_edge/), under `work`; SystemExit for a ref that
    has a word queue already."""
    sha = _git("rev-parse", ref)
    if _git("ls-tree", "--name-only", sha, "runtime/say.py", "runtime/words/say.py"):
        raise SystemExit(f"--baseline {ref} ({sha[:10]}) has a word queue: the idle figures "
                         "would compare the word queue with itself; give a ref from before it "
                         f"(the default is {default_baseline()})")
    out = work / f"tree-{sha[:12]}"
    if (out / "sha").is_file() and (out / "sha").read_text() == sha:
        return out
    src = work / "src"
    subprocess.run(["rm", "-rf", str(src), str(out)], check=True)
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", sha], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    out.mkdir(parents=True)
    subprocess.run(["cp", "-r", str(src / "personaplex_edge"), str(out / "personaplex_edge")],
                   check=True)
    for room in ("runtime", "export"):
        subprocess.run(["cp", "-r", str(src / room), str(out / "personaplex_edge" / room)],
                       check=True)
    (out / "sha").write_text(sha)
    return out


def run_child(model_dir: Path, frames: int, tree: Path | None) -> dict:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, __file__, "--child", str(model_dir),
                           "--frames", str(frames)], env=env, capture_output=True, text=True,
                          cwd=tempfile.gettempdir())  # not ROOT: its tree must not shadow
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.splitlines()[-1])


def idle_path_ns(model_dir: Path, repeat: int = 200_000) -> float:
    """The host work an idle word queue adds to a frame, timed alone: the tick's check, the
    conversation's collect and hand-over."""
    import timeit

    from personaplex_edge.runtime.api import Model

    model = Model.load(model_dir, device="cpu")
    with model.conversation(persona=False) as conv:
        core, group = conv.core, conv.core.group

        def idle() -> None:
            _ = (lambda text: None) if group._saying else None
            core._collect()
            core._hand_over()

        return 1e9 * min(timeit.repeat(idle, number=repeat, repeat=5)) / repeat


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo", choices=["demo", "tiny", "mid"])
    p.add_argument("--frames", type=int, default=400)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--baseline", help="git ref of a tree without say to compare with "
                                      "(default: the commit before runtime/words/say.py was added)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench_say")
    p.add_argument("--json", type=Path)
    p.add_argument("--child")
    args = p.parse_args()
    if args.child:
        return child(args.child, args.frames)

    from models import exported

    args.baseline = args.baseline or default_baseline()
    tree = baseline_tree(args.baseline, args.work)  # refused before anything is measured
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir = exported(args.model, args.work, log=log)
    result = {"model": args.model, "baseline": {"ref": args.baseline,
                                                "sha": (tree / "sha").read_text()},
              "say": say_figures(model_dir)}
    s = result["say"]
    log(f"say -> first EPAD: {s['to_epad_steps']} steps (the frame out one later); "
        f"{s['words_per_s_median']:.2f} words/s (median of {len(s['runs'])}, "
        f"{s['words']} words)")

    ms: dict[str, list[float]] = {"this": [], args.baseline: []}
    for r in range(args.rounds):  # alternating, so the machine's load falls on both
        for name, t in ((args.baseline, tree), ("this", None)):
            ms[name].extend(run_child(model_dir, args.frames, t)["ms"])
        log(f"round {r + 1}/{args.rounds}")
    idle = {name: {"p50": float(np.percentile(v, 50)), "mean": float(np.mean(v)),
                   "p90": float(np.percentile(v, 90)), "frames": len(v)}
            for name, v in ms.items()}
    idle["idle_path_ns"] = idle_path_ns(model_dir)
    result["idle"] = idle
    for name in (args.baseline, "this"):
        v = idle[name]
        log(f"frame without say, {name:>6}: p50 {v['p50']:.3f} ms, mean {v['mean']:.3f} ms, "
            f"p90 {v['p90']:.3f} ms ({v['frames']} frames)")
    log(f"difference of p50: {idle['this']['p50'] - idle[args.baseline]['p50']:+.3f} ms; "
        f"the idle path alone: {idle['idle_path_ns']:.0f} ns a frame")
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
