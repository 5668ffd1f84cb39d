"""Writes a reader never sees half of: files through a temporary beside them, directories
through a staging directory beside them, each moved into place with one rename.

An interrupted write (an error, Ctrl-C, a process killed for memory) leaves nothing that looks
complete. A killed process cannot clean up after itself, so what it left - a hidden
`.NAME.partial-*` staging directory, possibly tens of GB of a 7B export - is found and removed by
the next staged write of the same target (`stale_stages`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

STAGE_MARK = ".partial-"  # .NAME.partial-XXXX: a directory being written
OLD_MARK = ".old-"  # .NAME.old-XXXX: the directory being replaced, for a moment


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def default_mode(directory: bool = False) -> int:
    """The mode a plain open()/mkdir() would give (tempfile's are owner-only)."""
    return (0o777 if directory else 0o666) & ~_umask()


@contextmanager
def atomic_file(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yields a temporary path beside `path`; write it, and on success it replaces `path` in
    one rename (with the mode a plain open() would give). On any failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, default_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += (Path(root) / f).lstat().st_size
            except OSError:
                pass
    return total


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_stages(final: str | Path) -> list[Path]:
    """Staging (and half-replaced) directories of `final` left by a writer that is gone: the
    process id in the name no longer runs (or, for names without one, they are over a day
    old)."""
    final = Path(final)
    if not final.parent.is_dir():
        return []
    out = []
    for p in final.parent.iterdir():
        name = p.name
        if not p.is_dir() or not (name.startswith(f".{final.name}{STAGE_MARK}")
                                  or name.startswith(f".{final.name}{OLD_MARK}")):
            continue
        tag = name.rsplit("-", 2)
        pid = int(tag[-2]) if len(tag) == 3 and tag[-2].isdigit() else None
        if pid is not None and pid != os.getpid() and _pid_alive(pid):
            continue  # another export of the same target is running
        if pid is None and time.time() - p.stat().st_mtime < 86400:
            continue
        out.append(p)
    return out


def remove_stale_stages(final: str | Path,
                        progress: Callable[[str], None] | None = None) -> int:
    """Removes what `stale_stages` finds, saying so; returns the bytes freed. A writer killed
    between the two renames of a replacement left the earlier directory only inside its
    `.old` holder, and `final` missing: that one is put back, not removed."""
    final = Path(final)
    freed = 0
    for p in stale_stages(final):
        kept = p / final.name
        if p.name.startswith(f".{final.name}{OLD_MARK}") and kept.is_dir() \
                and not final.exists():
            os.replace(kept, final)
            shutil.rmtree(p, ignore_errors=True)
            if progress is not None:
                progress(f"restored {final} from {p}, where a replacement that did not "
                         "finish had moved it")
            continue
        size = _tree_bytes(p)
        shutil.rmtree(p, ignore_errors=True)
        freed += size
        if progress is not None:
            progress(f"removed {p} ({size / 1e9:.2f} GB), left by an earlier write of "
                     f"{Path(final).name} that did not finish")
    return freed


@contextmanager
def staged_dir(final: str | Path, progress: Callable[[str], None] | None = None,
               seed_from: str | Path | None = None) -> Iterator[Path]:
    """Yields a staging directory beside `final`; on success it replaces `final` in one rename,
    on any failure (Ctrl-C included) it is removed, and `final` - an earlier export - is as it
    was. With `seed_from`, the stage starts as a copy of that directory (hard links where the
    file system allows, so a rebuild of a 7B's engines does not copy its weights): files in
    such a stage must be replaced (atomic_file), never rewritten in place."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_stages(final, progress)
    stage = Path(tempfile.mkdtemp(dir=final.parent,
                                  prefix=f".{final.name}{STAGE_MARK}{os.getpid()}-"))
    try:
        if seed_from is not None:
            _link_tree(Path(seed_from), stage)
        yield stage
        os.chmod(stage, default_mode(directory=True))
        if final.exists():
            old = Path(tempfile.mkdtemp(dir=final.parent,
                                        prefix=f".{final.name}{OLD_MARK}{os.getpid()}-"))
            os.replace(final, old / final.name)
            try:
                os.replace(stage, final)
            except BaseException:
                os.replace(old / final.name, final)  # never strand the old one
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(stage, final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _link_tree(src: Path, dst: Path) -> None:
    for p in src.iterdir():
        target = dst / p.name
        if p.is_dir():
            target.mkdir()
            _link_tree(p, target)
            continue
        try:
            os.link(p, target)
        except OSError:
            shutil.copy2(p, target)
