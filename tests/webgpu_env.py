"""The WebGPU device of the tests: SwiftShader, the software Vulkan driver Debian's chromium ships,
under onnxruntime's WebGPU provider with its software switch on. Set for every test process
before onnxruntime first loads the provider (it reads the switch once, when the plugin is
registered), so whichever test registers it first, `--device webgpu` finds the software
adapter; `auto` never takes a software adapter, so every other test stays on the CPU."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SWIFTSHADER_ICD = Path("/usr/lib/chromium/vk_swiftshader_icd.json")


def software_webgpu_env(env=os.environ) -> None:
    """The variables (setdefault: a developer's own win) in `env`."""
    env.setdefault("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER", "1")
    if SWIFTSHADER_ICD.is_file():
        env.setdefault("VK_ICD_FILENAMES", str(SWIFTSHADER_ICD))
    if "XDG_RUNTIME_DIR" not in env:  # Dawn prints an error line without one
        env["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="xdg-")


def adapter_or_skip():
    """The WebGPU adapter the tests run on, or a skip saying what installs one (a failure in
    CI, which installs it: tests/ci_parts.py)."""
    import pytest

    from personaplex_edge.runtime.backends.webgpu_adapter import WebGpuUnavailable, find_adapter

    try:
        return find_adapter()
    except WebGpuUnavailable as e:
        pytest.skip(f"no WebGPU adapter here ({e}): scripts/install.sh installs SwiftShader "
                    "(chromium) and libvulkan1")


def cli(args: list[str], env: dict | None = None, prefix: tuple[str, ...] = ()):
    """`personaplex-edge ARGS` in a process of its own (its stdout, stderr and exit code)."""
    import subprocess
    import sys

    return subprocess.run([*prefix, sys.executable, "-m", "personaplex_edge.cli", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
