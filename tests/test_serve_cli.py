"""`personaplex-edge serve` as a user runs it: it prints the URL, serves both protocols, and on
Ctrl-C tells every open session why it ends, closes them, and exits 0; without the serve extra
it says which to install."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("sphn")

from bench_serve import opus_pages, speech, talk, talk_realtime  # noqa: E402


def start_serve(model_dir, *flags, env=None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "personaplex_edge.cli", "serve", "--model",
                             str(model_dir), "--port", "0", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"on (http://127\.0\.0\.1:\d+/) ", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("serve did not print its URL:\n" + "".join(lines))


async def metrics(url: str) -> dict[str, float]:
    """The server's unlabelled Prometheus samples, by name."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        text = await (await http.get(url + "metrics")).text()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(\w+) (\S+)$", text, re.MULTILINE)}


async def until_in_conversation(url: str, sessions: int, frames: int,
                                timeout: float = 120.0) -> None:
    """Once `sessions` sessions are open and, since the last of them opened, `frames` frames
    answered for each (the server's own counts: streaming at the same pace, the sessions share
    the ticks); AssertionError with the metrics after `timeout` s."""
    loop = asyncio.get_running_loop()
    deadline, since = loop.time() + timeout, None
    while True:
        m = await metrics(url)
        answered = m.get("personaplex_frames_total", 0)
        if since is None and m.get("personaplex_sessions_opened_total", 0) >= sessions:
            since = answered
        if since is not None and answered >= since + sessions * frames:
            return
        assert loop.time() < deadline, f"not in conversation after {timeout} s: {m}"
        await asyncio.sleep(0.1)


def test_ctrl_c_closes_every_session_and_exits_0(demo_model_dir):
    """Two /api/chat sessions hear ERROR and 1001; a /v1/realtime one hears its response's
    done events (status incomplete), then 1001."""
    proc, url = start_serve(demo_model_dir, "--max-sessions", "3")
    try:
        pcm = speech(60.0)  # far longer than any wait: the stop cuts it short
        pages = opus_pages(pcm)

        async def scene():
            clients = [asyncio.create_task(talk(url, pages, tail_s=5)) for _ in range(2)]
            clients.append(asyncio.create_task(talk_realtime(url, pcm, session={}, tail_s=5,
                                                             keep=True)))
            # all three open and ~2 s of their speech answered (25 frames each), however long
            # a busy machine takes to get there
            await until_in_conversation(url, sessions=3, frames=25)
            proc.send_signal(signal.SIGINT)
            return await asyncio.gather(*clients)

        *chats, realtime = asyncio.run(scene())
        rc = proc.wait(timeout=20)
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    for r in chats:
        assert r.kinds[0] == 0 and r.pieces > 0  # they were in conversation
        assert r.errors == ["the server is shutting down"] and r.close_code == 1001
        assert r.frames_sent < len(pages)  # cut short by the stop, not by their end
    kinds = [e["type"] for e in realtime.events]
    assert realtime.answer_samples > 0 and realtime.frames_sent < len(pcm) // 1920
    assert kinds[-1] == "response.done" and "error" not in kinds
    assert realtime.events[-1]["response"]["status"] == "incomplete"
    assert realtime.close_code == 1001
    # (closed by the stop itself: each client heard its last words and 1001, which the server
    # sends only from a session's own end - one still open at the stop's DRAIN_SECONDS
    # deadline is cut by the runner's cleanup instead; and each was cut short, above)
    assert "stopping: closing 3 sessions" in out and out.rstrip().endswith("stopped")
    assert out.count("ended: the server is shutting down") == 3


