"""Shared fixtures: the tiny reference Mimi, its checkpoint in the published layout, and the model
directory exported from it (built once per test session)."""

from __future__ import annotations

import os

os.environ.setdefault("NO_TORCH_COMPILE", "1")
# the suite runs as two xdist workers on two cores: libgomp's threads (torch's) spin between
# parallel regions by default, and a spinning thread holds the core the other worker's threads
# are waiting for - beside the full-width export the real-size Mimi test took 205 s instead of
# 45 s. Set before torch is first imported (libgomp reads it once); the runtime's onnxruntime
# sessions already turn their own spinning off (runtime/backends/ort.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from webgpu_env import software_webgpu_env  # noqa: E402

software_webgpu_env()  # tests/webgpu_env.py: before onnxruntime loads its WebGPU provider
import tempfile  # noqa: E402

# the per-user cache (hash stamps, engines built on first use) of this test session: never the
# home directory's; a test that needs its own sets PERSONAPLEX_CACHE itself
os.environ["PERSONAPLEX_CACHE"] = tempfile.mkdtemp(prefix="personaplex-cache-")
from pathlib import Path  # noqa: E402

# benchmarks/ holds drivers the tests share with the benchmarks (lm_probe, soak)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import pytest  # noqa: E402
from ci_parts import CI_ENV, NOT_INSTALLABLE  # noqa: E402

from personaplex_edge.config import preset  # noqa: E402

# ---- skips: a failure in CI for a part CI installs (tests/ci_parts.py), always counted --------
IN_CI = os.environ.get(CI_ENV) == "1"


def pytest_configure(config):
    if IN_CI:  # a module skipped for a missing part is an error; the other modules still run
        config.option.continue_on_collection_errors = True


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _fail_in_ci(report) -> None:
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if not reason.startswith(NOT_INSTALLABLE):
            report.outcome = "failed"
            report.longrepr = (f"skipped in CI ({CI_ENV}=1), where scripts/install.sh installs "
                               f"what this test needs: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_in_ci(outcome.get_result())


def pytest_terminal_summary(terminalreporter):
    """Every skip's reason, counted, whatever the command's -r flags: a skip is never silent."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: dict[str, int] = {}
    for report in skipped:
        reason = _skip_reason(report)
        reasons[reason] = reasons.get(reason, 0) + 1
    terminalreporter.write_sep("-", f"{len(skipped)} skipped")
    for reason, n in sorted(reasons.items(), key=lambda rn: -rn[1]):
        terminalreporter.write_line(f"{n:4d}  {reason[:200]}")


@pytest.fixture(scope="session")
def tiny_cfg():
    return preset("tiny")


@pytest.fixture(scope="session")
def tiny_mimi_ref(tiny_cfg):
    from moshi_reference import reference_mimi

    return reference_mimi(tiny_cfg.mimi_config, seed=0)


@pytest.fixture(scope="session")
def tiny_codec_checkpoint(tmp_path_factory, tiny_cfg, tiny_mimi_ref) -> Path:
    """A checkpoint directory holding only the Mimi file and a config.json, as published."""
    import json

    from moshi_reference import save_published

    from personaplex_edge.export.hub import CONFIG_FILE, MIMI_FILE

    root = tmp_path_factory.mktemp("tiny_ckpt")
    save_published(tiny_mimi_ref, root / MIMI_FILE)
    (root / CONFIG_FILE).write_text(json.dumps(
        {"model_type": "personaplex", "version": "7b-v1",
         **{k: tiny_cfg.to_dict()[k] for k in ("mimi_config", "temporal_config",
                                               "depformer_config")}}))
    return root


@pytest.fixture(scope="session")
def tiny_codec_dir(tmp_path_factory, tiny_codec_checkpoint) -> Path:
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model

    out = tmp_path_factory.mktemp("tiny_model") / "model"
    export_model(resolve_checkpoint(str(tiny_codec_checkpoint), with_lm=False), out,
                 progress=lambda s: None)
    return out


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory) -> Path:
    """The built-in demo model (random weights, codec + LM + tokenizer), exported once."""
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    ckpt = write_synthetic_checkpoint(preset("demo"), tmp_path_factory.mktemp("demo_ckpt"))
    out = tmp_path_factory.mktemp("demo_model") / "model"
    export_model(resolve_checkpoint(str(ckpt)), out, progress=lambda s: None)
    return out


LOCKSTEP_BATCH = 3


@pytest.fixture(scope="session")
def batch_model_dir(tmp_path_factory) -> Path:
    """The demo model (the same random weights) exported with --batch 3."""
    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    ckpt = write_synthetic_checkpoint(preset("demo"), tmp_path_factory.mktemp("demo_ckpt_b"))
    out = tmp_path_factory.mktemp("demo_b") / "model"
    export_model(resolve_checkpoint(str(ckpt)), out, batch=LOCKSTEP_BATCH,
                 progress=lambda s: None)
    return out


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory) -> Path:
    """The built-in tiny model (codec and LM, random weights) exported in float32, once; its
    checkpoint beside it in ../ckpt. Read-only to the tests: copy or convert it to change it."""
    import fake_gpu

    return fake_gpu.export_tiny(tmp_path_factory.mktemp("tiny_export"))


@pytest.fixture(scope="module")
def demo_model(demo_model_dir):
    """The demo model loaded for one test module (the servers of its tests share it)."""
    from personaplex_edge.runtime.api import Model

    m = Model.load(demo_model_dir)
    yield m
    m.close()


@pytest.fixture(scope="module")
def greedy_server(demo_model, demo_model_dir):
    """`serve` on the demo model answering exactly what `run --greedy` says: greedy, nothing
    dropped, audio taken as fast as a test sends it."""
    from bench_serve import ServerThread

    from personaplex_edge.runtime.sampling import SamplingParams
    from personaplex_edge.runtime.serve import ServeOptions

    with ServerThread(ServeOptions(demo_model_dir, port=0, max_sessions=8,
                                   sampling=SamplingParams(greedy=True), max_backlog=100_000,
                                   max_ahead_s=None), model=demo_model) as srv:
        yield srv
