"""`personaplex-edge serve` as a user runs it: it prints the URL, serves, and on Ctrl-C tells
every open session why it ends, closes them, and exits 0."""

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

from bench_serve import opus_pages, speech, talk  # noqa: E402


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


def test_ctrl_c_closes_every_session_and_exits_0(demo_model_dir):
    proc, url = start_serve(demo_model_dir, "--max-sessions", "3")
    try:
        pages = opus_pages(speech(20.0))

        async def scene():
            clients = [asyncio.create_task(talk(url, pages, tail_s=5)) for _ in range(2)]
            await asyncio.sleep(2.0)  # both are in conversation by now (asserted below)
            proc.send_signal(signal.SIGINT)
            t0 = time.monotonic()
            results = await asyncio.gather(*clients)
            return results, time.monotonic() - t0

        results, closed_s = asyncio.run(scene())
        rc = proc.wait(timeout=20)
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    for r in results:
        assert r.kinds[0] == 0 and r.pieces > 0  # they were in conversation
        assert r.errors == ["the server is shutting down"] and r.close_code == 1001
        assert r.frames_sent < len(pages)  # cut short by the stop, not by their end
    assert closed_s < 5
    assert "stopping: closing 2 sessions" in out and out.rstrip().endswith("stopped")
    assert out.count("ended: the server is shutting down") == 2


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
