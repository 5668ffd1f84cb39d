"""Ogg pages (RFC 3533) carrying one Opus stream (RFC 7845), both ways; the page's own
static/ogg.js is the same format in the browser.

A page: "OggS", version 0, flags (continued / first / last), the granule position, the stream's
serial number, the page's sequence number, its CRC, a table of segment lengths ("lacing": a
packet is segments of 255 bytes ending in one shorter), then the bodies. A packet may continue
on the next page. The Opus stream starts with two header packets, each on a page of its own:
OpusHead (channels, pre-skip, the input's rate) and OpusTags (a vendor string); every granule
position counts 48 kHz samples, whatever rate the stream was coded at.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

CAPTURE = b"OggS"
CONTINUED, FIRST, LAST = 0x01, 0x02, 0x04  # header-type flags
HEADER = struct.Struct("<4sBBqIIIB")  # capture, version, flags, granule, serial, sequence, crc, n
GRANULE_RATE = 48000
MAX_SEGMENTS = 255
# The longest packet a reader joins across pages: an Opus packet carries at most 120 ms of
# 1275-byte frames besides padding (61,298 bytes a channel, RFC 7845 sec. 6), so this holds any
# audio packet of a mono or stereo stream and a header with a long vendor string.
MAX_PACKET_BYTES = 1 << 17

# Ogg's CRC-32 is the unreflected one (polynomial 0x04c11db7, initial value 0, no final xor);
# zlib's is its reflection, so zlib computes it on bit-reversed bytes, and the result is read
# back reversed: the loop runs in C.
_REVERSED = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


class OggError(ValueError):
    """Bytes that are not Ogg pages."""


def crc(data: bytes) -> int:
    reflected = zlib.crc32(data.translate(_REVERSED), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int.from_bytes(reflected.to_bytes(4, "little").translate(_REVERSED), "big")


def page(packets: list[bytes], granule: int, serial: int, sequence: int, flags: int = 0) -> bytes:
    """One page holding whole packets (with its CRC)."""
    lacing = bytearray()
    for p in packets:
        lacing += b"\xff" * (len(p) // 255) + bytes([len(p) % 255])
    if len(lacing) > MAX_SEGMENTS:
        raise ValueError(f"{len(lacing)} segments do not fit one Ogg page")
    out = bytearray(HEADER.pack(CAPTURE, 0, flags, granule, serial, sequence, 0, len(lacing)))
    out += lacing
    for p in packets:
        out += p
    out[22:26] = crc(out).to_bytes(4, "little")  # computed with the field still zero
    return bytes(out)


def _page_end(data, at: int) -> int | None:
    """Where the page starting at `at` ends, or None while `data` holds less than all of it."""
    if len(data) - at < HEADER.size:
        return None
    body_at = at + HEADER.size + data[at + 26]
    if body_at > len(data):
        return None
    end = body_at + sum(data[at + HEADER.size:body_at])
    return end if end <= len(data) else None


def page_spans(data) -> tuple[list[tuple[int, int]], int]:
    """(start, end) of each whole page at the start of `data`, one after the other, and where
    the first byte outside them is: a page not whole yet, or bytes that are not Ogg."""
    spans, at = [], 0
    while data[at:at + 4] == CAPTURE:
        end = _page_end(data, at)
        if end is None:
            break
        spans.append((at, end))
        at = end
    return spans, at


def ogg_pages(data: bytes) -> list[bytes]:
    """`data` cut at its page boundaries. Whatever does not parse as a whole page - a page's
    start or end split across messages, or bytes that are not Ogg at all - is one last piece."""
    spans, at = page_spans(data)
    return [data[a:b] for a, b in spans] + ([data[at:]] if at < len(data) else [])


class PacketReader:
    """Ogg bytes in any chunking -> the packets they complete, in order. Each page's capture
    pattern, version and CRC are checked; a packet laced across pages is joined, up to
    MAX_PACKET_BYTES (OggError past it)."""

    def __init__(self):
        self._buffer = bytearray()  # the start of a page not yet whole
        self._partial = bytearray()  # a packet that continues on the next page

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        buf, packets = self._buffer, []
        spans, at = page_spans(buf)
        for a, b in spans:
            packets += self._page(bytes(buf[a:b]))
        if len(buf) - at >= 4 and buf[at:at + 4] != CAPTURE:  # not a page still arriving
            raise OggError("no Ogg capture pattern where a page starts")
        del buf[:at]
        return packets

    def _page(self, data: bytes) -> list[bytes]:
        _, version, flags, _, _, _, stored, n = HEADER.unpack_from(data)
        if version != 0:
            raise OggError(f"Ogg stream structure version {version} (only 0 exists)")
        if crc(data[:22] + b"\0\0\0\0" + data[26:]) != stored:
            raise OggError("an Ogg page whose CRC does not match")
        if not flags & CONTINUED:
            self._partial.clear()  # a packet cut short by a lost page: dropped, as RFC 3533 says
        packets, at = [], HEADER.size + n
        for size in data[HEADER.size:HEADER.size + n]:
            self._partial += data[at:at + size]
            at += size
            if len(self._partial) > MAX_PACKET_BYTES:
                raise OggError(f"a packet continued past {MAX_PACKET_BYTES} bytes (an Opus "
                               "packet holds at most 61,298 bytes a channel besides padding)")
            if size < 255:
                packets.append(bytes(self._partial))
                self._partial.clear()
        return packets


@dataclass(frozen=True)
class OpusHead:
    """RFC 7845's identification header (channel mapping family 0: mono or stereo)."""

    channels: int = 1
    pre_skip: int = 0  # 48 kHz samples a player drops from the decoded start
    input_rate: int = 48000  # the rate the source had: informational only
    output_gain: int = 0  # Q7.8 dB
    MAGIC = b"OpusHead"
    FORMAT = struct.Struct("<8sBBHIhB")

    def to_bytes(self) -> bytes:
        return self.FORMAT.pack(self.MAGIC, 1, self.channels, self.pre_skip, self.input_rate,
                                self.output_gain, 0)

    @classmethod
    def parse(cls, packet: bytes) -> "OpusHead":
        if len(packet) < cls.FORMAT.size or not packet.startswith(cls.MAGIC):
            raise OggError("the stream does not start with an OpusHead packet")
        _, version, channels, pre_skip, rate, gain, _ = cls.FORMAT.unpack_from(packet)
        if version >> 4:  # the major version: 0 is the only one; minor ones stay readable
            raise OggError(f"OpusHead version {version} is not one this reader knows")
        if channels < 1:
            raise OggError("OpusHead with no channels")
        return cls(channels, pre_skip, rate, gain)


