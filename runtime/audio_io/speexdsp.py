"""speexdsp's echo canceller and preprocessor through ctypes: the library, not a copy of it.

The echo canceller (`speex_echo_*`) is a multidelay block frequency-domain adaptive filter with
a double-talk-robust learning rate: the linear part, what subtracts the played signal as it
comes back through the room. The preprocessor (`speex_preprocess_*`), given the canceller's
state, estimates the echo the filter left and suppresses it per frequency band together with
stationary noise. Both take 16-bit samples in fixed frames.

The library is Debian's and Ubuntu's `libspeexdsp1` (amd64 and arm64, so Jetson's Ubuntu too),
Homebrew's `speexdsp` on macOS. No Python package is needed; `find_library` returns None when
it is not installed.
"""

from __future__ import annotations

import ctypes

import numpy as np

from personaplex_edge.runtime.system_lib import SystemLibrary

# request numbers of speex_echo_ctl / speex_preprocess_ctl (speex/speex_echo.h, speex_preprocess.h)
_ECHO_SET_SAMPLING_RATE = 24
_PP_SET_DENOISE = 0
_PP_SET_NOISE_SUPPRESS = 18
_PP_SET_ECHO_SUPPRESS = 20
_PP_SET_ECHO_SUPPRESS_ACTIVE = 22
_PP_SET_ECHO_STATE = 24


def _declare(lib: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.speex_echo_state_init.restype = p
    lib.speex_echo_state_init.argtypes = [i, i]
    lib.speex_echo_state_destroy.argtypes = [p]
    lib.speex_echo_state_reset.argtypes = [p]
    lib.speex_echo_cancellation.argtypes = [p, p, p, p]
    lib.speex_echo_ctl.argtypes = [p, i, p]
    lib.speex_preprocess_state_init.restype = p
    lib.speex_preprocess_state_init.argtypes = [i, i]
    lib.speex_preprocess_state_destroy.argtypes = [p]
    lib.speex_preprocess_ctl.argtypes = [p, i, p]
    lib.speex_preprocess_run.argtypes = [p, p]


_LIBRARY = SystemLibrary(("speexdsp", "libspeexdsp.so.1", "libspeexdsp.1.dylib"), _declare)


def load() -> ctypes.CDLL | None:
    """The library with its signatures declared, or None when it is not installed
    (`missing_reason()` says what was tried)."""
    return _LIBRARY.load()


def missing_reason() -> str:
    return _LIBRARY.missing_reason()


def _set_int(ctl, state, request: int, value: int) -> None:
    v = ctypes.c_int(int(value))
    ctl(state, request, ctypes.byref(v))


class SpeexEcho:
    """One speex echo canceller (+ optionally its residual-echo/noise preprocessor) on 16-bit
    frames of `frame` samples. `run(mic, ref, out)` processes one frame in place into `out`;
    every array int16 [frame], contiguous."""

    def __init__(self, lib: ctypes.CDLL, rate: int, frame: int, tail: int,
                 suppress: bool = True, echo_suppress_db: int = -40,
                 echo_suppress_active_db: int = -15, noise_suppress_db: int = -15):
        self._lib = lib
        self.frame = frame
        self._echo = lib.speex_echo_state_init(frame, tail)
        if not self._echo:
            raise MemoryError("speex_echo_state_init failed")
        _set_int(lib.speex_echo_ctl, self._echo, _ECHO_SET_SAMPLING_RATE, rate)
        self._pp = None
        if suppress:
            self._pp = lib.speex_preprocess_state_init(frame, rate)
            ctl = lib.speex_preprocess_ctl
            ctl(self._pp, _PP_SET_ECHO_STATE, ctypes.c_void_p(self._echo))
            # the residual-echo suppressor lives inside the denoiser's gain rule: it only acts
            # with denoising on (noise_suppress_db bounds what that takes from steady noise)
            _set_int(ctl, self._pp, _PP_SET_DENOISE, 1)
            _set_int(ctl, self._pp, _PP_SET_NOISE_SUPPRESS, noise_suppress_db)
            _set_int(ctl, self._pp, _PP_SET_ECHO_SUPPRESS, echo_suppress_db)
            _set_int(ctl, self._pp, _PP_SET_ECHO_SUPPRESS_ACTIVE, echo_suppress_active_db)
            # AGC, VAD and dereverberation are off by default (setting the VAD prints a
            # warning): the model wants the user's level as it is

    @property
    def latency(self) -> int:
        """Samples by which `out` lags `mic`: the preprocessor's overlap-add holds one frame."""
        return self.frame if self._pp else 0

    def run(self, mic: np.ndarray, ref: np.ndarray, out: np.ndarray) -> None:
        self._lib.speex_echo_cancellation(self._echo, mic.ctypes.data, ref.ctypes.data,
                                          out.ctypes.data)
        if self._pp:
            self._lib.speex_preprocess_run(self._pp, out.ctypes.data)

    def reset(self) -> None:
        """Forgets the learnt echo path (after the reference moved in time)."""
        self._lib.speex_echo_state_reset(self._echo)

    def close(self) -> None:
        if self._pp:
            self._lib.speex_preprocess_state_destroy(self._pp)
            self._pp = None
        if self._echo:
            self._lib.speex_echo_state_destroy(self._echo)
            self._echo = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
