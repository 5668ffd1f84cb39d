"""The control and event socket: a Unix socket (mode 0600) that apps on the same machine connect
to, JSON lines both ways.

    client -> {"cmd": "mute", "id": 7}                  a command (commands.py) and any id
    server -> {"ok": true, "cmd": "mute", "id": 7, ...}  its reply, or {"ok": false, "error": ..}
    server -> {"event": "text", "text": " Hello"}        events, to every client as they happen

One thread serves every client with a selector. A client is never waited for: what it has not
read yet is kept up to MAX_PENDING bytes, past which that client alone is closed (a log line
says so). A malformed line gets an error line and the client's session goes on.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import stat
import threading
from pathlib import Path
from typing import Any, Callable

from personaplex_edge.errors import PersonaPlexError

MAX_LINE = 64 * 1024  # bytes of one command line
MAX_PENDING = 1 << 20  # bytes of events a client may leave unread
MAX_SOCKET_PATH = 107  # bytes of an AF_UNIX path (sun_path holds 108 with its NUL)
_FIX = "set control.socket to a path in a directory of your own, or --no-socket"

Handle = Callable[[dict], dict]  # a parsed command -> its reply's fields (commands.py)
Log = Callable[[str], None]


class _Client:
    def __init__(self, sock: socket.socket, number: int):
        self.sock = sock
        self.number = number
        self.inbox = bytearray()
        self.outbox = bytearray()


def check_socket_path(path: Path) -> None:
    """PersonaPlexError for a path no socket can be made at, before anything is made: too
    long for AF_UNIX, or under something that is not a directory."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise PersonaPlexError(f"{path} has {len(os.fsencode(path))} bytes, over the "
                               f"{MAX_SOCKET_PATH} a Unix socket's path may have; {_FIX}")
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise PersonaPlexError(f"{path}: {above} is not a directory; {_FIX}")


def _bind(path: Path) -> socket.socket:
    """A listening socket at `path`, created 0600 (no moment in which others could connect).
    A socket file left by a process that died is replaced; one that answers is refused. A
    directory that cannot be made or entered is one PersonaPlexError naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        owner = path.parent.stat().st_uid
        present = path.exists() or path.is_symlink()
    except OSError as e:
        raise PersonaPlexError(f"control.socket {path}: cannot make or enter {path.parent} "
                               f"({e.strerror}); {_FIX}") from None
    if owner != os.getuid():  # who owns the directory could swap the socket
        raise PersonaPlexError(f"control.socket: {path.parent} belongs to another user; {_FIX}")
    if present:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise PersonaPlexError(f"control.socket {path} exists and is not a socket; remove "
                                   "it or set another path")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            raise PersonaPlexError(f"another assistant answers on {path}; stop it or set "
                                   "another control.socket")
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)  # stale: nobody listens
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as e:
        sock.close()
        raise PersonaPlexError(f"cannot open the control socket {path}: {e}") from None
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(16)
    sock.setblocking(False)
    return sock


class ControlServer:
    """Serves `handle` on `path` in a thread of its own; `publish(event)` from any thread."""

    def __init__(self, path: Path, handle: Handle, log: Log = print):
        self.path = Path(path)
        self.handle = handle
        self.log = log
        self._listener = _bind(self.path)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._clients: dict[int, _Client] = {}
        self._lock = threading.Lock()  # the clients' outboxes: publish() writes from others
        self._stop = False
        self._served = 0
        self._thread = threading.Thread(target=self._serve, name="assistant-control",
                                        daemon=True)

    def start(self) -> "ControlServer":
        self._thread.start()
        return self

    @property
    def clients(self) -> int:
        return len(self._clients)

    # -- any thread -----------------------------------------------------------------------------
    def publish(self, event: dict[str, Any]) -> None:
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if not self._clients:
                return
            for client in self._clients.values():
                client.outbox += line
        self._poke()

    def _poke(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already waiting

    def close(self) -> None:
        """Stops serving (or never starts) and removes the socket file."""
        self._stop = True
        self._poke()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for client in list(self._clients.values()):
            client.sock.close()
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        self.path.unlink(missing_ok=True)

    # -- the server's thread ----------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stop:
            for key, mask in self._selector.select(timeout=1.0):
                if key.data is None:
                    self._accept()
                elif key.data == "wake":
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except BlockingIOError:
                        pass
                else:
                    client = key.data
                    if mask & selectors.EVENT_READ:
                        self._read(client)
                    if mask & selectors.EVENT_WRITE and client.number in self._clients:
                        self._write(client)
            self._flush_all()

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        self._served += 1
        client = _Client(sock, self._served)
        with self._lock:
            self._clients[client.number] = client
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        client.inbox += data
        while b"\n" in client.inbox:
            line, _, rest = bytes(client.inbox).partition(b"\n")
            client.inbox = bytearray(rest)
            self._answer(client, line)
        if len(client.inbox) > MAX_LINE:
            client.inbox.clear()
            self._reply(client, {"ok": False, "error": f"a line longer than {MAX_LINE} bytes"})

    def _answer(self, client: _Client, line: bytes) -> None:
        if not line.strip():
            return
        try:
            request = json.loads(line)
        except (ValueError, UnicodeDecodeError) as e:
            self._reply(client, {"ok": False, "error": f"not a JSON line: {e}"})
            return
        if not isinstance(request, dict):
            self._reply(client, {"ok": False, "error": 'a command is a JSON object: '
                                                       '{"cmd": "status"}'})
            return
        try:
            reply = self.handle(request)
        except Exception as e:  # a command's failure is that client's error line, no more
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        if "id" in request:
            reply = {**reply, "id": request["id"]}
        self._reply(client, reply)

    def _reply(self, client: _Client, reply: dict) -> None:
        with self._lock:
            client.outbox += (json.dumps(reply, separators=(",", ":")) + "\n").encode()

    def _flush_all(self) -> None:
        for client in list(self._clients.values()):
            if client.outbox:
                self._write(client)

    def _write(self, client: _Client) -> None:
        with self._lock:
            pending = bytes(client.outbox)
        try:
            sent = client.sock.send(pending) if pending else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(client)
            return
        with self._lock:
            del client.outbox[:sent]
            left = len(client.outbox)
        if left > MAX_PENDING:
            self.log(f"control: client {client.number} left {left} bytes of events unread; "
                     "closing it")
            self._drop(client)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if left else 0)
        self._selector.modify(client.sock, events, client)

    def _drop(self, client: _Client) -> None:
        with self._lock:
            self._clients.pop(client.number, None)
        try:
            self._selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()
