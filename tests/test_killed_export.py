"""A real export killed part-way (kill -9, as the kernel's OOM killer does to a 7B export): it
leaves its hidden staging directory, never touches the previous export at the same target, and
the next export of that target removes the leftover, says so, and completes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from personaplex_edge.config import preset
from personaplex_edge.manifest import load_model_dir

STAGE_WAIT_S = 180  # the subprocess imports torch and exports Mimi before the first graph lands


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def _export(ckpt: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "personaplex_edge.cli", "export", "--checkpoint", str(ckpt),
         "--out", str(out), "--verify", "off"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _stages(out: Path) -> list[Path]:
    return sorted(p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.partial-"))


def test_a_killed_export_is_cleaned_up_by_the_next_and_never_touches_the_previous(tmp_path):
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    ckpt = write_synthetic_checkpoint(preset("tiny"), tmp_path / "ckpt")
    out = tmp_path / "models" / "tiny"
    export_model(resolve_checkpoint(str(ckpt)), out, progress=lambda s: None)
    previous = _files(out)

    proc = _export(ckpt, out)
    deadline = time.monotonic() + STAGE_WAIT_S
    try:
        while True:  # until the killed export has written a graph into its stage
            stages = _stages(out)
            if stages and (stages[0] / "mimi_encoder.onnx").is_file():
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the export ended or never staged a graph:\n{proc.stdout.read()}")
            time.sleep(0.02)
        assert _files(out) == previous  # the running export does not touch the previous one
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    left = _stages(out)
    assert len(left) == 1 and f"-{proc.pid}-" in left[0].name  # named after the dead writer
    assert _files(out) == previous
    load_model_dir(out)  # the previous export still loads, every hash holds

    again = _export(ckpt, out)
    log, _ = again.communicate(timeout=600)
    assert again.returncode == 0, log
    assert f"removed {left[0]}" in log and "did not finish" in log  # said, with its size
    assert not left[0].exists() and _stages(out) == []
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]
    manifest = load_model_dir(out)
    assert set(manifest.graphs) == {"mimi_encoder", "mimi_decoder", "helium_step",
                                    "depformer_step"}
