"""A venv of its own for a client this project does not depend on (pipecat, LiveKit Agents):
built once under .venvs/NAME (git-ignored) and reused while it holds the same requirements.
Where pip cannot install them (no index reachable) the calling test is skipped, saying why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def side_venv(name: str, requirements: tuple[str, ...]) -> Path:
    """The python of .venvs/NAME, the venv built first if it is missing or holds others."""
    venv = ROOT / ".venvs" / name
    python, stamp, wanted = venv / "bin" / "python", venv / "installed.txt", " ".join(requirements)
    if python.is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements],
                         capture_output=True, text=True, timeout=900)
    if pip.returncode != 0:
        pytest.skip(f"pip cannot install {wanted}: {pip.stderr.strip()[-300:]}")
    stamp.write_text(wanted)
    return python
