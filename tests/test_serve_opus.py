"""The server's Ogg/Opus (the system's libopus + the project's Ogg pages) against peers nobody
here wrote: sphn (moshi's codec: what its client and server hear), libsndfile (soundfile's
Ogg/Opus reader and writer: pre-skip and granule positions honoured as RFC 7845 says) and
libogg (pages whose packets continue across pages)."""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path

import ci_parts
import numpy as np
import pytest
import soundfile as sf
from bench_serve import FRAME, RATE, speech

from personaplex_edge.runtime.serve import libopus
from personaplex_edge.runtime.serve.ogg import (CONTINUED, FIRST, HEADER, OpusHead, PageWriter,
                                                crc, ogg_pages, opus_tags)
from personaplex_edge.runtime.serve.opus import OpusDecoder, OpusEncoder, OpusError

if libopus.load() is None:
    pytest.skip(f"libopus is not installed: {libopus.INSTALL_HINT}", allow_module_level=True)


@pytest.fixture(scope="module")
def pcm():
    return speech(4.0)  # 50 frames of the bundled speech


def encode(pcm: np.ndarray) -> list[bytes]:
    """pcm through our encoder frame by frame, as the server sends its answers."""
    enc = OpusEncoder(RATE)
    return [enc.encode(pcm[i:i + FRAME]) for i in range(0, pcm.shape[0], FRAME)]


def decode(messages) -> np.ndarray:
    dec = OpusDecoder(RATE, FRAME)
    frames = [f for m in messages for f in dec.feed(m)]
    return np.concatenate(frames) if frames else np.zeros(0, np.float32)


def lag_of(x: np.ndarray, ref: np.ndarray, span: int = 400) -> int:
    """The delay of `x` against `ref` that best explains it (normalised correlation)."""
    n = min(x.shape[0], ref.shape[0]) - 2 * span
    scores = {lag: float(np.dot(x[span + lag:span + lag + n], ref[span:span + n]) /
                         np.linalg.norm(x[span + lag:span + lag + n]))
              for lag in range(-span, span + 1)}
    return max(scores, key=scores.get)


def test_we_decode_what_sphn_encodes_sample_for_sample(pcm):
    """moshi's client's stream -> the very samples moshi's server (sphn's reader) decodes."""
    sphn = pytest.importorskip("sphn")
    writer, reader = sphn.OpusStreamWriter(RATE), sphn.OpusStreamReader(RATE)
    messages = [writer.append_pcm(pcm[i:i + FRAME]) for i in range(0, pcm.shape[0], FRAME)]
    theirs = np.concatenate([np.asarray(reader.append_bytes(m), np.float32) for m in messages])
    ours = decode(messages)
    assert ours.shape == theirs.shape == pcm.shape
    np.testing.assert_array_equal(ours, theirs)


def test_sphn_decodes_what_we_encode(pcm):
    """Our answer stream through moshi's client's reader: every sample, the same as ours."""
    sphn = pytest.importorskip("sphn")
    messages = encode(pcm)
    reader = sphn.OpusStreamReader(RATE)
    theirs = np.concatenate([np.asarray(reader.append_bytes(m), np.float32) for m in messages])
    np.testing.assert_array_equal(theirs, decode(messages))
    assert theirs.shape == pcm.shape
    # the speech itself, delayed by the encoder's lookahead (kept, as sphn keeps it)
    assert abs(lag_of(theirs, pcm) - OpusEncoder(RATE)._codec.lookahead) <= 2


def test_libsndfile_plays_our_stream_with_its_pre_skip_and_length(pcm, tmp_path):
    """A player that honours RFC 7845 (libsndfile) drops exactly the pre-skip the OpusHead
    states and stops where the granule positions say: what comes out lines up with the
    input at lag 0, one lookahead shorter."""
    path = tmp_path / "answer.opus"
    path.write_bytes(b"".join(encode(pcm)))
    played, rate = sf.read(str(path), dtype="float32")
    lookahead = OpusEncoder(RATE)._codec.lookahead
    assert rate == RATE and played.shape == (pcm.shape[0] - lookahead,)
    assert abs(lag_of(played, pcm)) <= 2  # the lossy codec blurs the peak by a sample


