"""Load on `personaplex-edge serve`: N clients each stream speech at real-time pace through one
of its WebSocket protocols - `/api/chat` (Ogg/Opus both ways, as moshi's client does) or
`/v1/realtime` (OpenAI Realtime: base64 PCM16 in JSON events) - and the server's own account of
every session says whether it kept up: frames dropped, and per-session frame time (from a frame
decoded to its answer ready: the wait for the tick plus the step) p50/p99/max. The clients also
measure their round trip (a frame sent -> its answer frame decoded).

    python benchmarks/bench_serve.py --model demo --clients 4 --seconds 60
    python benchmarks/bench_serve.py --model demo --sweep --seconds 20 [--json out.json]
    python benchmarks/bench_serve.py --model demo --sweep --seconds 20 --protocol realtime
    python benchmarks/bench_serve.py --model demo --clients 1,4,8,12 --protocol chat,realtime
    python benchmarks/bench_serve.py --model mid --sweep --seconds 20 [--precision int8]
    python benchmarks/bench_serve.py --model demo --startup 10     # cold and warm personas

"Keeps up" means: zero drops in every session and every session's frame p99 under 80 ms.
`--sweep` raises the number of clients until that fails and reports the largest that held.
With `--protocol chat,realtime` each step runs once per protocol, one after the other, so both
meet the same load on a shared machine.
The server runs in this process (its own thread and event loop, as `serve` runs it); the
clients run in a child process, so their Opus work does not share the server's interpreter.
`--model mid` is the benchmarks' mid LM (benchmarks/mid_model.py) with the real-size Mimi,
exported once into models/mid.

The tests import the client and the server thread from here (tests/test_serve*.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FRAME = 1920
RATE = 24000
FRAME_S = FRAME / RATE  # 80 ms
HELLO = ROOT / "personaplex_edge" / "data" / "hello.wav"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- audio ----------------------------------------------------------------------------------------
def speech(seconds: float) -> np.ndarray:
    """The bundled speech sample at 24 kHz, looped to `seconds`."""
    from personaplex_edge.audio import read_audio

    pcm = read_audio(HELLO, RATE)
    n = int(seconds * RATE) // FRAME * FRAME
    return np.tile(pcm, -(-n // pcm.shape[0]))[:n].astype(np.float32)


def opus_pages(pcm: np.ndarray) -> list[bytes]:
    """pcm in 1920-sample blocks through sphn's writer, as moshi's client encodes its
    microphone: one (possibly empty) chunk of Ogg pages per block."""
    import sphn

    writer = sphn.OpusStreamWriter(RATE)
    return [writer.append_pcm(pcm[i:i + FRAME]) for i in range(0, pcm.shape[0] - FRAME + 1, FRAME)]


def opus_round_trip(pages: list[bytes]) -> np.ndarray:
    """What a decoder independent of the server makes of those pages (sphn's reader, as moshi's
    own code decodes, fed page by page): the samples the server's model should hear."""
    import sphn

    from personaplex_edge.runtime.serve.ogg import ogg_pages

    reader = sphn.OpusStreamReader(RATE)
    out = [np.asarray(reader.append_bytes(page), np.float32)
           for message in pages for page in ogg_pages(message)]
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def reference_run(model_dir, pcm: np.ndarray, workdir: Path, *flags: str
                  ) -> tuple[str, np.ndarray]:
    """What `personaplex-edge run` produces for `pcm` (float32, or int16 samples written as
    they are) with the run's own flags: its text (the per-frame pieces joined, as a client
    receives them) and its answer as the PCM16 samples of its wav."""
    import soundfile as sf

    from personaplex_edge.audio import write_audio
    from personaplex_edge.cli import main

    workdir.mkdir(parents=True, exist_ok=True)
    wav, out, text = workdir / "in.wav", workdir / "out.wav", workdir / "text.json"
    if pcm.dtype == np.int16:
        sf.write(str(wav), pcm, RATE, subtype="PCM_16")
    else:
        write_audio(wav, pcm, RATE)
    assert main(["run", "--model", str(model_dir), "--input", str(wav), "--output", str(out),
                 "--text-out", str(text), *flags]) == 0
    pieces = "".join(r for r in json.loads(text.read_text()) if r not in ("PAD", "EPAD"))
    return pieces, sf.read(str(out), dtype="int16")[0]


