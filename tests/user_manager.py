"""A systemd user manager of a test's own, to start the units the project writes as `systemctl
--user` would: `systemd --user` with its own runtime and config directories and a session bus
(dbus-daemon), so units are read from the test's directory and nothing of the machine's is
touched.

systemd runs a user manager only where the machine was booted with it (/run/systemd/system
exists). Where it was not (a container), the manager runs in a private mount namespace in
which that directory does exist: that takes root (CAP_SYS_ADMIN), which is why `available()`
says where this cannot be done.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ci_parts import not_installable

SYSTEMD = "/lib/systemd/systemd"


def available() -> str | None:
    """None when a user manager can be started here, else why not."""
    missing = [p for p in ("systemctl", "dbus-daemon", "unshare") if shutil.which(p) is None]
    if not Path(SYSTEMD).is_file():
        missing.append(SYSTEMD)
    if missing:
        return (f"{', '.join(missing)} missing (apt-get install systemd dbus-daemon util-linux; "
                "scripts/install.sh does)")
    if not Path("/run/systemd/system").is_dir():
        if os.geteuid() != 0:
            return not_installable("this machine was not booted with systemd, and a user "
                                   "manager outside it needs a private mount namespace, which "
                                   "takes root")
        probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
        if probe.returncode != 0:  # root without CAP_SYS_ADMIN (a container's default)
            return not_installable("this machine was not booted with systemd, and it allows no "
                                   f"private mount namespace: {probe.stderr.strip()}")
    return None


class UserManager:
    """`systemd --user` (and its session bus) under `root`; `systemctl(...)` talks to it;
    `env` is what the units it starts get."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root = Path(root)
        self.runtime = self.root / "runtime"
        self.runtime.mkdir(mode=0o700, parents=True)
        self.config = self.root / "config"
        self.unit_dir = self.config / "systemd" / "user"
        self.unit_dir.mkdir(parents=True)
        bus = f"unix:path={self.runtime / 'bus'}"
        self.env = dict(env, XDG_RUNTIME_DIR=str(self.runtime), XDG_CONFIG_HOME=str(self.config),
                        DBUS_SESSION_BUS_ADDRESS=bus)
        self._bus = subprocess.Popen(["dbus-daemon", "--session", f"--address={bus}",
                                      "--nofork", "--nopidfile"], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        booted = Path("/run/systemd/system").is_dir()
        command = [SYSTEMD, "--user"] if booted else [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            "mkdir -p /run/systemd && mount -t tmpfs tmpfs /run/systemd && "
            "mkdir /run/systemd/system && "
            f"exec {SYSTEMD} --user"]
        self._log = open(self.root / "manager.log", "wb")
        self._manager = subprocess.Popen(command, env=self.env, stdout=self._log,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not (self.runtime / "systemd" / "private").exists():
            if self._manager.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("systemd --user did not start: "
                                   + (self.root / "manager.log").read_text()[-500:])
            time.sleep(0.1)

    def systemctl(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(["systemctl", "--user", *args], env=self.env, capture_output=True,
                              text=True, timeout=60, check=check)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.systemctl("show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait(self, unit: str, done, timeout: float) -> dict[str, str]:
        """The unit's ActiveState, SubState, NRestarts, ExecMainStatus and Result once
        done(them) holds; AssertionError (with them) after `timeout` seconds."""
        props = ("ActiveState", "SubState", "NRestarts", "ExecMainStatus", "Result")
        deadline = time.monotonic() + timeout
        while True:
            state = self.show(unit, *props)
            if done(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"{unit} is {state} after {timeout} s")
            time.sleep(0.2)

    def close(self) -> None:
        if self._manager.poll() is None:
            self.systemctl("exit")
            try:
                self._manager.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._manager.send_signal(signal.SIGKILL)
                self._manager.wait(timeout=10)
        self._bus.terminate()
        self._bus.wait(timeout=10)
        self._log.close()
