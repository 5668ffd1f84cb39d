"""Which onnxruntime build is installed, and the message when it is none or both.

`onnxruntime` (CPU) and `onnxruntime-gpu` are two distributions of one Python module. The
project's extras never install both (`cpu` brings the first, `gpu-cu12` / `gpu-cu13` the second),
because side by side the files of whichever was installed last overwrite the other's, and the
module pip reports can lack the CUDA provider the user installed it for. The runtime calls
`import_onnxruntime()` where it first needs the module, so that neither build is one message
naming the extras, and both builds are said before they cause a confusing provider list.
"""

from __future__ import annotations

from importlib import metadata

from personaplex_edge.errors import PersonaPlexError

BUILDS = ("onnxruntime", "onnxruntime-gpu")
_CHOOSE = ("pip install 'personaplex-edge[cpu]' for the CPU, or 'personaplex-edge[gpu]' "
           "(CUDA 12; [gpu-cu13] for CUDA 13) for an NVIDIA GPU - one of them, not both")


class OnnxRuntimeInstallError(PersonaPlexError):
    """onnxruntime is missing, or installed twice over."""


def installed_builds() -> list[str]:
    """The onnxruntime distributions pip has installed (any of BUILDS)."""
    found = []
    for name in BUILDS:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def side_by_side() -> str | None:
    """A message when both builds are installed, else None."""
    if len(installed_builds()) < 2:
        return None
    return ("both onnxruntime and onnxruntime-gpu are installed: they are the same module, and "
            "the one installed last can hide the CUDA provider. Keep one: pip uninstall -y "
            "onnxruntime onnxruntime-gpu, then " + _CHOOSE)


def import_onnxruntime():
    """The onnxruntime module, or OnnxRuntimeInstallError naming the extra to install."""
    try:
        import onnxruntime
    except ImportError:
        raise OnnxRuntimeInstallError("onnxruntime is not installed: " + _CHOOSE) from None
    return onnxruntime
