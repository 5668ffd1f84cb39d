"""The few CUDA runtime calls the GPU backends need, through cuda-python (no torch): device
buffers, pinned host arrays, one stream, async copies, and what GPU this is.

cuda-python returns `(error, *values)` from every call; `call` turns a failed one into a
`CudaError` that names the call and CUDA's own message. Nothing here is imported unless a GPU
backend is used; without cuda-python, `cudart()` says what to install.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass

import numpy as np

from personaplex_edge.errors import PersonaPlexError

_INSTALL = ("the GPU backends need cuda-python: pip install 'cuda-python>=12.6' (its major "
            "version must not be newer than the driver's CUDA, see nvidia-smi)")


class CudaError(PersonaPlexError):
    """A CUDA call that failed: no device, an old driver, out of memory."""


def cudart():
    """cuda-python's runtime module (cuda.bindings.runtime; older releases: cuda.cudart)."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime
        except ImportError:
            raise CudaError(_INSTALL) from None
    return runtime


def call(name: str, *args):
    """Calls cudart.<name>(*args); returns its values (one value bare, several as a tuple)."""
    rt = cudart()
    result = getattr(rt, name)(*args)
    if not isinstance(result, tuple):
        result = (result,)
    err, values = result[0], result[1:]
    if err != rt.cudaError_t.cudaSuccess:
        _, message = rt.cudaGetErrorString(err)
        message = message.decode() if isinstance(message, bytes) else str(message)
        hint = ""
        if err in (rt.cudaError_t.cudaErrorInsufficientDriver, rt.cudaError_t.cudaErrorNoDevice):
            hint = ("; this machine has no usable NVIDIA GPU for this cuda-python (check "
                    "nvidia-smi, and that cuda-python's major version matches the driver's CUDA)")
        raise CudaError(f"{name} failed: {getattr(err, 'name', err)} ({message}){hint}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    compute_capability: str  # "9.0" for an H200, "8.7" for a Jetson AGX Orin
    total_memory: int  # bytes
    driver_version: int  # e.g. 12040 for CUDA 12.4


def device_info(index: int = 0) -> DeviceInfo:
    cudart()  # loads the bindings, or says how to install them
    count = call("cudaGetDeviceCount")
    if index >= count:
        raise CudaError(f"CUDA device {index} does not exist ({count} device(s) present)")
    prop = call("cudaGetDeviceProperties", index)
    name = prop.name.decode(errors="replace") if isinstance(prop.name, bytes) else str(prop.name)
    return DeviceInfo(index, name.rstrip("\x00"), f"{prop.major}.{prop.minor}",
                      int(prop.totalGlobalMem), int(call("cudaDriverGetVersion")))


def gpu_available() -> tuple[bool, str]:
    """(True, device name) or (False, why not): for tests and checks that skip cleanly."""
    try:
        info = device_info(0)
    except CudaError as e:
        return False, str(e)
    return True, f"{info.name} (compute capability {info.compute_capability})"


def _release(name: str, handle) -> None:
    """Frees a CUDA resource from a finalizer: an error there (the process tearing the context
    down first) has nobody to report to and nothing left to leak."""
    try:
        call(name, handle)
    except CudaError:
        pass


def _on_collect(owner, name: str, handle) -> weakref.finalize:
    """Frees `handle` with cudart.<name> when `owner` is collected, or at an explicit call of
    the returned finalizer (once either way). Not at interpreter exit: by then the CUDA context
    may be gone, and the driver frees everything with the process anyway."""
    free = weakref.finalize(owner, _release, name, handle)
    free.atexit = False
    return free


class Stream:
    """A non-blocking stream: the backends' work, copies included, is ordered on it."""

    def __init__(self):
        rt = cudart()
        self._stream = call("cudaStreamCreateWithFlags", rt.cudaStreamNonBlocking)
        self._free = _on_collect(self, "cudaStreamDestroy", self._stream)

    @property
    def handle(self) -> int:
        return int(self._stream)

    @property
    def raw(self):
        return self._stream

    def synchronize(self) -> None:
        call("cudaStreamSynchronize", self._stream)

    def close(self) -> None:
        self._free()
        self._stream = None


class DeviceBuffer:
    """`nbytes` of device memory (at least 1: zero-sized tensors still need an address),
    freed by close() or when the buffer is collected."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.ptr = int(call("cudaMalloc", max(self.nbytes, 1)))
        self._free = _on_collect(self, "cudaFree", self.ptr)

    def close(self) -> None:
        self._free()
        self.ptr = 0


class PinnedArray:
    """A numpy array in page-locked host memory: async copies from and to it really are
    asynchronous, and a CUDA graph can capture them (it reads the array when replayed)."""

    def __init__(self, shape: tuple[int, ...], dtype):
        dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        self.ptr = int(call("cudaMallocHost", nbytes))
        raw = (ctypes.c_byte * nbytes).from_address(self.ptr)
        # freed when the last numpy view of it goes (every view keeps `raw` alive), not
        # merely when this object does: a caller may still hold an output array
        self._free = _on_collect(raw, "cudaFreeHost", self.ptr)
        count = int(np.prod(shape, dtype=np.int64))
        self.array = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)  # [shape]
        self.array[...] = 0

    def close(self) -> None:
        """Lets the memory go: freed at once if nobody else holds a view of `array`, else when
        the last view goes (a caller may still read an output it was given; freeing under it
        would crash the process instead of raising)."""
        self.array = None
        self.ptr = 0


def copy_to_device(dst: int, host: np.ndarray, stream: Stream, src_ptr: int | None = None):
    """Host -> device, async on `stream` (`src_ptr`: the host array's address when pinned)."""
    rt = cudart()
    src = src_ptr if src_ptr is not None else host.ctypes.data
    call("cudaMemcpyAsync", dst, src, host.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
         stream.raw)


def copy_to_host(host: np.ndarray, src: int, stream: Stream, dst_ptr: int | None = None):
    rt = cudart()
    dst = dst_ptr if dst_ptr is not None else host.ctypes.data
    call("cudaMemcpyAsync", dst, src, host.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
         stream.raw)


def copy_device(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    rt = cudart()
    call("cudaMemcpyAsync", dst, src, nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice,
         stream.raw)


def copy_rows(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int,
              stream: Stream, kind: str = "DeviceToDevice") -> None:
    """`rows` rows of `width` bytes, strided copy (cudaMemcpy2DAsync); `kind` names the
    direction as CUDA does (DeviceToDevice, DeviceToHost, HostToDevice)."""
    rt = cudart()
    call("cudaMemcpy2DAsync", dst, dst_pitch, src, src_pitch, width, rows,
         getattr(rt.cudaMemcpyKind, f"cudaMemcpy{kind}"), stream.raw)


def fill_zero(dst: int, nbytes: int, stream: Stream) -> None:
    call("cudaMemsetAsync", dst, 0, nbytes, stream.raw)
