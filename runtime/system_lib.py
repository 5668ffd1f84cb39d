"""A C library that the operating system's package manager installs (libspeexdsp, libopus),
loaded once through ctypes: no Python package and no compiler stand between the runtime and
it, so whatever apt (Debian, Ubuntu, JetPack) or Homebrew ships works on every architecture.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path
from typing import Callable, Iterator


def package_lib_dirs() -> list[Path]:
    """Where macOS package managers put libraries that the loader's default search misses:
    Homebrew's prefix ($HOMEBREW_PREFIX; /opt/homebrew on Apple silicon, /usr/local on Intel)
    and MacPorts' /opt/local. Elsewhere none: the loader's own search finds apt's."""
    if sys.platform != "darwin":
        return []
    prefixes = [os.environ.get("HOMEBREW_PREFIX"), "/opt/homebrew", "/usr/local", "/opt/local"]
    return [Path(p) / "lib" for p in dict.fromkeys(p for p in prefixes if p)]


class SystemLibrary:
    """`load()` the library with its signatures declared by `declare`, or None when it is not
    installed; `missing_reason()` then says what was tried. Names without a dot go through
    `ctypes.util.find_library` (a short name, e.g. "opus"); names with one are sonames tried
    as they are (e.g. "libopus.so.0", "libopus.0.dylib"), then in package_lib_dirs()."""

    def __init__(self, names: tuple[str, ...], declare: Callable[[ctypes.CDLL], None]):
        self.names = names
        self._declare = declare
        self._lib: ctypes.CDLL | None = None
        self._error: str | None = None

    def load(self) -> ctypes.CDLL | None:
        if self._lib is not None or self._error is not None:
            return self._lib
        tried = []
        for path in self._candidates():
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path}: {e}")
                continue
            self._declare(lib)
            self._lib = lib
            return lib
        self._error = "; ".join(tried) or f"lib{self.names[0]} not found"
        return None

    def _candidates(self) -> Iterator[str]:
        for name in self.names:
            if "." not in name:
                found = ctypes.util.find_library(name)
                if found:
                    yield found
                continue
            yield name
            for directory in package_lib_dirs():
                if (directory / name).is_file():
                    yield str(directory / name)

    def missing_reason(self) -> str:
        return self._error or ""
