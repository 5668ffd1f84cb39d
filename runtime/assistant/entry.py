"""From the command line to the service: the `assistant` command's flags over the config
file, --install-unit."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from personaplex_edge.contract import DEVICES

from ..persona import is_voice_file
from .config import load_config
from .vad import ENGINES


@dataclass(frozen=True)
class Flag:
    """A flag of the command: the config key it overrides (and names in an error), argparse's
    kind of it, its value for the key, and whether a value is a path (the unit gets it
    absolute)."""

    flag: str
    key: str
    kind: Mapping[str, Any] = field(default_factory=dict)  # argparse's type, choices, action
    value: Callable[[Any], Any] = lambda v: v  # argparse's value -> the key's
    path: Callable[[str], bool] = lambda v: False

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _local_dir(v: str) -> bool:
    return Path(v).expanduser().is_dir()  # else a built-in name or a hub id, kept as given


# each overrides one key of the file (docs/assistant.md); a new flag is one entry here
FLAGS = (
    Flag("--model", "model", path=_local_dir),
    Flag("--device", "device", {"choices": list(DEVICES)}),
    Flag("--threads", "threads", {"type": int}),
    Flag("--text-prompt", "persona.text_prompt"),
    Flag("--voice-prompt", "persona.voice", path=is_voice_file),
    Flag("--seed", "sampling.seed", {"type": int}),
    Flag("--input-device", "audio.input_device"),
    Flag("--output-device", "audio.output_device"),
    Flag("--sleep-after", "idle.sleep_after", {"type": float}),
    Flag("--vad", "idle.vad", {"choices": list(ENGINES)}),
    Flag("--socket", "control.socket", path=bool),  # "": the default path
    Flag("--aec", "audio.aec", {"choices": ["on", "off"]}, value=lambda v: v == "on"),
    Flag("--no-socket", "control.enabled", {"action": "store_const", "const": True},
         value=lambda v: False),
)


def add_parser(sub) -> None:
    """`personaplex-edge assistant` on the CLI's subparsers (personaplex_edge/cli.py)."""
    s = sub.add_parser("assistant", help="the --mic loop as a service: config file, devices "
                                         "that come and go, sleep when idle, systemd, a "
                                         "control socket (docs/assistant.md)")
    s.add_argument("--config", help="TOML file (default: $XDG_CONFIG_HOME/personaplex-edge/"
                                    "assistant.toml); the flags below override it")
    for f in FLAGS:
        s.add_argument(f.flag, default=None, help=f"sets {f.key}", **f.kind)
    s.add_argument("--install-unit", action="store_true",
                   help="write the systemd user unit running this command (with these flags)")
    s.add_argument("--unit-dir", type=Path, help="where --install-unit writes (default: "
                                                 "~/.config/systemd/user)")
    s.set_defaults(func=run)


def _given(args) -> list[tuple[Flag, Any]]:
    return [(f, getattr(args, f.dest)) for f in FLAGS if getattr(args, f.dest) is not None]


def overrides(args) -> dict:
    """The keys the flags given set: key -> (flag, value)."""
    return {f.key: (f.flag, f.value(v)) for f, v in _given(args)}


def unit_args(args) -> list[str]:
    """The flags the unit's ExecStart repeats: the config file and the flags given, each path
    absolute (the unit runs in its own working directory)."""
    out = ["--config", os.path.abspath(Path(args.config).expanduser())] if args.config else []
    for f, v in _given(args):
        if "const" in f.kind:
            out.append(f.flag)
        else:
            out += [f.flag, os.path.abspath(Path(v).expanduser()) if f.path(v) else str(v)]
    return out


def run(args) -> int:
    """The assistant as a service (docs/assistant.md), or its unit written."""
    if args.install_unit:
        from .checks import check_before_loading
        from .unit import UNIT_NAME, install_unit

        # a unit that would fail before the model loads is not written
        check_before_loading(load_config(args.config, overrides(args)))
        path = install_unit(unit_args(args), args.unit_dir)
        print(f"wrote {path}\nthen: systemctl --user daemon-reload && systemctl --user enable "
              f"--now {UNIT_NAME}\n(at boot without a login: loginctl enable-linger $USER; "
              f"logs: journalctl --user -u {UNIT_NAME})")
        return 0
    from .service import Assistant

    return Assistant(args.config, overrides(args)).run()
