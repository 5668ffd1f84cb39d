"""A call's jitter buffer: the Opus packets of its RTP track, as they arrive (late, lost,
reordered, in bursts), in; exactly the samples the playout clock asks for, out.

The clock never waits on the network. Each pull takes the next packet by sequence number:

    there      -> decoded
    missing, a later one there  -> lost: concealed from the next packet's forward error
                                   correction copy (FEC) where it carries one, else by the
                                   codec's loss concealment (PLC); its turn is over (a packet
                                   that comes after its turn is late, and dropped). Turns the
                                   underruns below already concealed are not concealed twice:
                                   after a stall the buffer is as deep as before it
    missing, nothing after it   -> an underrun: concealed, its turn kept (the buffer grows by
                                   one packet if the packet was only late: it adapts to the
                                   network's jitter)

and the buffer shrinks back: when for a whole second it never held less than its target plus
a packet, its oldest packet is discarded; when it holds more than SNAP_MS over its target (a
burst after a stall), the oldest are discarded at once down to the target.

What it holds is bounded whatever the caller sends: a packet more than MAX_AHEAD_MS ahead of
the playout point means the stream jumped (a stall longer than that, or a caller skipping
sequence numbers): the playout point moves up to it and what was held before it is discarded,
so a packet is never kept that its turn would not come for; and past MAX_PACKETS held (a caller
of very short packets) the oldest go. The target follows
the measured interarrival jitter (RFC 3550's estimate). Every outcome is counted
(`JitterStats`), so /metrics and the session's stats say what the network did to a call and
what the model heard instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .. import libopus

SEQ_MOD = 1 << 16
TS_MOD = 1 << 32
MIN_TARGET_MS = 20.0  # one packet: arrival is never perfectly even
MAX_TARGET_MS = 200.0  # past this the network is too bad to hide: latency stays bounded
START_MS = 40.0  # buffered before the first pull plays, while the jitter is not known yet
SHRINK_WINDOW_MS = 1000.0  # a depth held this long above the target is latency to give back
SNAP_MS = 100.0  # this much over the target is given back at once
RESYNC_PACKETS = 1000  # a jump this far in sequence is a new stream, not loss
MAX_AHEAD_MS = 1000.0  # a packet further ahead of the playout point: the stream jumped to it
MAX_PACKETS = 128  # held at once, whatever their length (1 s of 7.5 ms packets)
MAX_GAP_MS = 1000.0  # a timestamp gap (the sender's DTX) is filled with at most this much


@dataclass
class JitterStats:
    received: int = 0  # packets that arrived
    played: int = 0  # decoded in their turn
    lost: int = 0  # never there in their turn (concealed, or covered by an underrun's)
    fec: int = 0  # of the lost, rebuilt from the next packet's FEC data (a SILK or hybrid one)
    late: int = 0  # arrived after their turn, dropped
    duplicate: int = 0
    underruns: int = 0  # nothing to play: a concealed packet while waiting
    discarded: int = 0  # dropped to bring the depth back to the target
    concealed: int = 0  # turns the model heard concealed (lost or underrun)
    concealed_ms: float = 0.0  # audio the model heard that did not come from the peer
    jitter_ms: float = 0.0  # RFC 3550 interarrival jitter
    depth_ms: float = 0.0  # audio waiting now
    target_ms: float = START_MS
    pulls: int = 0  # the playout clock's pulls since the start
    depth_total_ms: float = 0.0  # the depth after each pull, summed

    @property
    def depth_mean_ms(self) -> float:
        """The depth the clock's pulls left, on average: the latency the buffer adds."""
        return self.depth_total_ms / self.pulls if self.pulls else 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out["depth_mean_ms"] = self.depth_mean_ms
        return out


def _may_carry_fec(packet: bytes) -> bool:
    """Whether an Opus packet can hold the previous one's FEC copy: only SILK and hybrid ones
    can (TOC configurations 0-15); a CELT-only packet's 'FEC' would be plain concealment."""
    return len(packet) > 0 and packet[0] >> 3 < 16


