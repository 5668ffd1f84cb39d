"""A call's audio, both ways, on one Opus track at 48 kHz.

    in:   RTP packets (aiortc's receiver, tapped)  ->  the jitter buffer (jitter.py)  ->  the
          playout clock, every 20 ms of this machine's time: 20 ms decoded or concealed at the
          model's 24 kHz  ->  whole 1920-sample frames  ->  the session's backlog
    out:  the model's answer frames  ->  20 ms Opus packets of 24 kHz audio (libopus, inband
          FEC on)  ->  aiortc's sender: each answer frame spread over the 80 ms it stands for
          from the moment it is ready (its first packet at once, one every 20 ms after), its
          RTP time contiguous with the last. So the way out is paced by the frame clock: a
          late answer goes out late (the peer's jitter buffer absorbs it) and costs no latency
          after it, and nothing is added that the model did not say

So the model's frame clock is this machine's, never the network's: the playout clock pushes a
frame every 80 ms whatever arrives, and what does not arrive in time is concealed. aiortc does
the ICE, DTLS, SRTP and RTCP; the packets' payloads are decoded here (not by aiortc's own
receive path, whose jitter buffer waits for a lost packet instead of concealing it).

The track is Opus at 48 kHz as RTP and SDP know it (every Opus stream's clock); libopus codes
it from and decodes it to 24 kHz itself, statefully: CELT simply leaves out the bands above
12 kHz and SILK works below 8 kHz anyway, so no resampler sits on either way (a linear-phase
one, soxr's HQ, costs 32 ms each way: docs/measured.md).
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from .. import libopus
from .jitter import JitterBuffer

CLOCK_RATE = 48000  # Hz: the RTP timestamps of every Opus stream
PACKET_S = 0.02  # the Opus packets this server sends, and its playout clock's step
MAX_CLOCK_LAG_S = 0.2  # an event loop held up longer than this skips, rather than bursts
MIN_GAP_S = 0.01  # between two packets when an answer comes before the last one's are out
MAX_OUT_QUEUE = 10  # 20 ms packets waiting to go out (0.2 s); past it the oldest are dropped
OPUS_BITRATE = 32000  # bits/s: wideband speech with room for the inband FEC copy
OPUS_LOSS_PERCENT = 10  # what the encoder plans its FEC for


@dataclass
class OutStats:
    packets: int = 0  # packets sent (none before the first answer)
    crowded: int = 0  # packets sent closer than 20 ms to the last: an answer came early
    dropped: int = 0  # packets dropped from a queue that grew past MAX_OUT_QUEUE


class AnswerTrack(MediaStreamTrack):
    """The model's answers as the audio track the call sends: `put` them; aiortc's sender
    pulls `recv`, one Opus packet per slot."""

    kind = "audio"

    def __init__(self, rate: int):
        super().__init__()
        self.stats = OutStats()
        self.packet_samples = int(rate * PACKET_S)
        self._encoder = libopus.Encoder(rate)
        self._encoder.set(libopus.SET_BITRATE, OPUS_BITRATE)
        self._encoder.set(libopus.SET_INBAND_FEC, 1)
        self._encoder.set(libopus.SET_PACKET_LOSS_PERC, OPUS_LOSS_PERCENT)
        self._carry = np.zeros(0, np.float32)
        self._packets: deque[tuple[float, np.ndarray]] = deque()  # (when it goes, samples)
        self._arrived = asyncio.Event()
        self._last_at: float | None = None  # when the last packet queued goes (loop time)
        self._pts = 0
        self._time_base = fractions.Fraction(1, CLOCK_RATE)

    def put(self, frame: np.ndarray) -> None:
        """One answer frame at the track's rate: its packets, each with its time to go."""
        size = self.packet_samples
        pcm = np.concatenate([self._carry, frame]) if self._carry.size else frame
        n = pcm.shape[0] // size
        now = asyncio.get_running_loop().time()
        for i in range(n):
            at = now + i * PACKET_S
            if self._last_at is not None and at < self._last_at + PACKET_S - 0.001:
                at = max(at, self._last_at + MIN_GAP_S)
                self.stats.crowded += 1
            self._last_at = at
            self._packets.append((at, pcm[i * size:(i + 1) * size]))
        self._carry = pcm[n * size:].copy()
        while len(self._packets) > MAX_OUT_QUEUE:
            self._packets.popleft()
            self.stats.dropped += 1
        self._arrived.set()

    def clear(self) -> None:
        """Drops what waits to go out (the peer cut the answer off)."""
        self.stats.dropped += len(self._packets)
        self._packets.clear()
        self._carry = np.zeros(0, np.float32)

    async def recv(self):
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        while not self._packets:
            self._arrived.clear()
            await self._arrived.wait()
        at, pcm = self._packets.popleft()
        if at > loop.time():
            await asyncio.sleep(at - loop.time())
        packet = av.Packet(self._encoder.encode(np.ascontiguousarray(pcm)))
        packet.pts, packet.time_base = self._pts, self._time_base
        self._pts += int(CLOCK_RATE * PACKET_S)
        self.stats.packets += 1
        return packet


