"""A C library that the operating system's package manager installs (libspeexdsp, libopus),
loaded once through ctypes: no Python package and no compiler stand between the runtime and
it, so whatever apt (Debian, Ubuntu, JetPack) or Homebrew ships works on every architecture.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Callable


class SystemLibrary:
    """`load()` the library with its signatures declared by `declare`, or None when it is not
    installed; `missing_reason()` then says what was tried. Names without a dot go through
    `ctypes.util.find_library` (a short name, e.g. "opus"); names with one are sonames tried
    as they are (e.g. "libopus.so.0", "libopus.0.dylib")."""

    def __init__(self, names: tuple[str, ...], declare: Callable[[ctypes.CDLL], None]):
        self.names = names
        self._declare = declare
        self._lib: ctypes.CDLL | None = None
        self._error: str | None = None

    def load(self) -> ctypes.CDLL | None:
        if self._lib is not None or self._error is not None:
            return self._lib
        tried = []
        for name in self.names:
            path = ctypes.util.find_library(name) if "." not in name else name
            if not path:
                continue
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

    def missing_reason(self) -> str:
        return self._error or ""