def test_we_read_what_libsndfile_writes(pcm, tmp_path):
    """libsndfile's Ogg/Opus (many packets per page, its own pre-skip): our frames are its own
    decode, shifted by the pre-skip we keep."""
    path = tmp_path / "question.opus"
    sf.write(str(path), pcm, RATE, format="OGG", subtype="OPUS")
    data = path.read_bytes()
    assert max(p[26] for p in ogg_pages(data)) > 2  # pages of many packets
    dec = OpusDecoder(RATE, FRAME)
    ours = np.concatenate([f for at in range(0, len(data), 777) for f in dec.feed(data[at:at + 777])])
    theirs, _ = sf.read(str(path), dtype="float32")
    skip = dec.head.pre_skip * RATE // 48000
    n = min(ours.shape[0] - skip, theirs.shape[0])
    assert n > pcm.shape[0] - 2 * FRAME
    # two builds of libopus (the system's, libsndfile's own) decode alike to rounding, whose last
    # bits depend on the build and the CPU's kernels; a frame out of place or a sample of lag
    # differs by orders more than this bound
    np.testing.assert_allclose(ours[skip:skip + n], theirs[:n], atol=1e-4)


def test_pages_in_any_chunking_give_the_same_frames(pcm):
    messages = encode(pcm[:12 * FRAME])
    whole = decode(messages)
    data = b"".join(messages)
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, len(data)), 60, replace=False))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    np.testing.assert_array_equal(decode(pieces), whole)
    np.testing.assert_array_equal(decode([data[i:i + 1] for i in range(len(data))]), whole)


class _Libogg:
    """libogg's page writer through ctypes: packets in, pages out. It cuts a page at 255
    segments even inside a packet, which then continues on the next page."""

    class Page(ctypes.Structure):
        _fields_ = [("header", ctypes.c_void_p), ("header_len", ctypes.c_long),
                    ("body", ctypes.c_void_p), ("body_len", ctypes.c_long)]

    class Packet(ctypes.Structure):
        _fields_ = [("packet", ctypes.c_char_p), ("bytes", ctypes.c_long),
                    ("b_o_s", ctypes.c_long), ("e_o_s", ctypes.c_long),
                    ("granulepos", ctypes.c_int64), ("packetno", ctypes.c_int64)]

    def __init__(self):
        path = ctypes.util.find_library("ogg")
        if path is None:
            pytest.skip("libogg is not installed (apt-get install libogg0)")
        self.lib = ctypes.CDLL(path)
        self.state = ctypes.create_string_buffer(4096)  # ogg_stream_state is ~400 bytes
        self.lib.ogg_stream_init(self.state, 7)

    def pages(self, packets: list[bytes], samples_48k: int) -> bytes:
        out, granule = b"", 0
        for n, data in enumerate(packets):
            granule += samples_48k if n >= 2 else 0
            op = self.Packet(data, len(data), int(n == 0), 0, granule, n)
            assert self.lib.ogg_stream_packetin(self.state, ctypes.byref(op)) == 0
            if n < 2:  # the headers on pages of their own, as RFC 7845 asks
                out += self._drain()
        return out + self._drain()

    def _drain(self) -> bytes:
        og, out = self.Page(), b""
        while self.lib.ogg_stream_flush_fill(self.state, ctypes.byref(og), 1 << 20):
            out += (ctypes.string_at(og.header, og.header_len) +
                    ctypes.string_at(og.body, og.body_len))
        return out


def test_packets_laced_across_pages_by_libogg(pcm):
    """Packets of two segments each (64 kbit/s), paged by libogg into pages of 255 segments:
    a packet straddles a page boundary. Joined, they decode to what the same packets one
    per page (our writer's paging) decode to; and libogg's CRC is ours."""
    enc = libopus.Encoder(RATE)
    assert enc._lib.opus_encoder_ctl(enc._state, 4002, ctypes.c_int32(64000)) == 0  # bitrate
    audio = np.tile(pcm, 5)  # 500 packets, ~900 segments
    packets = [enc.encode(audio[i:i + 960]) for i in range(0, audio.shape[0], 960)]
    assert sum(len(p) > 255 for p in packets) > len(packets) // 2
    head = OpusHead(1, enc.lookahead * 2, RATE)
    ours = PageWriter(head)
    one_per_page = ours.headers() + b"".join(ours.packet(p, 1920) for p in packets)
    data = _Libogg().pages([head.to_bytes(), opus_tags("libogg"), *packets], 1920)
    pages = ogg_pages(data)
    assert any(p[5] & CONTINUED for p in pages)
    assert all(crc(p[:22] + bytes(4) + p[26:]) == int.from_bytes(p[22:26], "little")
               for p in pages)
    np.testing.assert_array_equal(decode([data]), decode([one_per_page]))