def reference_text(model_dir, pcm: np.ndarray, workdir: Path, *flags: str) -> str:
    """The text of `reference_run`."""
    return reference_run(model_dir, pcm, workdir, *flags)[0]


# -- a client -------------------------------------------------------------------------------------
@dataclass
class ClientResult:
    handshake_s: float | None = None  # connect -> handshake
    text: str = ""
    pieces: int = 0
    answer_samples: int = 0
    frames_sent: int = 0
    errors: list[str] = field(default_factory=list)  # the server's ERROR messages
    metadata: list[dict] = field(default_factory=list)
    said: list[dict] = field(default_factory=list)  # the SAY messages (word events)
    close_code: int | None = None
    round_trip_ms: list[float] = field(default_factory=list)  # per answer frame
    kinds: list[int] = field(default_factory=list)  # kinds of every message, in order
    status: int | None = None  # HTTP status when the upgrade was refused
    # /v1/realtime: every event in order (audio deltas without their audio), if kept
    events: list[dict] = field(default_factory=list)
    audio: bytes = b""  # the answer's PCM16, if kept

    def heard(self, samples: int, sent_at: list[float]) -> None:
        """`samples` more of the answer arrived now: each answer frame they complete is paired
        with the frame sent as k-th for its round trip."""
        before = self.answer_samples // FRAME
        self.answer_samples += samples
        now = time.perf_counter()
        for k in range(before, min(self.answer_samples // FRAME, len(sent_at))):
            self.round_trip_ms.append(1000 * (now - sent_at[k]))

    def round_trip(self) -> dict:
        if not self.round_trip_ms:
            return {}
        a = np.asarray(self.round_trip_ms[12:] or self.round_trip_ms)  # past the first second
        return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
                "max": float(a.max())}


async def talk(url: str, pages: list[bytes], query: str = "", pace: float | None = FRAME_S,
               wait_handshake: bool = True, tail_s: float = 1.0, headers: dict | None = None,
               handshake_timeout: float = 30.0, until_frames: int | None = None,
               start: "asyncio.Barrier | None" = None, first: tuple[bytes, ...] = (),
               keep: bool = False) -> ClientResult:
    """One client: connects to `url` (http://host:port/), waits for the handshake, sends the
    messages `first` (a SAY, say), then one audio message per page chunk every `pace` seconds
    (None: as fast as it can), keeps reading `tail_s` more (or until `until_frames` answer
    frames came, if sooner), then closes. With `start`, the clients sharing that barrier begin
    streaming together, after every handshake. Answers are decoded with sphn, as moshi's
    client does (`keep`: kept as PCM16)."""
    import aiohttp
    import sphn

    from personaplex_edge.audio import pcm16_bytes

    res = ClientResult()
    reader = sphn.OpusStreamReader(RATE)
    audio = bytearray()
    sent_at: list[float] = []
    ws_url = url.replace("http", "ws", 1).rstrip("/") + "/api/chat" + query
    t_connect = time.perf_counter()
    handshake = asyncio.Event()
    async with aiohttp.ClientSession() as http:
        try:
            ws = await http.ws_connect(ws_url, headers=headers, ssl=False)
        except aiohttp.WSServerHandshakeError as e:
            res.status = e.status
            return res

        async def receive() -> None:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
                    continue
                kind, payload = msg.data[0], msg.data[1:]
                res.kinds.append(kind)
                if kind == 0:
                    res.handshake_s = time.perf_counter() - t_connect
                    handshake.set()
                elif kind == 1:
                    pcm = np.asarray(reader.append_bytes(payload), np.float32)
                    res.heard(pcm.shape[0], sent_at)
                    if keep:
                        audio.extend(pcm16_bytes(pcm))
                elif kind == 2:
                    res.text += payload.decode()
                    res.pieces += 1
                elif kind == 4:
                    res.metadata.append(json.loads(payload))
                elif kind == 8:
                    res.said.append(json.loads(payload))
                elif kind == 5:
                    res.errors.append(payload.decode())
            res.close_code = ws.close_code

        async def stream() -> None:
            if wait_handshake:
                await asyncio.wait_for(asyncio.shield(handshake.wait()), handshake_timeout)
            if start is not None:
                await asyncio.wait_for(start.wait(), handshake_timeout)
            for message in first:
                await ws.send_bytes(message)
            t0 = time.perf_counter()
            for i, chunk in enumerate(pages):
                if ws.closed:
                    break
                if pace is not None:
                    await asyncio.sleep(max(0.0, t0 + i * pace - time.perf_counter()))
                sent_at.append(time.perf_counter())
                if chunk:
                    await ws.send_bytes(b"\x01" + chunk)
                res.frames_sent += 1

        await _converse(ws, asyncio.create_task(receive()), stream(), res, tail_s,
                        until_frames)
    res.audio = bytes(audio)
    return res


async def _converse(ws, reading: asyncio.Task, stream, res: ClientResult, tail_s: float,
                    until_frames: int | None, until=None) -> None:
    """A client's conversation once connected and reading: `stream` (its audio), then `tail_s`
    more of listening (or until `until_frames` answer frames came, or `until(res)` holds),
    then the close."""
    import aiohttp

    try:
        await stream
        deadline = time.perf_counter() + tail_s
        while not reading.done() and time.perf_counter() < deadline:
            if until_frames is not None and res.answer_samples // FRAME >= until_frames:
                break
            if until is not None and until(res):
                break
            await asyncio.sleep(0.01)
    except (asyncio.TimeoutError, ConnectionResetError, aiohttp.ClientError):
        pass
    finally:
        if not ws.closed:
            await ws.close()
        await reading


def realtime_url(url: str, query: str = "") -> str:
    return url.replace("http", "ws", 1).rstrip("/") + "/v1/realtime" + query


async def talk_realtime(url: str, pcm: np.ndarray, session: dict | None = None,
                        pace: float | None = FRAME_S, chunk: int = 2 * FRAME,
                        tail_s: float = 1.0, headers: dict | None = None, query: str = "",
                        until_frames: int | None = None, start: "asyncio.Barrier | None" = None,
                        keep: bool = False, ready_timeout: float = 30.0,
                        until=None) -> ClientResult:
    """One `/v1/realtime` client: connects, sends `session` as its session.update and waits
    for session.updated (None: sends none and streams at once), then appends `pcm` as PCM16,
    `chunk` bytes an event, one every `pace` seconds (None: as fast as it can), keeps reading
    `tail_s` more (or until `until_frames` answer frames came, or `until(result)` holds: a
    state to wait for, so `tail_s` can be long), then closes. `keep`: every event and the
    answer's PCM16 are kept in the result."""
    import aiohttp

    from personaplex_edge.audio import pcm16_bytes

    res = ClientResult()
    data = pcm16_bytes(pcm)
    audio = bytearray()
    sent_at: list[float] = []
    ready = asyncio.Event()
    t_connect = time.perf_counter()
    async with aiohttp.ClientSession() as http:
        try:
            ws = await http.ws_connect(realtime_url(url, query), headers=headers,
                                       max_msg_size=0)
        except aiohttp.WSServerHandshakeError as e:
            res.status = e.status
            return res

        async def receive() -> None:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                event = json.loads(msg.data)
                kind = event.get("type", "")
                if kind.endswith("audio.delta"):
                    answer = base64.b64decode(event["delta"])
                    res.heard(len(answer) // 2, sent_at)
                    if keep:
                        audio.extend(answer)
                        event = {**event, "delta": len(answer)}
                elif kind.endswith("audio_transcript.delta"):
                    res.text += event["delta"]
                    res.pieces += 1
                elif kind == "session.updated" and not ready.is_set():
                    res.handshake_s = time.perf_counter() - t_connect
                    ready.set()
                elif kind == "error":
                    res.errors.append(event["error"]["message"])
                if keep:
                    res.events.append(event)
            res.close_code = ws.close_code

        async def stream() -> None:
            if session is not None:
                await ws.send_str(json.dumps({"type": "session.update", "session": session}))
                await asyncio.wait_for(asyncio.shield(ready.wait()), ready_timeout)
            if start is not None:
                await asyncio.wait_for(start.wait(), ready_timeout)
            t0 = time.perf_counter()
            for i, at in enumerate(range(0, len(data), chunk)):
                if ws.closed:
                    break
                if pace is not None:
                    await asyncio.sleep(max(0.0, t0 + i * pace - time.perf_counter()))
                part = data[at:at + chunk]
                # the time each whole frame of this append was complete here
                done = (at + len(part)) // (2 * FRAME) - len(sent_at)
                sent_at.extend([time.perf_counter()] * max(0, done))
                await ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(part).decode()}))
                res.frames_sent = len(sent_at)

        await _converse(ws, asyncio.create_task(receive()), stream(), res, tail_s,
                        until_frames, until)
    res.audio = bytes(audio)
    return res


