"""`personaplex-edge assistant` run as systemd would run it, on a private PulseAudio: a listener
on NOTIFY_SOCKET, a client on the control socket, the log, each read by a thread of its own and
kept with the time it arrived. Shared by tests/test_assistant.py and
benchmarks/soak_assistant.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from pulse import start_pulse

HELLO = Path(__file__).resolve().parents[1] / "personaplex_edge" / "data" / "hello.wav"


class Collected:
    """(monotonic time, item) pairs, appended by a reader thread, waited on by the test."""

    def __init__(self):
        self.items: list[tuple[float, object]] = []
        self._cond = threading.Condition()

    def add(self, item) -> None:
        with self._cond:
            self.items.append((time.monotonic(), item))
            self._cond.notify_all()

    def wait(self, pred, timeout: float, after: int = 0):
        """The first item from index `after` on for which pred(item) holds -> (index, time,
        item); AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(after, len(self.items)):
                    t, item = self.items[i]
                    if pred(item):
                        return i, t, item
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"not seen within {timeout} s; last: "
                                         f"{[x for _, x in self.items[-8:]]}")
                self._cond.wait(left)


class Client:
    """A control socket client: JSON lines out, every line in kept."""

    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.lines = Collected()
        threading.Thread(target=self._read, daemon=True).start()
        self._ids = 0

    def _read(self) -> None:
        for line in self.sock.makefile("r"):
            self.lines.add(json.loads(line))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def command(self, cmd: str, timeout: float = 10.0, **fields) -> dict:
        self._ids += 1
        ident = self._ids
        self.send_raw((json.dumps({"cmd": cmd, "id": ident, **fields}) + "\n").encode())
        return self.lines.wait(lambda m: m.get("id") == ident, timeout)[2]

    def event(self, kind: str, timeout: float, after: int = 0, **match):
        return self.lines.wait(lambda m: m.get("event") == kind and all(
            m.get(k) == v for k, v in match.items()), timeout, after)

    def close(self) -> None:
        self.sock.close()


class AssistantService:
    """The pulse server, the service process, its notify listener and a control client."""

    def __init__(self, tmp: Path, model_dir: Path, sleep_after: float = 1.5,
                 watchdog_usec: int = 1_000_000, extra_config: str = ""):
        self.tmp = Path(tmp)
        self.runtime = self.tmp / "pulse"
        self.runtime.mkdir(exist_ok=True)
        self.pulse, self.env = start_pulse(self.runtime, room=True)
        self.socket_path = self.tmp / "control.sock"
        self._playing: list[subprocess.Popen] = []  # the paplay processes not waited for
        self.config = self.tmp / "assistant.toml"
        self.model_dir = model_dir
        self.write_config(sleep_after=sleep_after, extra=extra_config)
        self.notify = Collected()
        self._notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify_sock.bind(str(self.tmp / "notify.sock"))
        threading.Thread(target=self._read_notify, daemon=True).start()
        env = dict(self.env, NOTIFY_SOCKET=str(self.tmp / "notify.sock"),
                   WATCHDOG_USEC=str(watchdog_usec), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "personaplex_edge.cli", "assistant", "--config",
             str(self.config)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        self.log = Collected()
        threading.Thread(target=self._read_log, daemon=True).start()
        try:
            self.notify.wait(lambda m: "READY=1" in m, timeout=60)
            self.client = Client(self.socket_path)
        except BaseException:
            self.close()
            raise

    def write_config(self, sleep_after: float, extra: str = "",
                     text_prompt: str | None = None) -> None:
        persona = f"[persona]\ntext_prompt = {json.dumps(text_prompt)}\n" if text_prompt else ""
        self.config.write_text(
            f'model = {json.dumps(str(self.model_dir))}\ndevice = "cpu"\nthreads = 1\n'
            f"{persona}[idle]\nsleep_after = {sleep_after}\n[audio]\nretry_seconds = 0.5\n"
            f"[control]\nsocket = {json.dumps(str(self.socket_path))}\n{extra}")

    def _read_notify(self) -> None:
        while True:
            try:
                data = self._notify_sock.recv(4096)
            except OSError:
                return
            self.notify.add(data.decode())

    def _read_log(self) -> None:
        for line in self.proc.stdout:
            self.log.add(line.rstrip("\n"))

    def play(self, path: Path = HELLO) -> float:
        """Plays `path` into the microphone's sink; -> the monotonic time it was started."""
        t = time.monotonic()
        self._playing.append(subprocess.Popen(["paplay", "--device=room", str(path)],
                                              env=self.env))
        return t

    def wait_played(self, margin_frames: int = 7, timeout: float = 120.0) -> None:
        """Until everything played so far has ended - paplay exits once the sound server has
        played all of it - and the service has taken `margin_frames` more frames from the
        microphone (the sound's tail on its way through the monitor, ~0.5 s): a command that
        must not race a voice still in the microphone waits for this."""
        for proc in self._playing:
            proc.wait(timeout)
        self._playing.clear()
        start = self.client.command("status")["frames"]
        deadline = time.monotonic() + timeout
        while self.client.command("status")["frames"] < start + margin_frames:
            assert time.monotonic() < deadline, f"no {margin_frames} frames in {timeout} s"
            time.sleep(0.05)

    def kill_sound_server(self) -> None:
        self.pulse.kill()
        self.pulse.wait(timeout=10)

    def start_sound_server(self) -> None:
        self.pulse, _ = start_pulse(self.runtime, room=True)

    def log_text(self) -> str:
        return "\n".join(str(x) for _, x in self.log.items)

    def close(self) -> None:
        for proc in self._playing:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if hasattr(self, "client"):
            self.client.close()
        self._notify_sock.close()
        if self.pulse.poll() is None:
            self.pulse.terminate()
            self.pulse.wait(timeout=10)