def _page_fields(messages: list[bytes]) -> list[list[tuple[int, int, int, int]]]:
    """Per message, per page: (flags, granule position, sequence number, segments)."""
    return [[(p[5], int.from_bytes(p[6:14], "little"), int.from_bytes(p[18:22], "little"),
              p[26]) for p in ogg_pages(m)] for m in messages]


def test_our_stream_as_sphn_pages_it(pcm):
    """Frame by frame, our answer stream is paged as sphn's writer (moshi's) pages the same
    frames: the same pages in each message, each with the same flags, granule position (48 kHz
    samples), sequence number and segment count; the OpusHead first, with the encoder's own
    pre-skip, then OpusTags."""
    sphn = pytest.importorskip("sphn")
    frames = [pcm[i:i + FRAME] for i in range(0, 6 * FRAME, FRAME)]
    writer = sphn.OpusStreamWriter(RATE)
    theirs = [writer.append_pcm(f) for f in frames]
    enc = OpusEncoder(RATE)
    ours = [enc.encode(f) for f in frames]
    assert _page_fields(ours) == _page_fields(theirs)
    assert len({g for m in _page_fields(ours) for _, g, _, _ in m}) > 5  # granules that move
    first = ogg_pages(ours[0])
    head = OpusHead.parse(first[0][HEADER.size + 1:])
    assert first[0][5] == FIRST and head.input_rate == RATE and head.channels == 1
    assert head.pre_skip == enc._codec.lookahead * 48000 // RATE
    assert first[1][HEADER.size + 1:].startswith(b"OpusTags")


@pytest.mark.parametrize("corrupt, reason", [
    (lambda d: d[:30] + bytes([d[30] ^ 1]) + d[31:], "CRC does not match"),
    (lambda d: d[:4] + b"\x01" + d[5:], "version 1"),
    (lambda d: ogg_pages(d)[1] + b"".join(ogg_pages(d)[2:]), "does not start with an OpusHead"),
])
def test_a_damaged_stream_is_refused_with_its_reason(pcm, corrupt, reason):
    data = encode(pcm[:2 * FRAME])[0]
    with pytest.raises(OpusError, match=f"not an Ogg/Opus stream .*{reason}"):
        OpusDecoder().feed(corrupt(data))


def test_homebrews_libopus_is_found_on_macos(tmp_path, monkeypatch):
    """`brew install opus` puts libopus.0.dylib in /opt/homebrew/lib on Apple silicon, which
    neither find_library nor a bare dlopen searches: the loader looks in Homebrew's prefix. A
    stand-in: the system's libopus under the dylib's name in $HOMEBREW_PREFIX/lib, on a
    platform said to be macOS where find_library finds nothing."""
    from personaplex_edge.runtime import system_lib

    maps = open("/proc/self/maps").read() if libopus.load() else ""
    real = next((line.split()[-1] for line in maps.splitlines() if "libopus" in line), None)
    if real is None:
        pytest.skip(ci_parts.not_installable("the loaded libopus's file is not in /proc/self/maps"))
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libopus.0.dylib").symlink_to(real)
    monkeypatch.setenv("HOMEBREW_PREFIX", str(tmp_path))
    monkeypatch.setattr(system_lib.sys, "platform", "darwin")
    monkeypatch.setattr(system_lib.ctypes.util, "find_library", lambda name: None)
    found = system_lib.SystemLibrary(("opus", "libopus.0.dylib"), lambda lib: None).load()
    assert found is not None and found._name == str(tmp_path / "lib" / "libopus.0.dylib")
    assert system_lib.package_lib_dirs()[:2] == [tmp_path / "lib", Path("/opt/homebrew/lib")]
