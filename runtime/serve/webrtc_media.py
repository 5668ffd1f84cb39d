"""A call's audio, both ways, on one Opus track at 48 kHz.

    in:   RTP packets (aiortc's receiver, tapped)  ->  the jitter buffer (jitter.py)  ->  the
          playout clock, every 20 ms of this machine's time: 960 samples, decoded or concealed
          ->  48 -> 24 kHz  ->  whole 1920-sample frames  ->  the session's backlog
    out:  the model's answer frames  ->  24 -> 48 kHz  ->  20 ms Opus packets (libopus, inband
          FEC on)  ->  aiortc's sender, one packet per 20 ms slot from the first answer on; a
          slot with no answer ready plays silence, counted

So the model's frame clock is this machine's, never the network's: the playout clock pushes a
frame every 80 ms whatever arrives, and what does not arrive in time is concealed. aiortc does
the ICE, DTLS, SRTP and RTCP; the packets' payloads are decoded here (not by aiortc's own
receive path, whose jitter buffer waits for a lost packet instead of concealing it).
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from . import libopus
from .jitter import JitterBuffer
from .resample import CALL_RATE, Downsampler, Upsampler

log = logging.getLogger("personaplex_edge.serve")

PACKET_S = 0.02  # the Opus packets this server sends, and its playout clock's step
PACKET_SAMPLES = int(CALL_RATE * PACKET_S)  # 960
MAX_CLOCK_LAG_S = 0.2  # an event loop held up longer than this skips, rather than bursts
OUT_GRACE_S = 0.01  # how long an output slot waits for a late answer before silence
MAX_OUT_QUEUE = 25  # 20 ms packets waiting to go out (0.5 s); past it the oldest are dropped
OPUS_BITRATE = 32000  # bits/s: wideband speech with room for the inband FEC copy
OPUS_LOSS_PERCENT = 10  # what the encoder plans its FEC for


@dataclass
class OutStats:
    packets: int = 0  # packets sent
    silence: int = 0  # slots with no answer ready (before the first answer: none are sent)
    dropped: int = 0  # packets dropped from a queue that grew past MAX_OUT_QUEUE


class AnswerTrack(MediaStreamTrack):
    """The model's answers as the audio track the call sends: `put` them; aiortc's sender
    pulls `recv`, one Opus packet per slot."""

    kind = "audio"

    def __init__(self):
        super().__init__()
        self.stats = OutStats()
        self._encoder = libopus.Encoder(CALL_RATE)
        self._encoder.set(libopus.SET_BITRATE, OPUS_BITRATE)
        self._encoder.set(libopus.SET_INBAND_FEC, 1)
        self._encoder.set(libopus.SET_PACKET_LOSS_PERC, OPUS_LOSS_PERCENT)
        self._up: Upsampler | None = None
        self._carry = np.zeros(0, np.float32)
        self._packets: deque[np.ndarray] = deque()
        self._arrived = asyncio.Event()
        self._next_at: float | None = None  # the next packet's slot (loop time)
        self._pts = 0
        self._silence = np.zeros(PACKET_SAMPLES, np.float32)
        self._time_base = fractions.Fraction(1, CALL_RATE)

    def put(self, frame: np.ndarray, rate: int) -> None:
        """One answer frame at the model's rate."""
        if self._up is None:
            self._up = Upsampler(rate, CALL_RATE)
        pcm = self._up.feed(frame)
        pcm = np.concatenate([self._carry, pcm]) if self._carry.size else pcm
        n = pcm.shape[0] // PACKET_SAMPLES
        for i in range(n):
            self._packets.append(pcm[i * PACKET_SAMPLES:(i + 1) * PACKET_SAMPLES])
        self._carry = pcm[n * PACKET_SAMPLES:].copy()
        while len(self._packets) > MAX_OUT_QUEUE:
            self._packets.popleft()
            self.stats.dropped += 1
        self._arrived.set()

    async def _wait(self, timeout: float | None) -> None:
        self._arrived.clear()
        try:
            await asyncio.wait_for(self._arrived.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def recv(self):
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        while self._next_at is None and not self._packets:  # nothing said yet
            await self._wait(None)
        if self._next_at is None:
            self._next_at = loop.time()
        delay = self._next_at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if not self._packets:
            await self._wait(OUT_GRACE_S)
        if self._packets:
            pcm = self._packets.popleft()
        else:
            pcm = self._silence
            self.stats.silence += 1
        self._next_at += PACKET_S
        if loop.time() - self._next_at > MAX_CLOCK_LAG_S:
            self._next_at = loop.time()
        packet = av.Packet(self._encoder.encode(np.ascontiguousarray(pcm)))
        packet.pts, packet.time_base = self._pts, self._time_base
        self._pts += PACKET_SAMPLES
        self.stats.packets += 1
        return packet


class RtpIn:
    """The call's inbound audio: `push` each RTP packet of the Opus payload type; `run` is the
    playout clock, handing whole model frames to `deliver`."""

    def __init__(self, rate: int, frame_size: int,
                 deliver: Callable[[list[np.ndarray], int], None]):
        self.jitter = JitterBuffer(libopus.Decoder(CALL_RATE))
        self._down = Downsampler(rate, frame_size)
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
            pcm = self.jitter.pull(PACKET_SAMPLES)
            if pcm is None:
                continue
            frames = self._down.feed(pcm)
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
    transport goes away. Relies on aiortc 1.16's receiver (`_handle_rtp_packet`,
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
