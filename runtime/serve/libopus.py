"""libopus through ctypes: the codec the OS ships (Debian/Ubuntu/JetPack `libopus0`, Homebrew's
`opus` on macOS), so serving needs no Rust toolchain and no wheel per architecture.

Only the plain packet API is used: one decoder or encoder per stream, float samples. The
Ogg framing around the packets is ogg.py's.
"""

from __future__ import annotations

import ctypes

import numpy as np

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.runtime.system_lib import SystemLibrary

INSTALL_HINT = "apt-get install libopus0 (Debian, Ubuntu, Jetson), brew install opus (macOS)"

# opus_defines.h
APPLICATION_VOIP = 2048  # what moshi's clients and servers encode with
SET_BITRATE = 4002
SET_INBAND_FEC = 4012
SET_PACKET_LOSS_PERC = 4014
_GET_LOOKAHEAD = 4027
MAX_PACKET_MS = 120  # the longest packet Opus has (6 frames of 20 ms, or 2 of 60 ms)
MAX_PACKET_BYTES = 4000  # libopus's own recommendation for an encoder's output buffer


def _declare(lib: ctypes.CDLL) -> None:
    p, i, i32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int32
    lib.opus_strerror.restype = ctypes.c_char_p
    lib.opus_strerror.argtypes = [i]
    lib.opus_decoder_create.restype = p
    lib.opus_decoder_create.argtypes = [i32, i, ctypes.POINTER(i)]
    lib.opus_decoder_destroy.argtypes = [p]
    lib.opus_decode_float.restype = i
    lib.opus_decode_float.argtypes = [p, ctypes.c_char_p, i32, p, i, i]
    lib.opus_encoder_create.restype = p
    lib.opus_encoder_create.argtypes = [i32, i, i, ctypes.POINTER(i)]
    lib.opus_encoder_destroy.argtypes = [p]
    lib.opus_encode_float.restype = i32
    lib.opus_encode_float.argtypes = [p, p, i, p, i32]
    # variadic: only the fixed arguments are declared, so ctypes passes the rest as varargs
    # (the calling convention differs on macOS arm64)
    lib.opus_encoder_ctl.restype = i
    lib.opus_encoder_ctl.argtypes = [p, i]


_LIBRARY = SystemLibrary(("opus", "libopus.so.0", "libopus.0.dylib"), _declare)


class OpusCodecError(ValueError):
    """libopus refused a packet or a frame (its own message)."""


def load() -> ctypes.CDLL | None:
    """The library, or None when it is not installed (`missing_reason()` says why)."""
    return _LIBRARY.load()


def missing_reason() -> str:
    return _LIBRARY.missing_reason()


def require() -> ctypes.CDLL:
    """The library, or the error that says what to install."""
    lib = load()
    if lib is None:
        raise PersonaPlexError(f"serve needs libopus ({missing_reason()}): {INSTALL_HINT}")
    return lib


def _check(lib: ctypes.CDLL, code: int, what: str) -> int:
    if code < 0:
        raise OpusCodecError(f"{what}: {lib.opus_strerror(code).decode()}")
    return code


class Decoder:
    """Opus packets -> float samples at `rate` (8, 12, 16, 24 or 48 kHz): the packet API's
    decoder, which resamples internally from whatever bandwidth the packet was coded at."""

    def __init__(self, rate: int, channels: int = 1):
        self._lib = require()
        error = ctypes.c_int()
        self._state = self._lib.opus_decoder_create(rate, channels, ctypes.byref(error))
        _check(self._lib, error.value, "opus_decoder_create")
        self.rate, self.channels = rate, channels
        self.max_samples = rate * MAX_PACKET_MS // 1000  # per channel, in one packet

    def decode(self, packet: bytes, out: np.ndarray) -> int:
        """Decodes one packet into the start of `out` (float32, C-contiguous, room for
        `max_samples` per channel) and returns the samples written per channel."""
        room = out.shape[0] // self.channels
        return _check(self._lib, self._lib.opus_decode_float(
            self._state, packet, len(packet), out.ctypes.data, room, 0), "opus_decode_float")

    def conceal(self, samples: int, out: np.ndarray, next_packet: bytes | None = None) -> int:
        """`samples` per channel (a multiple of 2.5 ms) standing in for a packet that never
        came: its forward error correction copy carried in `next_packet` where that has one,
        else the codec's own loss concealment (which also takes over when `next_packet` has no
        FEC data)."""
        data, size, fec = (next_packet, len(next_packet), 1) if next_packet else (None, 0, 0)
        return _check(self._lib, self._lib.opus_decode_float(
            self._state, data, size, out.ctypes.data, samples, fec), "opus_decode_float")

    def __del__(self):
        state, self._state = getattr(self, "_state", None), None
        if state:
            self._lib.opus_decoder_destroy(state)


class Encoder:
    """float samples at `rate` -> Opus packets, one per call of a whole Opus frame size
    (2.5, 5, 10, 20, 40 or 60 ms)."""

    def __init__(self, rate: int, channels: int = 1, application: int = APPLICATION_VOIP):
        self._lib = require()
        error = ctypes.c_int()
        self._state = self._lib.opus_encoder_create(rate, channels, application,
                                                    ctypes.byref(error))
        _check(self._lib, error.value, "opus_encoder_create")
        self.rate, self.channels = rate, channels
        self._out = ctypes.create_string_buffer(MAX_PACKET_BYTES)
        value = ctypes.c_int32()
        _check(self._lib, self._lib.opus_encoder_ctl(self._state, _GET_LOOKAHEAD,
                                                     ctypes.byref(value)), "OPUS_GET_LOOKAHEAD")
        # samples at `rate` the decoder's output lags the input by: what OpusHead's pre-skip
        # tells a player to drop
        self.lookahead = value.value

    def set(self, request: int, value: int) -> None:
        """An encoder setting (SET_BITRATE, SET_INBAND_FEC, ...)."""
        _check(self._lib, self._lib.opus_encoder_ctl(self._state, request, ctypes.c_int32(value)),
               f"opus_encoder_ctl({request})")

    def encode(self, pcm: np.ndarray) -> bytes:
        """One Opus frame of float32 samples (C-contiguous, [samples * channels]) -> a packet."""
        n = _check(self._lib, self._lib.opus_encode_float(
            self._state, pcm.ctypes.data, pcm.shape[0] // self.channels, self._out,
            MAX_PACKET_BYTES), "opus_encode_float")
        return ctypes.string_at(self._out, n)

    def __del__(self):
        state, self._state = getattr(self, "_state", None), None
        if state:
            self._lib.opus_encoder_destroy(state)
