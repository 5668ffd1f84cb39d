"""In CI (.ci/run sets PERSONAPLEX_CI=1) a test that skips for a part scripts/install.sh installs
fails, whether it skips as it runs, by a skipif mark or at its module's import; a skip declared
not installable (tests/ci_parts.py: no GPU) stays a skip. Every skip's reason is listed at the
end of a run, with or without CI. Checked on a probe suite run with this directory's
conftest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PROBES = {
    "test_module_skip.py": 'import pytest\npytest.importorskip("no_such_part")\n\n'
                           "def test_never():\n    pass\n",
    "test_probes.py": (
        "import pytest\nfrom ci_parts import not_installable\n\n"
        '@pytest.mark.skipif(True, reason="no libfoo (apt-get install libfoo)")\n'
        "def test_marked():\n    pass\n\n"
        "def test_skips_as_it_runs():\n    pytest.skip(\"PulseAudio would not start\")\n\n"
        "def test_no_gpu():\n    pytest.skip(not_installable(\"no usable CUDA device\"))\n\n"
        "def test_passes():\n    pass\n"),
}


def _run(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "ci_parts.py", "webgpu_env.py"):  # what conftest imports
        shutil.copy(HERE / name, tmp_path / name)
    for name, text in PROBES.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "PERSONAPLEX_CI"}
    if ci:
        env["PERSONAPLEX_CI"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


@pytest.mark.parametrize("ci", [False, True], ids=["outside CI", "in CI"])
def test_a_skip_for_an_installable_part_fails_in_ci_and_every_skip_is_listed(tmp_path, ci):
    done = _run(tmp_path, ci)
    out = done.stdout
    if ci:
        assert done.returncode == 1, out
        assert "1 failed, 1 passed, 1 skipped, 2 errors" in out, out
        assert "FAILED test_probes.py::test_skips_as_it_runs - skipped in CI" in out
        assert "ERROR test_probes.py::test_marked - skipped in CI" in out
        assert "ERROR test_module_skip.py - skipped in CI" in out
        assert "1 skipped" in out and "not installable: no usable CUDA device" in out
    else:
        assert done.returncode == 0, out
        assert "1 passed, 4 skipped" in out
        listed = out[out.index("- 4 skipped -"):]
        for reason in ("could not import 'no_such_part'", "no libfoo (apt-get install libfoo)",
                       "PulseAudio would not start", "no usable CUDA device"):
            assert reason in listed, (reason, listed)
