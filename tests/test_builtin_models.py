"""Built-in models (demo, tiny) live in the per-user cache, whatever the current directory; on
an install without torch (a board that only runs the runtime) one copied there from a PC is
used, and without one the refusal says where to copy it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from personaplex_edge.model_ref import BUILTIN_RECIPE, RECIPE_FILE

HELLO = Path(__file__).resolve().parents[1] / "personaplex_edge" / "data" / "hello.wav"


def without_torch(args: list[str], cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    """The CLI in a process where torch (and so the export) cannot be imported."""
    code = ("import sys; sys.modules['torch'] = None; from personaplex_edge.cli import main; "
            f"sys.exit(main({args!r}))")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PERSONAPLEX_CACHE": str(cache)}, timeout=120)


def test_without_torch_the_demo_is_refused_with_where_to_copy_it(tmp_path):
    cache = tmp_path / "cache"
    done = without_torch(["run", "--model", "demo", "--input", str(HELLO), "--output", "a.wav"],
                         tmp_path, cache)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs torch" in lines[0]
    assert f"to {cache / 'models' / 'demo'}," in lines[0]  # the place to copy it to
    assert "~/.cache/personaplex-edge/models/demo" in lines[0]  # where a PC has it
    assert "OWNER/NAME" in lines[0] and "[export,cpu]" in lines[0]
    assert not any(tmp_path.iterdir())  # nothing written, here or in the cache


def test_without_torch_a_demo_copied_into_the_cache_runs(demo_model_dir, tmp_path):
    """The demo as a PC exported it, copied to the path the refusal names: `run --model demo`
    uses it from any directory; a copy from an older version is used too (it cannot be
    exported again here), said once."""
    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    shutil.copytree(demo_model_dir, cache / "models" / "demo")
    (cache / "models" / "demo" / RECIPE_FILE).write_text(BUILTIN_RECIPE + "\n")
    run = ["run", "--model", "demo", "--input", str(HELLO), "--output", "a.wav",
           "--text-out", "a.json", "--greedy"]
    done = without_torch(run, work, cache)
    assert done.returncode == 0, done.stderr
    assert "export" not in done.stdout + done.stderr
    frames = json.loads((work / "a.json").read_text())
    assert len(frames) > 50 and (work / "a.wav").stat().st_size > 50 * 1920 * 2

    (cache / "models" / "demo" / RECIPE_FILE).unlink()  # as an older version leaves it
    done = without_torch([*run[:6], "b.wav", "--text-out", "b.json", "--greedy"], work, cache)
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert said.count("older version") == 1 and "using it as it is" in said
    assert json.loads((work / "b.json").read_text()) == frames
