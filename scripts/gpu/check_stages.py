"""What the GPU checks (scripts/gpu/gpu_check.py, scripts/gpu/gpu_bare_check.py) share: the
project importable from a bare checkout, an optional time budget, and fenced stages whose
outcome - ok, FAILED with the reason, or skipped with the reason - is printed as it happens and
kept for the JSON report. A GPU machine may be available for one run only, so one stage failing
must never hide the others.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def use_source_tree() -> None:
    """Makes `personaplex_edge` (with its `runtime` and `export` rooms) and benchmarks/
    importable from this checkout, installed or not: a GPU machine without a network cannot
    `pip install -e .`, and pyproject's package-dir maps runtime/ and export/ into the
    package, which plain sys.path entries do not."""
    for path in (ROOT, ROOT / "benchmarks"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    import personaplex_edge

    try:
        import personaplex_edge.runtime  # noqa: F401 - installed (editable or not)
    except ImportError:
        # runtime/ and export/ are found as personaplex_edge.runtime / .export
        personaplex_edge.__path__.append(str(ROOT))


def simulated_cuda():
    """tests/fake_gpu's simulated device as cuda-python's runtime (the checks' --simulate:
    their GPU stages run on the host, checking the checks, saying nothing of a GPU)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import fake_gpu

    from personaplex_edge.runtime.backends import cuda_runtime

    cuda = fake_gpu.FakeCuda()
    cuda_runtime.cudart = lambda: cuda
    return cuda


def say(msg: str = "") -> None:
    print(msg, flush=True)


class Budget:
    """The seconds a check may take (None: no limit); stages that need more are skipped."""

    def __init__(self, seconds: float | None = None):
        self.end = time.monotonic() + (float("inf") if seconds is None else seconds)

    def left(self) -> float:
        return self.end - time.monotonic()


class Skip(Exception):
    """Raised by a stage that cannot run here; its message is the reason."""


class Stages:
    """Fenced stages and their outcomes, in order (`results`, JSON-ready)."""

    def __init__(self, budget: Budget, cpu_only: bool = False):
        self.budget = budget
        self.cpu_only = cpu_only
        self.results: list[dict] = []

    def skip(self, name: str, why: str) -> None:
        self.results.append({"stage": name, "status": "skipped", "detail": why})
        say(f"[skipped] {name}: {why}")

    def run(self, name: str, fn, need_s: float = 0.0, gpu: bool = False):
        """fn() fenced: its return value (None when it failed or was skipped). A str return is
        the stage's one-line detail; a dict may carry "detail" and any figures to report."""
        if gpu and self.cpu_only:
            self.skip(name, "--cpu-only")
            return None
        if self.budget.left() < need_s:
            self.skip(name, f"time budget ({self.budget.left():.0f} s left, needs "
                            f"~{need_s:.0f})")
            return None
        say(f"[....] {name}")
        t0 = time.perf_counter()
        try:
            out = fn()
        except Skip as e:
            self.skip(name, str(e))
            return None
        except Exception as e:  # noqa: BLE001 - the point is to report and go on
            seconds = time.perf_counter() - t0
            self.results.append({"stage": name, "status": "FAILED", "seconds": seconds,
                                 "detail": first_line(e)})
            say(f"[FAILED] {name} ({seconds:.1f} s): {first_line(e)}")
            say("".join(traceback.format_exc().splitlines(keepends=True)[-8:]))
            return None
        seconds = time.perf_counter() - t0
        row = {"stage": name, "status": "ok", "seconds": seconds}
        if isinstance(out, dict):
            row.update(out)
        row.setdefault("detail", out if isinstance(out, str) else "")
        self.results.append(row)
        detail = row["detail"]
        say(f"[ok] {name} ({seconds:.1f} s){': ' + detail if detail else ''}")
        return out

    def summary(self) -> None:
        say("\n## Stages\n")
        for r in self.results:
            say(f"- {r['status']:7s} {r['stage']} ({r.get('seconds', 0):.1f} s) {r['detail']}")


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def gpu_reason() -> str | None:
    """None where cuda-python reaches a CUDA device, else why not."""
    from personaplex_edge.runtime.backends.cuda_runtime import gpu_available

    ok, why = gpu_available()
    return None if ok else f"no usable CUDA device: {why}"
