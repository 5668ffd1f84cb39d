"""From the command line to the service: the `assistant` command's flags over the config
file, --install-unit."""

from __future__ import annotations

from pathlib import Path

from .config import load_config
from .vad import ENGINES

# argparse dest -> the config key it overrides, and the flag that names it in an error
FLAGS = {
    "model": ("model", "--model"),
    "device": ("device", "--device"),
    "threads": ("threads", "--threads"),
    "text_prompt": ("persona.text_prompt", "--text-prompt"),
    "voice_prompt": ("persona.voice", "--voice-prompt"),
    "seed": ("sampling.seed", "--seed"),
    "input_device": ("audio.input_device", "--input-device"),
    "output_device": ("audio.output_device", "--output-device"),
    "sleep_after": ("idle.sleep_after", "--sleep-after"),
    "vad": ("idle.vad", "--vad"),
    "socket": ("control.socket", "--socket"),
}


# argparse's type or choices of the flags that take more than text
KINDS = {"--device": {"choices": ["auto", "cpu", "cuda"]}, "--threads": {"type": int},
         "--seed": {"type": int}, "--sleep-after": {"type": float},
         "--vad": {"choices": list(ENGINES)}}


def add_parser(sub) -> None:
    """`personaplex-edge assistant` on the CLI's subparsers (personaplex_edge/cli.py)."""
    s = sub.add_parser("assistant", help="the --mic loop as a service: config file, devices "
                                         "that come and go, sleep when idle, systemd, a "
                                         "control socket (docs/assistant.md)")
    s.add_argument("--config", help="TOML file (default: $XDG_CONFIG_HOME/personaplex-edge/"
                                    "assistant.toml); the flags below override it")
    for key, flag in FLAGS.values():  # each overrides one key of the file (docs/assistant.md)
        s.add_argument(flag, default=None, help=f"sets {key}", **KINDS.get(flag, {}))
    s.add_argument("--aec", choices=["on", "off"], default=None, help="sets audio.aec")
    s.add_argument("--no-socket", action="store_true", help="no control socket")
    s.add_argument("--install-unit", action="store_true",
                   help="write the systemd user unit running this command (with these flags)")
    s.add_argument("--unit-dir", type=Path, help="where --install-unit writes (default: "
                                                 "~/.config/systemd/user)")
    s.set_defaults(func=run)


def overrides(args) -> dict:
    """The keys the flags given set: key -> (flag, value)."""
    found = {key: (flag, getattr(args, dest)) for dest, (key, flag) in FLAGS.items()
             if getattr(args, dest) is not None}
    if args.aec is not None:
        found["audio.aec"] = ("--aec", args.aec == "on")
    if args.no_socket:
        found["control.enabled"] = ("--no-socket", False)
    return found


def unit_args(args) -> list[str]:
    """The flags the unit's ExecStart repeats: the config file (absolute) and the overrides."""
    out = ["--config", str(Path(args.config).expanduser().resolve())] if args.config else []
    for dest, (_, flag) in FLAGS.items():
        if getattr(args, dest) is not None:
            out += [flag, str(getattr(args, dest))]
    if args.aec is not None:
        out += ["--aec", args.aec]
    if args.no_socket:
        out.append("--no-socket")
    return out


def run(args) -> int:
    """The assistant as a service (docs/assistant.md), or its unit written."""
    if args.install_unit:
        from .unit import UNIT_NAME, install_unit

        load_config(args.config, overrides(args))  # a unit that would fail is not written
        path = install_unit(unit_args(args), args.unit_dir)
        print(f"wrote {path}\nthen: systemctl --user daemon-reload && systemctl --user enable "
              f"--now {UNIT_NAME}\n(at boot without a login: loginctl enable-linger $USER; "
              f"logs: journalctl --user -u {UNIT_NAME})")
        return 0
    from .service import Assistant

    return Assistant(args.config, overrides(args)).run()
