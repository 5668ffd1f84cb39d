"""A client nobody here wrote: moshi's own Python client (`moshi.client.Connection`, from the
installed moshi package) talks to `personaplex-edge serve`. Only its sound devices are replaced:
a fake input stream calls its audio callback with the wav, 1920 samples every 80 ms, as
sounddevice would; a fake output stream pulls its answer frames. Everything else - its sphn
Opus encoding, its messages, its receive loop, its printer - is moshi's code as shipped.
With greedy decoding, the text moshi's client prints equals `personaplex-edge run` on the
same audio after the same Opus round trip."""

from __future__ import annotations

import asyncio
import io
import threading
import time
import types

import numpy as np
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("sphn")
moshi_client = pytest.importorskip("moshi.client")
moshi_utils = pytest.importorskip("moshi.client_utils")

import aiohttp  # noqa: E402
from bench_serve import (FRAME, ServerThread, opus_pages, opus_round_trip,  # noqa: E402
                         reference_text, speech)

from personaplex_edge.runtime.sampling import SamplingParams  # noqa: E402
from personaplex_edge.runtime.serve import ServeOptions  # noqa: E402


class FakeSoundDevice:
    """sounddevice's InputStream/OutputStream for moshi's Connection, on the host clock."""

    def __init__(self, pcm: np.ndarray):
        self.pcm = pcm
        self.input_done = threading.Event()
        self.played: list[np.ndarray] = []
        device = self

        class Stream:
            def __init__(self, samplerate, channels, blocksize, callback):
                assert (samplerate, channels, blocksize) == (24000, 1, FRAME)
                self.callback, self.blocksize = callback, blocksize
                self.stop = threading.Event()

            def __enter__(self):
                self.thread = threading.Thread(target=self.run, daemon=True)
                self.thread.start()
                return self

            def __exit__(self, *exc):
                self.stop.set()
                self.thread.join()

        class InputStream(Stream):
            def run(self):
                t0 = time.perf_counter()
                for i in range(device.pcm.shape[0] // FRAME):
                    if self.stop.is_set():
                        return
                    time.sleep(max(0.0, t0 + i * 0.08 - time.perf_counter()))
                    block = device.pcm[i * FRAME:(i + 1) * FRAME].reshape(FRAME, 1).copy()
                    self.callback(block, FRAME, None, None)
                device.input_done.set()

        class OutputStream(Stream):
            def run(self):
                while not self.stop.wait(0.08):
                    out = np.zeros((FRAME, 1), np.float32)
                    self.callback(out, FRAME, None, None)
                    device.played.append(out[:, 0].copy())

        self.module = types.SimpleNamespace(InputStream=InputStream, OutputStream=OutputStream)


def test_moshis_own_client(demo_model_dir, tmp_path, monkeypatch):
    pcm = speech(4.0)
    device = FakeSoundDevice(pcm)
    monkeypatch.setattr(moshi_client, "sd", device.module)
    printed, logged = io.StringIO(), io.StringIO()
    printer = moshi_utils.RawPrinter(stream=printed, err_stream=logged)
    frames = len(opus_round_trip(opus_pages(pcm))) // FRAME
    options = ServeOptions(demo_model_dir, port=0, sampling=SamplingParams(greedy=True),
                           max_backlog=100_000)
    expected = reference_text(demo_model_dir, opus_round_trip(opus_pages(pcm)), tmp_path,
                              "--greedy")

    def audible() -> int:  # the blocks moshi's client played with our audio in them
        return sum(float(np.abs(p).sum()) > 0 for p in list(device.played))

    with ServerThread(options) as srv:
        async def drive():
            async with aiohttp.ClientSession() as http:
                # the URL moshi's client builds: ws://host:port/api/chat, no query
                async with http.ws_connect(srv.url.replace("http", "ws") + "api/chat") as ws:
                    conn = moshi_client.Connection(printer, ws,
                                                   event_loop=asyncio.get_running_loop())
                    running = asyncio.create_task(conn.run())
                    await asyncio.get_running_loop().run_in_executor(
                        None, device.input_done.wait, 30)
                    deadline = time.monotonic() + 60
                    while time.monotonic() < deadline and not any(
                            s.frames_answered >= frames for s in list(srv.state.sessions)):
                        await asyncio.sleep(0.02)
                    # the last answers' messages have reached moshi's client: the whole text
                    # printed, the audio played (asserted below; waited for here)
                    while time.monotonic() < deadline and not (
                            printed.getvalue() == expected and audible() > frames // 2):
                        await asyncio.sleep(0.02)
                    await ws.close()
                    await running
        asyncio.run(drive())
        deadline = time.monotonic() + 60
        while not srv.history() and time.monotonic() < deadline:
            time.sleep(0.02)
        session = srv.history()[0]

    assert session["frames"] == frames and session["dropped"] == 0
    assert len(expected) > 5 and printed.getvalue() == expected
    # moshi's client decoded our Opus into frames it played
    assert audible() > frames // 2
    # it got the handshake (and, not using it, says so), and never lost the connection
    assert "unknown message kind 0" in logged.getvalue()
    assert "Lost connection" not in logged.getvalue()
