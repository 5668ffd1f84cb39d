"""Ogg/Opus bytes <-> 1920-sample frames at 24 kHz, with sphn (Kyutai's Rust bindings of libopus
and an Ogg reader/writer, the library moshi's server and client use).

sphn 0.2's stream API (moshi pins >=0.2,<0.3) is used: `OpusStreamReader.append_bytes` returns
the PCM the bytes completed, `OpusStreamWriter.append_pcm` returns the Ogg pages written (the
first call's include the two header pages). sphn below 0.2 (PersonaPlex's pin) has another API
and is refused with a message when the server starts.
"""

from __future__ import annotations

import numpy as np

from personaplex_edge.errors import PersonaPlexError


class OpusError(Exception):
    """Bytes that are not an Ogg/Opus stream (or not its continuation)."""


def _sphn():
    try:
        import sphn
    except ImportError:
        raise PersonaPlexError("serve needs the serve extra (sphn is missing): pip install "
                               "'personaplex-edge[serve]'") from None
    if not hasattr(sphn, "OpusStreamReader") or hasattr(sphn.OpusStreamReader, "read_pcm"):
        from importlib.metadata import version

        raise PersonaPlexError(f"sphn {version('sphn')} is installed; serve needs sphn 0.2 "
                               "(pip install 'sphn>=0.2,<0.3')")
    return sphn


def check_sphn() -> None:
    """Fails now, with the fix, where sphn is missing or has the other API."""
    _sphn()


# A Rust panic inside sphn surfaces as pyo3's PanicException, which is not an Exception.
_DECODE_ERRORS: tuple[type[BaseException], ...] = (Exception,)
try:  # pragma: no cover - depends on how pyo3 exposes it
    from pyo3_runtime import PanicException  # type: ignore

    _DECODE_ERRORS = (Exception, PanicException)
except ImportError:
    pass


def ogg_pages(data: bytes) -> list[bytes]:
    """`data` cut at its Ogg page boundaries (RFC 3533: a 27-byte header, a segment table of
    `segments` lengths, the body). Whatever does not parse as a whole page - a page's start
    or end split across messages, or bytes that are not Ogg at all - is one last piece, for
    the reader to continue or refuse."""
    pages, pos, view = [], 0, memoryview(data)
    while pos + 27 <= len(data) and data[pos:pos + 4] == b"OggS":
        segments = data[pos + 26]
        body_at = pos + 27 + segments
        if body_at > len(data):
            break
        end = body_at + sum(view[pos + 27:body_at])
        if end > len(data):
            break
        pages.append(data[pos:end])
        pos = end
    if pos < len(data):
        pages.append(data[pos:])
    return pages


class OpusDecoder:
    """A client's Ogg/Opus stream -> complete frames of `frame_size` samples (float32)."""

    def __init__(self, sample_rate: int = 24000, frame_size: int = 1920):
        self._reader = _sphn().OpusStreamReader(sample_rate)
        self.frame_size = frame_size
        self._pending = np.zeros(0, np.float32)  # decoded samples short of a whole frame

    def feed(self, data: bytes) -> list[np.ndarray]:
        """One message's bytes -> the whole frames they complete. Fed to sphn page by page:
        one call of its reader decodes at most 5 s (120000 samples), which one message of
        many pages can hold."""
        parts = []
        for chunk in ogg_pages(data):
            try:
                parts.append(np.asarray(self._reader.append_bytes(chunk), np.float32).reshape(-1))
            except _DECODE_ERRORS as e:
                raise OpusError(f"not an Ogg/Opus stream ({e})") from None
        pcm = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else \
            np.zeros(0, np.float32)
        if not np.isfinite(pcm).all():
            raise OpusError("the Opus stream decoded to non-finite samples")
        if self._pending.size:
            pcm = np.concatenate([self._pending, pcm])
        n = pcm.shape[0] // self.frame_size
        frames = [pcm[i * self.frame_size:(i + 1) * self.frame_size].copy() for i in range(n)]
        self._pending = pcm[n * self.frame_size:].copy()
        return frames


class OpusEncoder:
    """Answer frames -> Ogg/Opus pages (bytes; the first call's start with the headers)."""

    def __init__(self, sample_rate: int = 24000):
        self._writer = _sphn().OpusStreamWriter(sample_rate)

    def encode(self, pcm: np.ndarray) -> bytes:
        return self._writer.append_pcm(np.asarray(pcm, np.float32).reshape(-1))