class RtpIn:
    """The call's inbound audio: `push` each RTP packet of the Opus payload type; `run` is the
    playout clock, handing whole model frames to `deliver`."""

    def __init__(self, rate: int, frame_size: int,
                 deliver: Callable[[list[np.ndarray], int], None]):
        self.jitter = JitterBuffer(libopus.Decoder(rate), CLOCK_RATE)
        self.packet_samples = int(rate * PACKET_S)
        self.frame_size = frame_size
        self._pending = np.zeros(0, np.float32)  # samples short of a whole frame
        self._deliver = deliver
        self.last_packet: float | None = None  # monotonic seconds
        self.frames = 0  # model frames handed over
        self.clock_gap_max_ms = 0.0  # the longest wait between two of them
        self._last_frame: float | None = None

    def push(self, seq: int, timestamp: int, payload: bytes) -> None:
        now = time.monotonic()
        self.last_packet = now
        self.jitter.push(seq, timestamp, payload, now)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += PACKET_S
            delay = next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif -delay > MAX_CLOCK_LAG_S:
                next_at = loop.time()
            pcm = self.jitter.pull(self.packet_samples)
            if pcm is None:
                continue
            pcm = np.concatenate([self._pending, pcm]) if self._pending.size else pcm
            n = pcm.shape[0] // self.frame_size
            frames = [pcm[i * self.frame_size:(i + 1) * self.frame_size] for i in range(n)]
            self._pending = pcm[n * self.frame_size:]
            if frames:
                now = time.monotonic()
                if self._last_frame is not None:
                    self.clock_gap_max_ms = max(self.clock_gap_max_ms,
                                                1000.0 * (now - self._last_frame))
                self._last_frame = now
                self.frames += len(frames)
                self._deliver(frames, sum(f.shape[0] for f in frames))


def tap_rtp(receiver, payload_type: int, sink: Callable[[int, int, bytes], None]) -> None:
    """Hands every RTP packet of `payload_type` that `receiver` (an aiortc RTCRtpReceiver) gets
    to `sink(seq, timestamp, payload)`, and keeps aiortc's own handling for its RTCP (the
    receiver reports that give the peer its loss, jitter and round trip) but not its decoding:
    on the first packet aiortc's decoder thread is stopped, as aiortc stops it when a
    transport goes away. Relies on aiortc 1.15-1.16's receiver (`_handle_rtp_packet`,
    `_handle_disconnect`); tests/test_serve_webrtc.py fails if a new aiortc changes them."""
    original = receiver._handle_rtp_packet
    decoding = [True]

    async def handle(packet, arrival_time_ms: int) -> None:
        if packet.payload_type == payload_type:
            sink(packet.sequence_number, packet.timestamp, packet.payload)
        if decoding[0]:
            decoding[0] = False
            receiver._handle_disconnect()
        await original(packet, arrival_time_ms=arrival_time_ms)

    receiver._handle_rtp_packet = handle