def opus_tags(vendor: str) -> bytes:
    """RFC 7845's comment header with a vendor string and no comments."""
    v = vendor.encode()
    return b"OpusTags" + struct.pack("<I", len(v)) + v + struct.pack("<I", 0)


def is_header(packet: bytes) -> bool:
    return packet.startswith((OpusHead.MAGIC, b"OpusTags"))


class PageWriter:
    """One Opus stream's pages: the two header pages, then one page per packet (as moshi's
    stream writer pages them, so each Ogg page a client reads is one packet it can decode)."""

    def __init__(self, head: OpusHead, vendor: str = "personaplex-edge"):
        self.head = head
        self.vendor = vendor
        self.serial = int.from_bytes(os.urandom(4), "little")
        self.sequence = 0
        self.granule = 0  # 48 kHz samples of every packet written so far

    def _page(self, packet: bytes, flags: int = 0) -> bytes:
        out = page([packet], self.granule, self.serial, self.sequence, flags)
        self.sequence += 1
        return out

    def headers(self) -> bytes:
        return self._page(self.head.to_bytes(), FIRST) + self._page(opus_tags(self.vendor))

    def packet(self, packet: bytes, samples_48k: int) -> bytes:
        # a page's granule is the position of the last sample its packets complete
        self.granule += samples_48k
        return self._page(packet)
