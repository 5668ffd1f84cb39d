"""The per-user cache, and which model directories the runtime may write into.

A model directory is read-only to the runtime: it may be a Hugging Face hub snapshot (the
library's, never to be written), a packaged copy, a directory on a read-only mount. What the
runtime learns about a model - which files it has hashed, the TensorRT engines it built for this
GPU, the personas it prefilled - goes to one per-user cache instead:

    $PERSONAPLEX_CACHE, else $XDG_CACHE_HOME/personaplex-edge, else ~/.cache/personaplex-edge
        verified/<manifest sha256>.json     hash stamps (manifest.py)
        engines/<manifest sha256>/<gpu>/    TensorRT engines built on first use
        tensorrt/                           TensorRT timing caches
        personas/                           a default for the persona cache's directory
        models/<name>/                      built-in models (demo, tiny), exported on first use

Everything in it can be deleted at any time: it is rebuilt on the next use (a built-in model
only where torch is installed: on a board without it, one copied there from a PC is kept).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

ENV = "PERSONAPLEX_CACHE"

# .../models--OWNER--NAME/snapshots/<revision>: where huggingface_hub keeps a download
_HUB_SNAPSHOT = re.compile(r"(^|/)models--[^/]+/snapshots/[^/]+(/|$)")


def user_cache_dir(*parts: str) -> Path:
    """The per-user cache (module docstring), or a path inside it. Not created here."""
    root = os.environ.get(ENV)
    if root:
        base = Path(root).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "personaplex-edge"
    return base.joinpath(*parts)


def persona_cache_dir() -> Path:
    """Where prefilled personas may be kept across runs by default."""
    return user_cache_dir("personas")


def is_hub_snapshot(path: str | Path) -> bool:
    """Whether `path` lies in a snapshot of huggingface_hub's cache."""
    return bool(_HUB_SNAPSHOT.search(Path(path).absolute().as_posix()))


def writable_dir(path: str | Path) -> bool:
    """Whether the runtime may write into directory `path` (and replace it, which writes its
    parent). Never a hub snapshot. Otherwise the directory and its parent must be writable for
    this user (access(2), which also says no on a read-only mount) and not marked read-only for
    everyone: a directory without any write bit is left alone even by root, whom permissions do
    not stop - whoever ran chmod a-w on it meant it."""
    path = Path(path)
    if is_hub_snapshot(path):
        return False
    for d in (path, path.absolute().parent):
        try:
            mode = d.stat().st_mode
        except OSError:
            return False
        if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(d, os.W_OK):
            return False
    return True
