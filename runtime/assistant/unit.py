"""The systemd unit: the file in the package (personaplex-edge-assistant.service) with its
ExecStart filled in, written where `systemctl --user` finds it."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from personaplex_edge.atomic import write_text_atomic

from .config import config_home

UNIT_NAME = "personaplex-edge-assistant.service"
TEMPLATE = Path(__file__).with_name(UNIT_NAME)


def user_unit_dir() -> Path:
    return config_home() / "systemd" / "user"


def executable() -> list[str]:
    """How this installation's command is started: its console script where there is one,
    else this interpreter with the module."""
    script = Path(sys.executable).parent / "personaplex-edge"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("personaplex-edge")
    return [found] if found else [sys.executable, "-m", "personaplex_edge.cli"]


def render_unit(args: list[str], workdir: Path) -> str:
    """The unit with ExecStart = this installation's command, `assistant` and `args`, run in
    `workdir`."""
    exec_start = " ".join(shlex.quote(a) for a in executable())
    extra = "".join(" " + shlex.quote(a) for a in args)
    # systemd expands $VAR and %x in ExecStart (%x alone in WorkingDirectory): a literal % or
    # $ must be doubled
    escape = (lambda s: s.replace("%", "%%").replace("$", "$$"))
    return (TEMPLATE.read_text().replace("@EXEC@", escape(exec_start))
            .replace("@ARGS@", escape(extra))
            .replace("@WORKDIR@", str(workdir).replace("%", "%%")))


def install_unit(args: list[str], directory: Path | None = None) -> Path:
    """The unit written (atomically) for `args`, run in the current directory."""
    path = (directory or user_unit_dir()) / UNIT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, render_unit(args, Path.cwd()))
    return path
