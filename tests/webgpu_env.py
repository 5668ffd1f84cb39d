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
