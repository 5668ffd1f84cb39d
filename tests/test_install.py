"""What pyproject.toml's extras install and its wheel holds, and what the runtime says when
onnxruntime is missing or installed twice over (runtime/backends/ort_install.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
SELF = re.compile(r"^personaplex-edge\[([\w,-]+)\]$")


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


def requirements(extra: str) -> list[str]:
    """An extra's requirements, the project's own extras it names expanded."""
    out = []
    for req in EXTRAS[extra]:
        m = SELF.match(req)
        out += [r for e in m.group(1).split(",") for r in requirements(e)] if m else [req]
    return out


def test_no_install_puts_both_onnxruntime_builds_side_by_side():
    assert not any(_name(r).startswith("onnxruntime") for r in PROJECT["dependencies"])
    builds = {"onnxruntime", "onnxruntime-gpu"}
    for extra in EXTRAS:
        assert len(builds & {_name(r) for r in requirements(extra)}) <= 1, extra
    # the combinations docs/install.md and scripts/install.sh use
    for combo in (("cpu", "export", "dev", "audio", "rtx"), ("gpu", "export"), ("trt", "cpu"),
                  ("jetson", "cpu", "audio"), ("rtx",)):
        names = {_name(r) for extra in combo for r in requirements(extra)}
        assert len(builds & names) == 1, combo
    assert "cpu" in (ROOT / "scripts" / "install.sh").read_text().split(".[", 1)[1]


def test_cuda_python_is_pinned_to_each_target_cuda_major_version():
    for extra in EXTRAS:
        pins = [r for r in requirements(extra) if _name(r) == "cuda-python"]
        if not pins:
            continue
        (pin,) = pins
        if extra.endswith("cu13"):
            assert ">=13" in pin and "<14" in pin, (extra, pin)
        else:  # cu12, the default gpu / trt sets and JetPack 6 (CUDA 12)
            assert "<13" in pin, (extra, pin)
    assert {_name(r) for r in requirements("gpu")} == {_name(r) for r in requirements("gpu-cu12")}


def test_the_trt_extras_bring_every_module_the_engine_build_imports():
    """trt_build imports onnx; trt_library imports the TensorRT module of its library; each
    extra brings them with cuda-python, the rtx extras the library's own wheel."""
    backends = ROOT / "runtime" / "backends"
    assert re.search(r"^\s+import onnx$", (backends / "trt_build.py").read_text(), re.M)
    modules = re.search(r"_MODULES = \{MAINLINE: \"(\w+)\", RTX: \"(\w+)\"\}",
                        (backends / "trt_library.py").read_text())
    assert modules and modules.groups() == ("tensorrt", "tensorrt_rtx")
    for extra in ("trt", "trt-cu12", "trt-cu13", "jetson", "rtx", "rtx-cu12", "rtx-cu13"):
        names = {_name(r) for r in requirements(extra)}
        assert "onnx" in names and "cuda-python" in names, extra
        wheels = {n for n in names if n.startswith("tensorrt")}
        if extra.startswith("rtx"):  # the one distribution whose module is tensorrt_rtx
            assert wheels == {f"tensorrt-rtx-{extra.split('-')[-1]}" if "-" in extra
                              else "tensorrt-rtx-cu12"}, extra
            assert "onnxruntime" in names  # an RTX PC installs from this one line
        elif extra != "jetson":  # a Jetson's TensorRT is JetPack's
            assert wheels, extra


def test_the_wheel_holds_every_module_and_every_file_the_runtime_reads(tmp_path):
    """pyproject.toml lists the packages by hand and maps export/ and runtime/ under
    personaplex_edge: a subpackage or a page file left out of it would import and serve from a
    checkout and be missing for whoever installs the wheel. Built from a copy of the sources, so
    the build leaves nothing in the tree."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    places = {"personaplex_edge": "personaplex_edge", "export": "personaplex_edge/export",
              "runtime": "personaplex_edge/runtime"}
    for folder in places:
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("personaplex_edge-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())

    read_at_run_time = ["*.py", "py.typed", "data/*.wav", "serve/static/*", "assistant/*.service"]
    wanted = {f"{places[folder]}/{path.relative_to(src / folder).as_posix()}"
              for folder in places for pattern in read_at_run_time
              for path in (src / folder).rglob(pattern) if "__pycache__" not in path.parts}
    assert len(wanted) > 100 and "personaplex_edge/runtime/serve/static/index.html" in wanted
    assert wanted - shipped == set()


def test_install_script_probes_the_cpu_torch_index_with_a_short_timeout():
    script = (ROOT / "scripts" / "install.sh").read_text()
    probe, fallback = script.index("download.pytorch.org/whl/cpu"), script.index("else")
    assert re.search(r"timeout=\d\b", script)  # seconds, not pip's default wait
    assert "--index-url \"$CPU_INDEX\"" in script and probe < fallback
    assert 'pip install -q "$TORCH"' in script  # the plain index where the probe fails


def test_missing_onnxruntime_is_one_message_naming_the_extras(monkeypatch):
    from personaplex_edge.runtime.backends import ort_install

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(ort_install.OnnxRuntimeInstallError,
                       match=r"onnxruntime is not installed: pip install 'personaplex-edge\[cpu\]'"
                             r".*'personaplex-edge\[gpu\]'"):
        ort_install.import_onnxruntime()


def test_both_onnxruntime_builds_are_named_with_the_fix(monkeypatch):
    from importlib import metadata

    from personaplex_edge.runtime.backends import ort_install

    versions = {"onnxruntime": "1.20.0", "onnxruntime-gpu": "1.20.0"}

    def version(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(ort_install.metadata, "version", version)
    assert ort_install.installed_builds() == ["onnxruntime", "onnxruntime-gpu"]
    message = ort_install.side_by_side()
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in message
    del versions["onnxruntime"]
    assert ort_install.side_by_side() is None
