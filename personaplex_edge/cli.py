"""The `personaplex-edge` command: its parser, built from the commands (each command's flags
live with what it does: personaplex_edge/commands/, runtime/backends/engines_entry.py,
runtime/assistant/entry.py), and `main`.

Every user-facing failure is a PersonaPlexError: its message is printed alone (no traceback) and
the exit status is non-zero. Torch is imported only by `export` (and by the first use of a
built-in model, which is exported on the spot).
"""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .commands import (aec, batch, bench, codec, decode, devices, export, mic, run, serve,
                       stdio, verify)
from .errors import PersonaPlexError


def build_parser() -> argparse.ArgumentParser:
    from .runtime.assistant import entry as assistant
    from .runtime.backends import engines_entry as engines

    p = argparse.ArgumentParser(
        prog="personaplex-edge",
        description="Run NVIDIA PersonaPlex on your own machine (ONNX / TensorRT / WebGPU, no "
                    "torch).")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in (export, engines, verify, codec, run, mic, assistant, aec, batch, decode,
                    stdio, bench, serve, devices):  # in `--help`'s order
        command.add_parser(sub)
    return p


def with_subcommand(argv: list[str]) -> list[str]:
    """`argv` with the reference's habit - `--mic` instead of a subcommand - spelled as the
    subcommand (`aec --mic FILE` is an option of aec)."""
    argv = list(argv)
    if "--mic" in argv and argv[0] != "aec":
        argv.remove("--mic")
        argv.insert(0, "mic")
    return argv


def parse_args(argv: list[str]) -> argparse.Namespace:
    """A command line as a user types it (SystemExit, with the usage, where it is wrong)."""
    return build_parser().parse_args(with_subcommand(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return args.func(args)
    except PersonaPlexError as e:
        print(f"personaplex-edge: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("personaplex-edge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
