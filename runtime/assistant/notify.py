"""systemd's notify protocol (sd_notify(3)): `KEY=VALUE` lines in one datagram to the Unix
socket named by $NOTIFY_SOCKET (a leading '@' is the abstract namespace). Outside systemd the
variable is unset and every call does nothing.

    READY=1        the model is loaded and the devices are open
    STATUS=...     listening / speaking / asleep / waiting for a device (systemctl status)
    WATCHDOG=1     every WATCHDOG_USEC/2 while the audio loop makes progress (Watchdog)
    RELOADING=1    a SIGHUP reload began (with MONOTONIC_USEC); READY=1 ends it
    STOPPING=1     SIGTERM: shutting down
"""

from __future__ import annotations

import os
import socket
import time


class Notifier:
    def __init__(self, address: str | None = None):
        address = os.environ.get("NOTIFY_SOCKET") if address is None else address
        self._sock: socket.socket | None = None
        self._address = None
        if address:
            self._address = "\0" + address[1:] if address.startswith("@") else address
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)  # the audio loop never waits on systemd

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *lines: str) -> bool:
        """One datagram of `lines`; False where there is no systemd or it did not take it."""
        if self._sock is None:
            return False
        try:
            self._sock.sendto("\n".join(lines).encode(), self._address)
            return True
        except OSError:  # systemd gone or its queue full: nothing the service can do
            return False

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def reloading(self) -> None:
        now_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={now_usec}")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half of $WATCHDOG_USEC), or None when systemd asks for
    none (unset, or $WATCHDOG_PID names another process)."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None


class Watchdog:
    """WATCHDOG=1 at `interval` seconds, only while the audio loop shows progress: `beat()`
    (every frame the loop's worker steps, and every retry while a device is awaited) must be
    newer than `stale` seconds, so a hung loop stops the pings and systemd restarts the
    service. `tick()` is called often (the service's main loop, every 0.25 s)."""

    def __init__(self, notifier: Notifier, interval: float | None, stale: float = 10.0):
        self.notifier = notifier
        self.interval = interval
        self.stale = stale if interval is None else max(stale, 2 * interval)
        self.last_beat = time.monotonic()
        self.last_ping = 0.0
        self.pings = 0

    def beat(self, at: float | None = None) -> None:
        self.last_beat = time.monotonic() if at is None else at

    def tick(self) -> None:
        if self.interval is None:
            return
        now = time.monotonic()
        if now - self.last_beat > self.stale or now - self.last_ping < self.interval:
            return
        if self.notifier.send("WATCHDOG=1"):
            self.pings += 1
        self.last_ping = now
