"""JetPack 6's Python is 3.10, and the tests run on a newer one: vermin reads the code
that ships (the runtime, the shared core, the export) and names every module, member, keyword
or syntax that needs a newer Python than pyproject's requires-python."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vermin")

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["runtime", "personaplex_edge", "export"]


def minimum_python() -> str:
    """requires-python's lower bound, read from pyproject.toml (tomllib is 3.11's)."""
    found = re.search(r'^requires-python\s*=\s*">=(\d+\.\d+)"', (ROOT / "pyproject.toml").read_text(),
                      re.MULTILINE)
    assert found, "pyproject.toml names no requires-python lower bound"
    return found.group(1)


def vermin(*paths: str) -> subprocess.CompletedProcess:
    # 'file': vermin takes any attribute of that name for Python 2's file() builtin
    return subprocess.run([sys.executable, "-c", "import vermin, sys; sys.exit(vermin.main())",
                           f"--target={minimum_python()}-", "--no-tips", "--violations",
                           "--exclude", "file", *paths],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_shipped_code_needs_no_python_newer_than_requires_python():
    assert minimum_python() == "3.10"  # JetPack 6
    done = vermin(*SHIPPED)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Minimum required versions" in done.stdout  # it analysed something


def test_the_check_names_what_a_newer_python_brought(tmp_path):
    (tmp_path / "new.py").write_text("import tomllib\nfrom typing import Self\n\n\n"
                                     "def f():\n    try:\n        pass\n    except* ValueError:\n"
                                     "        pass\n")
    done = vermin(str(tmp_path))
    assert done.returncode != 0
    for what in ("'tomllib' module requires !2, 3.11", "'typing.Self' member requires !2, 3.11",
                 "`except*` requires !2, 3.11"):
        assert what in done.stdout, done.stdout
