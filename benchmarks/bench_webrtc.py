"""WebRTC calls to `personaplex-edge serve` (`POST /v1/realtime/calls`) from an aiortc client,
and what they cost: the latency the WebRTC path adds against the WebSocket one (mouth to ear on
loopback), the jitter buffer's depth, CPU per call, and how many calls this machine holds in
real time.

    python benchmarks/bench_webrtc.py --model demo --seconds 20 --cpu 4     # latency, CPU
    python benchmarks/bench_webrtc.py --model demo --seconds 20 --loss 0.05 --jitter-ms 40
    python benchmarks/bench_webrtc.py --model demo --sweep --seconds 20 [--json out.json]
    python benchmarks/bench_webrtc.py --model demo --soak 50 --seconds 3    # calls, one by one

Mouth to ear, both paths measured alike: from the moment a client hands the last sample of an
80 ms frame to its transport (the WebSocket's append sent; the call's RTP packet handed to
aiortc) to the moment the first sample of that frame's answer arrives (the audio delta; the RTP
packet), from when it can play; neither side's playout buffer counts. The call's jitter
buffer, its playout clock, Opus both ways and packet pacing are in it; the WebSocket's PCM16
in JSON is in the other.

The client injects loss and jitter itself (`--loss`, `--jitter-ms`): each outgoing RTP packet
is dropped with that probability, and the rest are each delayed by a uniform 0..jitter ms (so
they also arrive out of order). The tests import `call` from here (tests/test_serve_webrtc.py).
"""

from __future__ import annotations

import argparse
import asyncio
import fractions
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import (FRAME, FRAME_S, RATE, ServerThread, log, speech,  # noqa: E402
                         talk_realtime, wait_until)

CALL_RATE = 48000
PACKET = 960  # 20 ms at 48 kHz
LOOPBACK = ("127.0.0.1",)


