"""The manual's fleet recipe, run: the nginx block of docs/serve.md, its upstream boxes
replaced by two `serve`s on this machine and its port by a free one, in front of them. Through
it, under the public name the boxes admit (`--allowed-hosts`), the page and the health probe
answer, both WebSocket protocols converse - two conversations at once, one on each box
(least_conn) - and a foreign Host is refused by the boxes (403).

Without nginx (Debian's `nginx` package; scripts/install.sh installs it) the test is skipped."""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("sphn")

import aiohttp  # noqa: E402
from bench_serve import (ServerThread, opus_pages, speech, talk, talk_realtime,  # noqa: E402
                         wait_until)

from personaplex_edge.runtime.serve import ServeOptions  # noqa: E402

RECIPE = Path(__file__).resolve().parents[1] / "docs" / "serve.md"
PUBLIC = "voice.example.com"  # the recipe's public name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nginx_config(boxes: list[str], port: int, prefix: Path) -> str:
    """The recipe's block, its two upstream servers replaced by `boxes` and its port by
    `port`, inside the few lines any nginx configuration needs (files under `prefix`)."""
    block = RECIPE.read_text().split("```nginx\n", 1)[1].split("```", 1)[0]
    upstreams = re.findall(r"^\s*server \S+:\d+;.*$", block, re.M)
    assert len(upstreams) == len(boxes) and "listen 80;" in block
    for line, box in zip(upstreams, boxes):
        block = block.replace(line, f"    server {box};")
    block = block.replace("listen 80;", f"listen 127.0.0.1:{port};")
    temp = " ".join(f"{kind}_temp_path {prefix}/{kind};"
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return (f"daemon off; pid {prefix}/nginx.pid; error_log {prefix}/error.log;\n"
            f"events {{}}\nhttp {{ access_log off; {temp} proxy_max_temp_file_size 0;\n"
            f"{block}}}\n")


@pytest.fixture
def nginx(tmp_path):
    """Starts nginx with a configuration: `start(config) -> url`."""
    binary = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/sbin/nginx") if Path(p).is_file()), None)
    if binary is None:
        pytest.skip("nginx is not installed (apt-get install nginx)")
    procs = []

    def start(config: str, port: int) -> str:
        (tmp_path / "nginx.conf").write_text(config)
        check = subprocess.run([binary, "-t", "-p", str(tmp_path), "-c",
                                str(tmp_path / "nginx.conf")], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        procs.append(subprocess.Popen([binary, "-p", str(tmp_path), "-c",
                                       str(tmp_path / "nginx.conf")]))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return f"http://127.0.0.1:{port}/"
            time.sleep(0.05)
        raise AssertionError((tmp_path / "error.log").read_text())

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_fleet_recipe_serves_both_protocols_through_nginx(nginx, demo_model,
                                                              demo_model_dir, tmp_path):
    public = {"Host": PUBLIC, "Origin": f"http://{PUBLIC}"}
    options = ServeOptions(demo_model_dir, port=0, allowed_hosts=(PUBLIC,))
    with ServerThread(options, model=demo_model) as box1, \
            ServerThread(options, model=demo_model) as box2:
        boxes = [box.url.split("//")[1].rstrip("/") for box in (box1, box2)]
        port = _free_port()
        url = nginx(nginx_config(boxes, port, tmp_path), port)

        async def scene():
            async with aiohttp.ClientSession() as http:
                statuses = []
                for path, host in (("", PUBLIC), ("api/health", PUBLIC),
                                   ("", "evil.example")):
                    async with http.get(url + path, headers={"Host": host}) as r:
                        statuses.append(r.status)
            pcm = speech(2.0)
            both = await asyncio.gather(
                talk(url, opus_pages(pcm), headers=public, tail_s=1.0),
                talk_realtime(url, pcm, session={}, headers=public, tail_s=1.0))
            return statuses, both

        statuses, (chat, realtime) = asyncio.run(scene())
        assert wait_until(lambda: len(box1.history()) + len(box2.history()) == 2, timeout=60)
        histories = [box1.history(), box2.history()]
    assert statuses == [200, 200, 403]
    assert chat.status is None and chat.kinds[0] == 0 and chat.pieces > 0 and not chat.errors
    assert realtime.status is None and realtime.answer_samples > 0 and not realtime.errors
    # least_conn: the second conversation went to the box without one
    assert sorted(len(h) for h in histories) == [1, 1]
    assert {h[0]["protocol"] for h in histories} == {"chat", "realtime"}