class JitterBuffer:
    """Packets of one Opus stream in (`push`), samples at the decoder's rate out (`pull`);
    RTP timestamps count at `clock_rate` (Opus's is 48 kHz whatever rate it is decoded at).
    Not thread-safe: one event loop pushes and pulls."""

    def __init__(self, decoder: libopus.Decoder, clock_rate: int = 48000):
        self.decoder = decoder
        self.rate = decoder.rate
        self.clock_rate = clock_rate
        self.stats = JitterStats()
        self._packets: dict[int, tuple[int, bytes]] = {}  # extended seq -> (timestamp, payload)
        self._highest: int | None = None  # extended seq of the newest packet
        self._expected: int | None = None  # extended seq of the next turn; None: not started
        self._next_ts: int | None = None  # the timestamp the next turn should start at
        self._packet_samples = self.rate // 50  # 20 ms until a packet says otherwise
        # decoded samples not pulled yet, then room for the longest packet
        self._pcm = np.zeros(4 * decoder.max_samples, np.float32)
        self._filled = 0
        self._last_arrival: tuple[float, int] | None = None  # (seconds, timestamp)
        self._window_ms = 0.0
        self._window_min_ms = float("inf")
        self._owed = 0  # underrun turns concealed since a packet was last played or lost

    # -- in ---------------------------------------------------------------------------------------
    def push(self, seq: int, timestamp: int, payload: bytes, arrival: float) -> None:
        """One RTP packet's sequence number, timestamp and Opus payload, and when it arrived
        (seconds, a monotonic clock)."""
        s = self.stats
        s.received += 1
        ext = self._extend(seq)
        if self._highest is not None and abs(ext - self._highest) > RESYNC_PACKETS:
            self._restart()  # the sender started over (a new stream): follow it
            ext = seq
        if self._expected is not None and ext < self._expected:
            s.late += 1
            return
        if ext in self._packets:
            s.duplicate += 1
            return
        if not payload:
            return  # an empty payload (keep-alive): nothing to play
        point = self._expected if self._expected is not None else min(self._packets, default=ext)
        if (ext - point) * self._packet_ms > MAX_AHEAD_MS:
            self._jump(ext)
        self._packets[ext] = (timestamp, payload)
        while len(self._packets) > MAX_PACKETS:
            self._jump(min(self._packets) + 1)
        if self._highest is None or ext > self._highest:
            self._highest = ext
            self._update_jitter(arrival, timestamp)
        self._update_depth()

    def _extend(self, seq: int) -> int:
        """A 16-bit sequence number -> one that keeps counting past the wrap, nearest the
        newest packet's."""
        if self._highest is None:
            return seq
        base = self._highest - (self._highest % SEQ_MOD)
        candidates = (base - SEQ_MOD + seq, base + seq, base + SEQ_MOD + seq)
        return min(candidates, key=lambda c: abs(c - self._highest))

    def _update_jitter(self, arrival: float, timestamp: int) -> None:
        if self._last_arrival is not None:
            last_arrival, last_ts = self._last_arrival
            sent = ((timestamp - last_ts) % TS_MOD) / self.clock_rate
            d = abs((arrival - last_arrival) - sent)
            self.stats.jitter_ms += (1000.0 * d - self.stats.jitter_ms) / 16.0
        self._last_arrival = (arrival, timestamp)
        target = MIN_TARGET_MS + 2.0 * self.stats.jitter_ms
        self.stats.target_ms = float(np.clip(target, MIN_TARGET_MS, MAX_TARGET_MS))

    def _update_depth(self) -> None:
        if self._highest is None:
            self.stats.depth_ms = 0.0
            return
        first = self._expected if self._expected is not None else min(self._packets, default=0)
        packets = max(0, self._highest - first + 1) if self._packets else 0
        self.stats.depth_ms = packets * self._packet_ms + 1000.0 * self._filled / self.rate

    @property
    def _packet_ms(self) -> float:
        return 1000.0 * self._packet_samples / self.rate

    @property
    def held(self) -> int:
        """Packets waiting for their turn."""
        return len(self._packets)

    def _jump(self, ext: int) -> None:
        """The playout point moves up to `ext`: the packets held before it are discarded, the
        turns between were never there (no loss to conceal: they are not played)."""
        for q in [q for q in self._packets if q < ext]:
            del self._packets[q]
            self.stats.discarded += 1
        if self._expected is not None and self._expected < ext:
            self._expected = ext
            self._next_ts = None  # the time jumped over is not a gap to fill
            self._owed = 0

    def _restart(self) -> None:
        self._packets.clear()
        self._highest = self._expected = self._next_ts = None
        self._last_arrival = None

    # -- out --------------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._expected is not None

    def pull(self, samples: int) -> np.ndarray | None:
        """The next `samples` of the stream (float32, a new array); None until the first
        packets have filled the starting depth. Once started, never None: what the network
        did not deliver in time is concealed."""
        if self._expected is None:
            if not self._packets or self.stats.depth_ms < START_MS:
                return None
            self._expected = min(self._packets)
        while self._filled < samples:
            self._turn()
        out = self._pcm[:samples].copy()
        rest = self._filled - samples
        self._pcm[:rest] = self._pcm[samples:self._filled]
        self._filled = rest
        self._update_depth()
        self.stats.pulls += 1
        self.stats.depth_total_ms += self.stats.depth_ms
        self._maybe_shrink(1000.0 * samples / self.rate)
        return out

    def _turn(self) -> None:
        """One packet's turn: decoded, or concealed."""
        s = self.stats
        room = self._pcm[self._filled:]
        packet = self._packets.pop(self._expected, None)
        if packet is not None:
            timestamp, payload = packet
            gap = 0 if self._next_ts is None else (timestamp - self._next_ts) % TS_MOD
            gap = gap * self.rate // self.clock_rate
            gap -= gap % (self.rate // 400)  # what concealment takes: whole 2.5 ms steps
            if 0 < gap <= MAX_GAP_MS * self.rate / 1000.0:
                # the sender skipped time (discontinuous transmission): its silence, concealed
                self._packets[self._expected] = packet  # played on the next turn
                self._next_ts = timestamp
                self._conceal(min(gap, self.decoder.max_samples), None)
                return
            try:
                n = self.decoder.decode(payload, room)
            except libopus.OpusCodecError:
                n = self._conceal(self._packet_samples, None, count=False)
                s.lost += 1
            else:
                self._packet_samples = n
                self._filled += n
                s.played += 1
            self._next_ts = (timestamp + self._ticks(self._packet_samples)) % TS_MOD
            self._expected += 1
            self._owed = 0
            return
        if self._highest is not None and self._highest > self._expected:
            if self._owed:  # its time was concealed already, by an underrun
                self._owed -= 1
                s.lost += 1
                self._expected += 1
                if self._next_ts is not None:
                    self._next_ts = (self._next_ts + self._ticks(self._packet_samples)) % TS_MOD
                return
            following = self._packets.get(self._expected + 1)
            fec = following[1] if following and _may_carry_fec(following[1]) else None
            self._conceal(self._packet_samples, fec)
            s.lost += 1
            s.fec += fec is not None
            if self._next_ts is not None:
                self._next_ts = (self._next_ts + self._ticks(self._packet_samples)) % TS_MOD
            self._expected += 1
            return
        s.underruns += 1
        self._owed += 1
        self._conceal(self._packet_samples, None)

    def _ticks(self, samples: int) -> int:
        """Samples at the decoder's rate -> RTP timestamp ticks."""
        return samples * self.clock_rate // self.rate

    def _conceal(self, samples: int, next_packet: bytes | None, count: bool = True) -> int:
        room = self._pcm[self._filled:]
        try:
            n = self.decoder.conceal(samples, room, next_packet)
        except libopus.OpusCodecError:  # no packet decoded yet, or a frame size it refuses
            room[:samples] = 0.0
            n = samples
        self._filled += n
        if count:
            self.stats.concealed += 1
            self.stats.concealed_ms += 1000.0 * n / self.rate
        return n

    def _maybe_shrink(self, ms: float) -> None:
        s = self.stats
        packet_ms = self._packet_ms
        while s.depth_ms > s.target_ms + SNAP_MS and self._expected in self._packets:
            self._discard()
        self._window_min_ms = min(self._window_min_ms, s.depth_ms)
        self._window_ms += ms
        if self._window_ms < SHRINK_WINDOW_MS:
            return
        excess = self._window_min_ms - s.target_ms
        self._window_ms, self._window_min_ms = 0.0, float("inf")
        if excess > packet_ms and self._expected in self._packets:
            self._discard()

    def _discard(self) -> None:
        del self._packets[self._expected]
        self._expected += 1
        self._next_ts = None  # the discarded packet's time is not a gap to fill
        self.stats.discarded += 1
        self._update_depth()