def wait_until(condition, timeout: float = 60.0) -> bool:
    """Whether `condition()` came true within `timeout` seconds (a server's thread moves on
    its own: its history, its slots). It returns as soon as it holds, so the default is long:
    a state a busy machine reaches late is not a failure."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# -- the server in a thread -----------------------------------------------------------------------
class LoopLag:
    """`with LoopLag(srv.loop, skip_after_s) as lag:` how late that event loop ran its timers meanwhile: a
    timer due every 10 ms on it, `lag.max_ms` the latest one ran (a busy machine, another
    thread holding the interpreter). A clock that steps on the same loop is late by as much,
    so a bound on its gaps is its period plus this, whatever the machine (`bound_ms`).

    `skip_after_s`, the clock's own rule (serve/webrtc/media.MAX_CLOCK_LAG_S): the probe keeps
    a fixed grid as a clock that catches up does (its steps due at start + k * 10 ms),
    skipping to now only once it is that far behind, so a loop busy for a while shows the
    lateness such a clock piles up before it skips, not just the longest single hold-up."""

    EVERY_S = 0.01

    def __init__(self, loop: asyncio.AbstractEventLoop, skip_after_s: float):
        self.loop = loop
        self.skip_after_s = skip_after_s
        self.max_ms = 0.0
        self._on = False

    def _tick(self, due: float) -> None:
        now = self.loop.time()
        self.max_ms = max(self.max_ms, 1000.0 * (now - due))
        if self._on:
            due = due + self.EVERY_S if now - due <= self.skip_after_s else now + self.EVERY_S
            self.loop.call_at(due, self._tick, due)

    def __enter__(self) -> "LoopLag":
        self._on = True
        self.loop.call_soon_threadsafe(lambda: self._tick(self.loop.time()))
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(setattr, self, "_on", False)

    def bound_ms(self, period_s: float, step_s: float) -> float:
        """The longest gap (ms) between two events of a clock on this loop that makes one every
        `period_s` in timer steps of `step_s` (and skips as `skip_after_s` says): the period,
        two steps (this probe's 10 ms between looks, the steps' own work) and the latest the
        probe ran."""
        return 1000.0 * (period_s + 2 * step_s) + self.max_ms


class ServerThread:
    """`with ServerThread(options) as srv:` a Server on its own event loop in a thread;
    srv.url, srv.server (its state: history, stats)."""

    def __init__(self, options, model=None):
        self.options = options
        self.model = model
        self.url = ""
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def __enter__(self) -> "ServerThread":
        self._thread = threading.Thread(target=self._run, daemon=True, name="serve-test")
        self._thread.start()
        self._ready.wait(120)
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        from personaplex_edge.runtime.serve.server import Server

        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                self.server = Server(self.options, model=self.model, progress=lambda s: None)
                await self.server.start()
            except BaseException as e:
                self._error = e
                self._ready.set()
                return
            self.url = self.server.url
            self._ready.set()
            await self._stop.wait()
            await self.server.stop()

        asyncio.run(main())

    def __exit__(self, *exc) -> None:
        if self._error is None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def state(self):
        return self.server.state

    def history(self) -> list[dict]:
        return list(self.server.state.history)


# -- the benchmark --------------------------------------------------------------------------------
def talk_paced(url: str, protocol: str, pcm: np.ndarray, pages: list[bytes] | None,
               **kw) -> "asyncio.Future[ClientResult]":
    """One client of either protocol streaming at real-time pace; `pages`: pcm as Opus pages
    (chat), made once for many clients."""
    if protocol == "realtime":
        return talk_realtime(url, pcm, session=kw.pop("session", {"type": "realtime"}),
                             pace=FRAME_S, **kw)
    kw.pop("session", None)
    return talk(url, pages if pages is not None else opus_pages(pcm), pace=FRAME_S, **kw)


def _clients_process(url: str, n: int, seconds: float, protocol: str, out) -> None:
    """In the child process: n paced clients at once, their results back through `out`."""
    pcm = speech(seconds)
    pages = opus_pages(pcm) if protocol == "chat" else None

    async def main():
        async def one(i: int):
            await asyncio.sleep(i * FRAME_S / n)  # clients start spread over a frame
            return await talk_paced(url, protocol, pcm, pages, tail_s=1.0)
        return await asyncio.gather(*(one(i) for i in range(n)))

    out.put([asdict(r) for r in asyncio.run(main())])


def run_load(srv: ServerThread, n: int, seconds: float, protocol: str = "chat") -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    before = len(srv.history())
    child = ctx.Process(target=_clients_process, args=(srv.url, n, seconds, protocol, queue))
    child.start()
    clients = queue.get(timeout=seconds + 120)
    child.join()
    deadline = time.monotonic() + 10
    while len(srv.history()) < before + n and time.monotonic() < deadline:
        time.sleep(0.05)
    sessions = srv.history()[before:]
    rt = [ClientResult(**c).round_trip() for c in clients]
    dropped = sum(s["dropped"] for s in sessions)
    ok = (len(sessions) == n and all(s["dropped"] == 0 for s in sessions)
          and all(s.get("frame_p99_ms", 1e9) < 80.0 for s in sessions)
          and all(not c["errors"] for c in clients))
    return {"protocol": protocol, "clients": n, "seconds": seconds, "keeps_up": ok,
            "dropped": [s["dropped"] for s in sessions],
            "frames": [s["frames"] for s in sessions],
            "frame_p50_ms": [round(s.get("frame_p50_ms", 0), 2) for s in sessions],
            "frame_p99_ms": [round(s.get("frame_p99_ms", 0), 2) for s in sessions],
            "frame_max_ms": [round(s.get("frame_max_ms", 0), 2) for s in sessions],
            # a client pairs its k-th answer with its k-th frame sent: meaningless once
            # frames were dropped
            "round_trip_p50_ms": [round(r.get("p50", 0), 1) for r in rt] if not dropped
            else None,
            "round_trip_p99_ms": [round(r.get("p99", 0), 1) for r in rt] if not dropped
            else None,
            "handshake_ms": [round(1000 * c["handshake_s"], 1) if c["handshake_s"] else None
                             for c in clients],  # connect -> handshake (default persona: cached)
            "errors": [e for c in clients for e in c["errors"]]}


def run_startup(srv: ServerThread, count: int, protocol: str = "chat") -> dict:
    """Connect -> handshake (/v1/realtime: -> session.updated) and connect -> first answer
    frame, one client at a time: `count` personas the server has not seen (cold: the batched
    prefill runs), each followed by the same persona again (warm: restored from the persona
    cache)."""
    from urllib.parse import quote

    pcm = speech(1.0)
    pages = opus_pages(pcm) if protocol == "chat" else None
    out: dict[str, dict[str, list[float]]] = {
        way: {"handshake_ms": [], "first_answer_ms": []} for way in ("cold", "warm")}
    for i in range(count):
        prompt = f"You are assistant number {i} of this benchmark."
        for way in ("cold", "warm"):
            r = asyncio.run(talk_paced(srv.url, protocol, pcm, pages, tail_s=2.0,
                                       until_frames=1, query="?text_prompt=" + quote(prompt)
                                       if protocol == "chat" else "",
                                       session={"type": "realtime", "instructions": prompt}))
            if r.errors or r.handshake_s is None or not r.round_trip_ms:
                raise RuntimeError(f"a {way} client failed: {r.errors or r.kinds}")
            out[way]["handshake_ms"].append(1000 * r.handshake_s)
            # the first frame goes out at the handshake: its round trip completes the start
            out[way]["first_answer_ms"].append(1000 * r.handshake_s + r.round_trip_ms[0])
    return out


def mid_model_dir(precision: str = "fp32") -> Path:
    """The mid LM with the real-size Mimi, exported once into models/mid (models/mid-int8 for
    --precision int8, ...)."""
    out = ROOT / "models" / ("mid" if precision == "fp32" else f"mid-{precision}")
    if (out / "manifest.json").is_file():
        return out
    import tempfile

    from mid_model import mid_config

    from personaplex_edge.export.hub import resolve_checkpoint
    from personaplex_edge.export.model_export import export_model
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    log(f"exporting the mid model into {out} (once)")
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_checkpoint(mid_config(), tmp)
        export_model(resolve_checkpoint(tmp), out, precision=precision, progress=log)
    return out


def print_run(r: dict) -> None:
    log(f"{r['protocol']}: {r['clients']:3d} clients x {r['seconds']:.0f} s: "
        f"{'keeps up' if r['keeps_up'] else 'FALLS BEHIND'}; dropped {sum(r['dropped'])}; "
        f"frame p99 (worst session) {max(r['frame_p99_ms'] or [0]):.1f} ms, p50 "
        f"{np.median(r['frame_p50_ms'] or [0]):.1f} ms; round trip p99 (worst) "
        + (f"{max(r['round_trip_p99_ms'] or [0]):.1f} ms" if r["round_trip_p99_ms"] is not None
           else "n/a (frames dropped)")
        + (f"; errors: {r['errors'][:2]}" if r["errors"] else ""))


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo", help="demo, mid, or a model directory")
    p.add_argument("--precision", default="fp32",
                   help="with --model mid: the export's --precision (fp32, int8, ...)")
    p.add_argument("--protocol", default="chat",
                   help="the clients' protocol: chat (/api/chat, Ogg/Opus) or realtime "
                        "(/v1/realtime, PCM16 in JSON); chat,realtime: both, each step of a "
                        "sweep run for one then the other, so both meet the same machine")
    p.add_argument("--clients", default="4",
                   help="clients at once; a comma-separated list runs each in turn (4,8,12), "
                        "every one, where --sweep stops at the first that falls behind")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--sweep", action="store_true",
                   help="raise --clients until the server no longer keeps up")
    p.add_argument("--max-clients", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", help="write every run here")
    p.add_argument("--startup", type=int, metavar="N", default=0,
                   help="instead of the load: N connections with a persona new to the server "
                        "(cold) and N with one it has (warm), one at a time: connect -> "
                        "handshake and -> first answer frame")
    args = p.parse_args()

    protocols = args.protocol.split(",")
    if not set(protocols) <= {"chat", "realtime"} or (args.startup and len(protocols) > 1):
        p.error("--protocol: chat, realtime, or (without --startup) chat,realtime")
    from personaplex_edge.model_ref import resolve_model
    from personaplex_edge.runtime.serve.server import ServeOptions

    model_dir = (mid_model_dir(args.precision) if args.model == "mid"
                 else resolve_model(args.model, log))
    counts = [int(n) for n in args.clients.split(",")]
    if args.sweep:
        counts = [1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18, 20, 24, 32, 48, 64]
        counts = [c for c in counts if c <= args.max_clients]
    options = ServeOptions(model_dir, model_name=args.model, port=0,
                           max_sessions=max(counts), threads=args.threads)
    report = {"model": args.model, "model_dir": str(model_dir), "protocol": args.protocol,
              "cores": len(os.sched_getaffinity(0)), "threads": args.threads}
    with ServerThread(options) as srv:
        log(f"serving {model_dir} at {srv.url} (batch {srv.server.model.batch})")
        if args.startup:
            report["startup"] = run_startup(srv, args.startup, protocols[0])
            for way, figures in report["startup"].items():
                log(f"{way}: connect -> handshake p50 {np.median(figures['handshake_ms']):.1f}"
                    f" ms (max {max(figures['handshake_ms']):.1f}), -> first answer frame p50 "
                    f"{np.median(figures['first_answer_ms']):.1f} ms")
        else:
            runs = report["runs"] = []
            going = list(protocols)
            for n in counts:
                for protocol in list(going):
                    r = run_load(srv, n, args.seconds, protocol)
                    print_run(r)
                    runs.append(r)
                    if args.sweep and not r["keeps_up"]:
                        going.remove(protocol)
                if not going:
                    break
            held = report["largest_that_keeps_up"] = {
                protocol: max([r["clients"] for r in runs
                               if r["protocol"] == protocol and r["keeps_up"]], default=0)
                for protocol in protocols}
            for protocol, n in held.items():
                log(f"{protocol}: largest number of sessions that keeps up: {n}")
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))

if __name__ == "__main__":
    main()
