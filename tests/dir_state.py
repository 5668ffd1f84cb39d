"""What a test compares to prove that nothing was written into a directory, and a directory made
read-only the way a user makes one."""

from __future__ import annotations

import hashlib
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def tree_state(folder: Path) -> dict[str, tuple]:
    """Everything under `folder` (and the folder itself): each entry's mode, mtime and content
    (a file's sha256, a link's target)."""
    out = {}
    for p in [folder, *sorted(folder.rglob("*"))]:
        st = p.lstat()
        content = (os.readlink(p) if p.is_symlink() else
                   hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
        out[str(p.relative_to(folder))] = (st.st_mode, st.st_mtime_ns, content)
    return out


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """chmod a-w on `folder` and everything in it, for the duration (then as it was). Root
    could still write there; the runtime leaves such a directory alone all the same
    (user_cache.writable_dir)."""
    paths = [folder, *folder.rglob("*")]
    modes = {p: p.lstat().st_mode for p in paths if not p.is_symlink()}
    for p, mode in modes.items():
        os.chmod(p, stat.S_IMODE(mode) & ~0o222)
    try:
        yield
    finally:
        for p, mode in modes.items():
            os.chmod(p, stat.S_IMODE(mode))
