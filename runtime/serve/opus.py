"""Ogg/Opus bytes <-> 1920-sample frames at 24 kHz: the system's libopus (libopus.py) inside
the project's own Ogg pages (ogg.py).

What the stream looks like on the wire is what moshi's server and client make of it (sphn
0.2, whose reader and writer moshi uses), so their clients and the reference servers hear the
same samples:
- in: every packet after the headers is decoded at 24 kHz, the OpusHead's pre-skip kept (the
  reference servers keep it too: trimming it would shift every frame the model hears against
  what they hear);
- out: 40 ms packets (960 samples at 24 kHz, libopus's VoIP mode), one per Ogg page, so a
  1920-sample answer frame is two pages; the OpusHead carries the encoder's true pre-skip for
  players that honour it (a browser's WebCodecs decoder does).
"""

from __future__ import annotations

import numpy as np

from . import libopus
from .ogg import GRANULE_RATE, OggError, OpusHead, PacketReader, PageWriter, is_header

PACKETS_PER_SECOND = 25  # 40 ms packets, as moshi's stream writer makes them


class OpusError(Exception):
    """Bytes that are not an Ogg/Opus stream (or not its continuation)."""


def check_opus() -> None:
    """Fails now, with what to install, where libopus is missing."""
    libopus.require()


class OpusDecoder:
    """A client's Ogg/Opus stream -> complete frames of `frame_size` samples (float32)."""

    def __init__(self, sample_rate: int = 24000, frame_size: int = 1920):
        self._reader = PacketReader()
        self._codec = libopus.Decoder(sample_rate)
        self.frame_size = frame_size
        self.head: OpusHead | None = None
        # decoded samples short of a whole frame, then room for the longest packet
        self._pcm = np.zeros(frame_size + self._codec.max_samples, np.float32)
        self._filled = 0

    def feed(self, data: bytes) -> list[np.ndarray]:
        """One message's bytes (pages in any chunking) -> the whole frames they complete."""
        frames = []
        try:
            for packet in self._reader.feed(data):
                if self.head is None:
                    self.head = OpusHead.parse(packet)
                    continue
                if is_header(packet):  # OpusTags, or the headers of a chained stream
                    continue
                self._filled += self._codec.decode(packet, self._pcm[self._filled:])
                while self._filled >= self.frame_size:
                    frame = self._pcm[:self.frame_size].copy()
                    if not np.isfinite(frame).all():
                        raise OpusError("the Opus stream decoded to non-finite samples")
                    frames.append(frame)
                    rest = self._filled - self.frame_size
                    self._pcm[:rest] = self._pcm[self.frame_size:self._filled]
                    self._filled = rest
        except (OggError, libopus.OpusCodecError) as e:  # the framing's or the codec's word
            raise OpusError(f"not an Ogg/Opus stream ({e})") from None
        return frames


class OpusEncoder:
    """Answer frames -> Ogg/Opus pages (bytes; the first call's start with the two header
    pages)."""

    def __init__(self, sample_rate: int = 24000):
        self._codec = libopus.Encoder(sample_rate)
        scale = GRANULE_RATE // sample_rate
        self._pages = PageWriter(OpusHead(channels=1, pre_skip=self._codec.lookahead * scale,
                                          input_rate=sample_rate))
        self._packet = np.zeros(sample_rate // PACKETS_PER_SECOND, np.float32)
        self._packet_48k = self._packet.shape[0] * scale
        self._filled = 0
        self._started = False

    def encode(self, pcm: np.ndarray) -> bytes:
        out = [] if self._started else [self._pages.headers()]
        self._started = True
        pcm = np.asarray(pcm, np.float32).reshape(-1)
        at, size = 0, self._packet.shape[0]
        while at < pcm.shape[0]:
            take = min(size - self._filled, pcm.shape[0] - at)
            self._packet[self._filled:self._filled + take] = pcm[at:at + take]
            self._filled += take
            at += take
            if self._filled == size:
                out.append(self._pages.packet(self._codec.encode(self._packet), self._packet_48k))
                self._filled = 0
        return b"".join(out)
