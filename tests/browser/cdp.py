"""A small Chrome DevTools Protocol driver for the browser test: starts Debian's `chromium`
headless with a fake microphone playing a wav, opens a page, evaluates JavaScript in it, takes
screenshots. It speaks CDP over a WebSocket with aiohttp (already a dependency of the server),
so the test needs nothing from npm.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import aiohttp

# What works for headless chromium in a container (no GPU, no sandbox, no network chatter),
# plus the fake media devices: the page's getUserMedia gets the wav, without a prompt.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
         "--autoplay-policy=no-user-gesture-required", "--window-size=900,700"]


def find_chromium() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which(
        "chromium-browser")


class CDPError(RuntimeError):
    pass


class Page:
    """One tab: `call` a CDP method, `evaluate` an expression, `screenshot` to a PNG."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self.console: list[str] = []  # console lines and uncaught exceptions, for diagnostics
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._waiting.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
            elif data.get("method") == "Runtime.consoleAPICalled":
                args = data["params"].get("args", [])
                self.console.append(" ".join(str(a.get("value", a.get("description", "")))
                                             for a in args))
            elif data.get("method") == "Runtime.exceptionThrown":
                details = data["params"]["exceptionDetails"]
                self.console.append("exception: " + details.get("exception", {}).get(
                    "description", details.get("text", "")))

    async def call(self, method: str, **params) -> dict:
        i = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[i] = fut
        await self.ws.send_json({"id": i, "method": method, "params": params})
        data = await asyncio.wait_for(fut, 30)
        if "error" in data:
            raise CDPError(f"{method}: {data['error']}")
        return data["result"]

    async def evaluate(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, awaitPromise=True,
                                 returnByValue=True)
        if "exceptionDetails" in result:
            raise CDPError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def goto(self, url: str, ready: str = "document.readyState === 'complete'") -> None:
        await self.call("Page.navigate", url=url)
        await self.wait_for(ready, timeout=15)

    async def wait_for(self, condition: str, timeout: float = 20.0, poll: float = 0.1):
        """Polls a JavaScript condition until it is truthy; its value, or TimeoutError."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                value = await self.evaluate(condition)
            except CDPError:
                value = None  # the page is navigating
            if value:
                return value
            if loop.time() > deadline:
                raise TimeoutError(f"{condition} still false after {timeout} s; console: "
                                   f"{self.console[-10:]}")
            await asyncio.sleep(poll)

    async def screenshot(self, path: str | Path) -> None:
        data = (await self.call("Page.captureScreenshot", format="png"))["data"]
        Path(path).write_bytes(base64.b64decode(data))


class Chromium:
    """`async with Chromium(fake_audio=wav) as browser: page = await browser.page()`"""

    def __init__(self, fake_audio: str | Path | None = None, binary: str | None = None,
                 flags: list[str] | None = None):
        self.binary = binary or find_chromium()
        self.flags = list(flags or [])
        if self.binary is None:
            raise FileNotFoundError("chromium is not installed (apt-get install chromium)")
        self.fake_audio = fake_audio
        self.stderr: list[str] = []

    async def __aenter__(self) -> "Chromium":
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-")
        args = FLAGS + self.flags + [f"--user-data-dir={self._profile.name}",
                                     "--remote-debugging-port=0"]
        if self.fake_audio is not None:
            args.append(f"--use-file-for-fake-audio-capture={self.fake_audio}")
        self.proc = await asyncio.create_subprocess_exec(
            self.binary, *args, "about:blank", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            # its own temporary files (org.chromium.Chromium.*) go with the profile, not to /tmp
            env={**os.environ, "TMPDIR": self._profile.name})
        url = None
        while url is None:
            line = await asyncio.wait_for(self.proc.stderr.readline(), 30)
            if not line:
                raise RuntimeError("chromium exited: " + "".join(self.stderr[-20:]))
            text = line.decode(errors="replace")
            self.stderr.append(text)
            m = re.search(r"DevTools listening on (ws://\S+)", text)
            if m:
                url = m.group(1)
        self._drain = asyncio.create_task(self._keep_reading())
        self.port = int(url.split(":")[2].split("/")[0])
        self.http = aiohttp.ClientSession()
        return self

    async def _keep_reading(self) -> None:
        while True:  # chromium blocks if nobody reads its stderr
            line = await self.proc.stderr.readline()
            if not line:
                return
            self.stderr.append(line.decode(errors="replace"))
            del self.stderr[:-200]

    async def page(self) -> Page:
        targets = await (await self.http.get(f"http://127.0.0.1:{self.port}/json")).json()
        target = next(t for t in targets if t["type"] == "page")
        ws = await self.http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
        page = Page(ws)
        await page.call("Page.enable")
        await page.call("Runtime.enable")
        return page

    async def __aexit__(self, *exc) -> None:
        await self.http.close()
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self._drain.cancel()
        self._profile.cleanup()
