"""Ctrl-C for a child process in a test: the child starts with SIGINT's default action, as a
terminal's foreground process has it, even where the test run itself was started with SIGINT
ignored (a background job of a non-interactive shell passes the ignore on to its children, and
Python then raises no KeyboardInterrupt)."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """Popen's preexec_fn."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