@dataclass
class CallResult:
    status: int | None = None  # the POST's status
    error: str = ""  # the POST's body when it was refused
    location: str | None = None
    headers: dict = field(default_factory=dict)  # the POST's answer's
    answer_sdp: str = ""
    events: list[dict] = field(default_factory=list)  # every data channel event, in order
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # 24 kHz
    sent_at: list[float] = field(default_factory=list)  # per 20 ms packet handed to aiortc
    heard_at: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples@24k)
    packets_sent: int = 0
    packets_dropped: int = 0  # by the injected loss
    connected_s: float | None = None

    def transcript(self) -> str:
        return "".join(e["delta"] for e in self.events
                       if e["type"] == "response.output_audio_transcript.delta")

    def mouth_to_ear_ms(self, skipped_frames: int) -> np.ndarray:
        """Per answer frame k: its first sample's arrival - the sending of the last sample of
        the input frame it answers (k + `skipped_frames`: what the server dropped while its
        persona was prefilled). The first sample: from then on the frame can play."""
        if not self.heard_at:
            return np.zeros(0)
        arrivals = np.array([t for t, _ in self.heard_at])
        heard = np.cumsum([n for _, n in self.heard_at])
        out = []
        per_frame = FRAME * CALL_RATE // RATE // PACKET  # 4 packets a frame
        for k in range(int(heard[-1]) // FRAME):
            i = int(np.searchsorted(heard, k * FRAME, side="right"))
            last_packet = (k + skipped_frames + 1) * per_frame - 1
            if i < len(arrivals) and last_packet < len(self.sent_at):
                out.append(1000.0 * (arrivals[i] - self.sent_at[last_packet]))
        return np.array(out)


def speech_track(pcm24: np.ndarray, result: CallResult):
    """An aiortc audio track that plays `pcm24` (float32 at 24 kHz) at 48 kHz in real time,
    then silence, stamping when each 20 ms packet is handed over."""
    import av
    import soxr
    from aiortc.mediastreams import MediaStreamTrack

    pcm48 = soxr.resample(pcm24.astype(np.float32), RATE, CALL_RATE)
    pcm16 = np.clip(np.round(pcm48 * 32767.0), -32768, 32767).astype(np.int16)

    class SpeechTrack(MediaStreamTrack):
        kind = "audio"

        def __init__(self):
            super().__init__()
            self._n = 0
            self._start: float | None = None

        async def recv(self):
            loop = asyncio.get_running_loop()
            if self._start is None:
                self._start = loop.time()
            delay = self._start + self._n * PACKET / CALL_RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            chunk = pcm16[self._n * PACKET:(self._n + 1) * PACKET]
            if chunk.shape[0] < PACKET:
                chunk = np.concatenate([chunk, np.zeros(PACKET - chunk.shape[0], np.int16)])
            frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = CALL_RATE
            frame.pts = self._n * PACKET
            frame.time_base = fractions.Fraction(1, CALL_RATE)
            self._n += 1
            result.sent_at.append(time.perf_counter())
            return frame

    return SpeechTrack(), pcm16.shape[0] // PACKET


def lossy(dtls, loss: float, jitter_ms: float, rng: random.Random, result: CallResult,
          blackout: tuple[float, float] | None = None) -> None:
    """The client's outgoing RTP (not RTCP) through a bad network: dropped with probability
    `loss`, the rest each delayed by a uniform 0..jitter_ms; `blackout` (start, seconds after
    the first packet): every packet in that window dropped, as a network that stalls."""
    send = dtls._send_rtp
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task] = set()
    first: list[float] = []

    async def later(data: bytes, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await send(data)
        except ConnectionError:
            pass

    async def bad_network(data: bytes) -> None:
        if 200 <= data[1] <= 207:  # RTCP: the reports go through untouched
            await send(data)
            return
        result.packets_sent += 1
        first[:] = first or [loop.time()]
        in_blackout = blackout is not None and \
            blackout[0] <= loop.time() - first[0] < blackout[0] + blackout[1]
        if in_blackout or rng.random() < loss:
            result.packets_dropped += 1
            return
        if jitter_ms <= 0:
            await send(data)
            return
        task = loop.create_task(later(data, rng.uniform(0, jitter_ms) / 1000.0))
        pending.add(task)
        task.add_done_callback(pending.discard)

    dtls._send_rtp = bad_network


async def call(url: str, pcm24: np.ndarray, *, token: str | None = None,
               session: dict | None = None, channel: bool = True, tail_s: float = 1.0,
               loss: float = 0.0, jitter_ms: float = 0.0, seed: int = 0,
               blackout: tuple[float, float] | None = None,
               send_at: tuple[tuple[float, dict], ...] = (),
               send_update: dict | None = None, hang_up: str = "close",
               headers: dict | None = None, offer_filter=None,
               first_audio: asyncio.Event | None = None,
               stop: asyncio.Event | None = None,
               ignore_message_limit: bool = False) -> CallResult:
    """One call: offers an Opus track (and the `oai-events` channel, unless `channel` is
    False), posts the offer (application/sdp, or a multipart form with `session`), streams
    `pcm24` at real-time pace and then `tail_s` of silence, records every event and the
    answer's audio (decoded by libopus at 24 kHz), then hangs up (`close`: the peer connection
    closes; `delete`: DELETE on the call, then close; `vanish`: the client stops answering
    anything, as a peer whose network went away). `offer_filter(sdp) -> sdp` edits the offer;
    `send_at`: (seconds after the channel opened, event) sent on it; `first_audio` is set when
    the answer's first packet arrives; the call hangs up early once `stop` is set. A call the
    server ends returns at once. `ignore_message_limit`: a client that sends messages over the
    answer's max-message-size (aiortc itself refuses to)."""
    import aiohttp
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from aiortc.sdp import SessionDescription

    from personaplex_edge.runtime.serve import libopus
    from personaplex_edge.runtime.serve.webrtc.ice import gathering_on
    from personaplex_edge.runtime.serve.webrtc.media import tap_rtp

    res = CallResult()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    track, packets = speech_track(pcm24, res)
    pc.addTrack(track)
    if channel:
        dc = pc.createDataChannel("oai-events")

        @dc.on("open")
        def on_open() -> None:
            if ignore_message_limit:  # the answer's limit, read as SCTP started
                pc.sctp._remote_max_message_size = None
            if send_update is not None:
                dc.send(json.dumps({"type": "session.update", "session": send_update}))
            for delay, event in send_at:  # events at their moments after the channel opened
                asyncio.get_running_loop().call_later(
                    delay, lambda e=event: dc.readyState == "open" and dc.send(json.dumps(e)))

        @dc.on("message")
        def on_message(message) -> None:
            res.events.append(json.loads(message))

    decoder = libopus.Decoder(RATE)
    buf = np.zeros(decoder.max_samples, np.float32)
    audio: list[np.ndarray] = []

    def heard(seq: int, timestamp: int, payload: bytes) -> None:
        n = decoder.decode(payload, buf)
        audio.append(buf[:n].copy())
        res.heard_at.append((time.perf_counter(), n))
        if first_audio is not None:
            first_audio.set()

    connected, ended = asyncio.Event(), asyncio.Event()
    t0 = time.perf_counter()

    @pc.on("connectionstatechange")
    def on_state() -> None:
        if pc.connectionState == "connected":
            res.connected_s = time.perf_counter() - t0
            connected.set()
        elif pc.connectionState in ("closed", "failed"):  # the server hung up
            ended.set()

    with gathering_on(LOOPBACK):
        await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    if offer_filter is not None:
        sdp = offer_filter(sdp)
    hdrs = dict(headers or {})
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as http:
        if session is not None:
            form = aiohttp.FormData(default_to_multipart=True)
            form.add_field("sdp", sdp)
            form.add_field("session", json.dumps(session))
            post = http.post(url.rstrip("/") + "/v1/realtime/calls", data=form, headers=hdrs)
        else:
            hdrs["Content-Type"] = "application/sdp"
            post = http.post(url.rstrip("/") + "/v1/realtime/calls", data=sdp, headers=hdrs)
        async with post as r:
            res.status = r.status
            body = await r.text()
            res.location = r.headers.get("Location")
            res.headers = dict(r.headers)
        if res.status != 201:
            res.error = body
            await pc.close()
            return res
        res.answer_sdp = body
        await pc.setRemoteDescription(RTCSessionDescription(body, "answer"))
        audio_t = next(t for t in pc.getTransceivers() if t.kind == "audio")
        opus = next(c.payloadType for m in SessionDescription.parse(body).media
                    if m.kind == "audio" for c in m.rtp.codecs if c.name.lower() == "opus")
        tap_rtp(audio_t.receiver, opus, heard)
        sender = audio_t.sender
        if loss or jitter_ms or blackout:
            lossy(sender.transport, loss, jitter_ms, random.Random(seed), res, blackout)
        await asyncio.wait_for(connected.wait(), 10)
        deadline = time.perf_counter() + packets * PACKET / CALL_RATE + tail_s
        while time.perf_counter() < deadline and not ended.is_set() and \
                not (stop is not None and stop.is_set()):
            await asyncio.sleep(0.05)
        if hang_up == "delete":
            async with http.delete(url.rstrip("/") + res.location, headers=hdrs) as r:
                assert r.status == 204, (r.status, await r.text())
            await asyncio.sleep(0.3)  # the server's last events
        if hang_up == "vanish":
            # the peer's network is gone: nothing it sends arrives any more, and it never
            # says goodbye (its sockets are closed without DTLS's close_notify)
            for transceiver in pc.getTransceivers():
                ice = transceiver.sender.transport.transport
                for protocol in list(ice._connection._protocols):
                    protocol.transport.close()
            await asyncio.sleep(0.1)
    await pc.close()
    res.audio = np.concatenate(audio) if audio else np.zeros(0, np.float32)
    return res


def udp_sockets() -> int:
    """UDP sockets this process holds (its file descriptors found in /proc/net/udp{,6})."""
    inodes = set()
    for name in ("udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        inodes.update(line.split()[9] for line in lines)
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            held += 1
    return held


# -- the benchmark --------------------------------------------------------------------------------
def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def latency(url: str, srv, pcm: np.ndarray, loss: float, jitter_ms: float) -> dict:
    """One call and one WebSocket session on the same speech: mouth to ear of each."""
    res = asyncio.run(call(url, pcm, tail_s=1.0, loss=loss, jitter_ms=jitter_ms))
    wait_until(lambda: srv.state.slots_used == 0, 10)
    summary = srv.history()[-1]
    skipped = summary["dropped"]
    rtc = res.mouth_to_ear_ms(skipped)[12:]  # past the first second
    ws = asyncio.run(talk_realtime(url, pcm, session={"type": "realtime"}, tail_s=1.0))
    ws_ms = np.asarray(ws.round_trip_ms[12:])
    return {"webrtc_ms": _pcts(rtc), "websocket_ms": _pcts(ws_ms),
            "added_ms_p50": float(np.percentile(rtc, 50) - np.percentile(ws_ms, 50)),
            "jitter_buffer_ms": {"depth_mean": summary["depth_mean_ms"],
                                 "target_at_end": summary["target_ms"]},
            "call": {k: summary[k] for k in ("lost", "fec", "late", "underruns", "concealed",
                                             "concealed_ms", "out_crowded", "clock_gap_max_ms",
                                             "rtt_ms", "jitter_ms", "frames", "dropped")},
            "client": {"packets_sent": res.packets_sent, "dropped": res.packets_dropped}}


def _pcts(a: np.ndarray) -> dict:
    if a.size == 0:
        return {}
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "max": float(a.max()), "frames": int(a.size)}


def _calls_process(url: str, n: int, seconds: float, protocol: str, out) -> None:
    """In a child process (the clients' Python is not the server's): n clients at once,
    WebRTC calls or /v1/realtime WebSocket sessions; their statuses back through `out`."""
    pcm = speech(seconds)

    async def one(i: int):
        await asyncio.sleep(i * FRAME_S / n)  # spread over a frame, as bench_serve's are
        if protocol == "webrtc":
            return (await call(url, pcm, tail_s=0.5, seed=i)).status
        res = await talk_realtime(url, pcm, session={"type": "realtime"}, tail_s=0.5)
        return 201 if res.round_trip_ms else res.status

    async def main():
        return await asyncio.gather(*(one(i) for i in range(n)))

    out.put(asyncio.run(main()))


def load(srv, n: int, seconds: float, protocol: str) -> dict:
    """n clients of `protocol` (webrtc, websocket) at once: did every session keep up, and the
    server's CPU per session-second (this process: the server, its event loop and model)."""
    import multiprocessing
    import resource

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    before = len(srv.history())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    child = ctx.Process(target=_calls_process, args=(srv.url, n, seconds, protocol, queue))
    child.start()
    statuses = queue.get(timeout=seconds + 120)
    child.join()
    wait_until(lambda: srv.state.slots_used == 0, 10)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    summaries = srv.history()[before:]
    seconds_held = sum(s["seconds"] for s in summaries)
    ok = statuses == [201] * n and len(summaries) == n and all(
        s["dropped"] <= 10 and s["frame_p99_ms"] < 1000 * FRAME_S for s in summaries)
    row = {"protocol": protocol, "sessions": n, "kept_up": ok,
           "cpu_per_session_s": cpu / seconds_held if seconds_held else None,
           "cpu_cores_used": cpu / wall,
           "frame_p99_ms": max((s.get("frame_p99_ms", 0) for s in summaries), default=None),
           "dropped": sum(s["dropped"] for s in summaries)}
    if protocol == "webrtc":
        row["clock_gap_max_ms"] = max(s["clock_gap_max_ms"] for s in summaries)
        row["concealed"] = sum(s["concealed"] for s in summaries)
    return row


def main(argv: list[str] | None = None) -> int:
    from personaplex_edge.model_ref import resolve_model
    from personaplex_edge.runtime.serve import ServeOptions

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--sweep", action="store_true", help="raise the calls at once until one "
                                                        "falls behind")
    p.add_argument("--cpu", type=int, default=0, metavar="N",
                   help="also N calls at once, then N WebSocket sessions: the server's CPU "
                        "per session-second of each")
    p.add_argument("--soak", type=int, default=0, help="this many calls one after the other")
    p.add_argument("--json")
    args = p.parse_args(argv)
    model_dir = resolve_model(args.model, log)
    pcm = speech(args.seconds)
    out: dict = {"machine": _cpu_name(), "cores": os.cpu_count(), "model": args.model}
    with ServerThread(ServeOptions(model_dir, port=0, max_sessions=64)) as srv:
        if args.soak:
            before = udp_sockets()
            t0 = time.perf_counter()
            for i in range(args.soak):
                res = asyncio.run(call(srv.url, pcm, tail_s=0.2, seed=i, loss=args.loss,
                                       jitter_ms=args.jitter_ms))
                assert res.status == 201, res.error
            deadline = time.monotonic() + 10
            while srv.state.slots_used and time.monotonic() < deadline:
                time.sleep(0.05)
            out["soak"] = {"calls": args.soak, "seconds": time.perf_counter() - t0,
                           "sessions_left": srv.state.slots_used,
                           "udp_sockets_left": udp_sockets() - before}
        elif args.sweep:
            rows = []
            for n in (1, 2, 4, 6, 8, 10, 12, 14, 16):
                row = load(srv, n, args.seconds, "webrtc")
                log(json.dumps(row))
                rows.append(row)
                if not row["kept_up"]:
                    break
            out["sweep"] = rows
            out["held"] = max((r["sessions"] for r in rows if r["kept_up"]), default=0)
        else:
            out["latency"] = latency(srv.url, srv, pcm, args.loss, args.jitter_ms)
            if args.cpu:
                out["cpu"] = [load(srv, args.cpu, args.seconds, protocol)
                              for protocol in ("webrtc", "websocket")]
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