def test_serve_without_the_serve_extra_names_it():
    """A new user's machine without aiohttp or prometheus-client: one line naming the extra to
    install, exit 2, no traceback."""
    for missing in ("prometheus_client", "aiohttp"):
        run = subprocess.run(
            [sys.executable, "-c", f"import sys; sys.modules[{missing!r}] = None; "
             "from personaplex_edge.cli import main; sys.exit(main(['serve', '--model', 'demo']))"],
            capture_output=True, text=True, timeout=60)
        assert run.returncode == 2, run.stderr
        assert run.stderr.strip().splitlines() == [
            f"personaplex-edge: error: serve needs the serve extra ({missing} is missing): "
            'pip install "personaplex-edge[serve]"']


def test_serve_without_libopus_names_the_os_package():
    """A machine whose OS has no libopus (here: every lookup of it fails, as there): one line
    naming the package, exit 2, before any model is loaded or exported."""
    hide = ("import ctypes, ctypes.util, sys; find, load = ctypes.util.find_library, ctypes.CDLL\n"
            "ctypes.util.find_library = lambda n: None if 'opus' in n else find(n)\n"
            "class CDLL(load):\n"
            "    def __init__(self, name, *a, **k):\n"
            "        if 'opus' in str(name): raise OSError(f'{name}: cannot open shared object')\n"
            "        super().__init__(name, *a, **k)\n"
            "ctypes.CDLL = CDLL\n"
            "from personaplex_edge.cli import main; sys.exit(main(['serve', '--model', 'demo']))")
    run = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("personaplex-edge: error: serve needs libopus (")
    assert lines[0].endswith("apt-get install libopus0 (Debian, Ubuntu, Jetson), "
                             "brew install opus (macOS)")


def test_binds_to_localhost_by_default_and_refuses_a_taken_port(demo_model_dir):
    proc, url = start_serve(demo_model_dir)
    try:
        assert url.startswith("http://127.0.0.1:")
        port = url.rsplit(":", 1)[1].strip("/")
        second = subprocess.run([sys.executable, "-m", "personaplex_edge.cli", "serve",
                                 "--model", str(demo_model_dir), "--port", port],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        assert f"cannot listen on 127.0.0.1:{port}" in second.stderr
        assert "choose another --port" in second.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0


def test_the_token_from_the_environment_guards_the_chat(demo_model_dir):
    """$PERSONAPLEX_AUTH_TOKEN reaches the server the command starts (ps never shows it): 401
    without it, a conversation with it."""
    proc, url = start_serve(demo_model_dir, "--max-sessions", "1",
                            env={"PERSONAPLEX_AUTH_TOKEN": "s3cret"})
    try:
        pages = opus_pages(speech(1.0))

        async def scene():
            return (await talk(url, pages, pace=None, tail_s=0.2),
                    await talk(url, pages, query="?token=s3cret", pace=None, tail_s=1.0))

        without, with_token = asyncio.run(scene())
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
    assert without.status == 401 and without.kinds == []
    assert with_token.kinds[:1] == [0] and not with_token.errors
    assert rc == 0


def test_allowed_hosts_from_the_environment_and_a_bad_one(demo_model_dir):
    """$PERSONAPLEX_ALLOWED_HOSTS reaches the server (a proxy's name is served, another name
    is 403); a value that is not a host name stops the command with exit 2, before loading."""
    import aiohttp

    proc, url = start_serve(demo_model_dir, env={"PERSONAPLEX_ALLOWED_HOSTS": "voice.example"})
    try:
        async def page(host):
            async with aiohttp.ClientSession() as http:
                async with http.get(url, headers={"Host": host}) as r:
                    return r.status, await r.text()

        async def scene():
            return await page("voice.example"), await page("evil.example:8998")

        (ok, _), (refused, why) = asyncio.run(scene())
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
    assert (ok, refused, rc) == (200, 403, 0)
    assert "--allowed-hosts evil.example" in why
    bad = subprocess.run([sys.executable, "-m", "personaplex_edge.cli", "serve", "--model",
                          str(demo_model_dir), "--allowed-hosts", "https://voice.example"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--allowed-hosts: 'https://voice.example' is not a host name" in bad.stderr
