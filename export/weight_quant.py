"""Weight-only integer formats for the linear layers: symmetric, blockwise along the input axis.

A linear weight W [K, N] (the MatMul's B: K inputs, N outputs) is cut into blocks of
`block_size` rows per column; each block gets one scale s = max|w| / qmax and stores
q = round(w / s) in [-qmax - 1, qmax] (qmax = 7 for int4, 127 for int8). No zero points: the
weights of a trained transformer are centred, and a symmetric format is what both onnxruntime's
MatMulNBits (default zero point 2^(bits-1)) and TensorRT's weight-only DequantizeLinear read
without extra inputs.

Two storage layouts of the same numbers:

    MatMulNBits (onnxruntime, com.microsoft domain; CPU and CUDA):
        B       uint8 [N, n_blocks, block_size * bits / 8]  q + 2^(bits-1), int4 packed two per
                byte, the even row in the low nibble
        scales  [N, n_blocks]                               float32 (the type of the activations)
    DequantizeLinear (standard ONNX; TensorRT weight-only quantization, onnxruntime too):
        int4:   x int4 [K_pad, N] (K padded with zero rows to whole blocks), scale
                [K_pad / block_size, N], axis 0, block_size (opset 21)
        int8:   x int8 [K, N], scale [N], axis 1 (one scale per output channel, opset 13)

Torch-free (numpy only): it also serves tests and benchmarks that count bytes.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BlockQuant:
    q: np.ndarray  # [K_pad, N] int8, the signed integer values (padding rows are 0)
    scales: np.ndarray  # [n_blocks, N] float32
    k: int  # rows before padding
    bits: int
    block_size: int

    @property
    def n_blocks(self) -> int:
        return self.scales.shape[0]

    def dequantize(self) -> np.ndarray:
        """[K, N] float32: what a kernel multiplies with."""
        w = self.q.astype(np.float32).reshape(self.n_blocks, self.block_size, -1)
        return (w * self.scales[:, None, :]).reshape(-1, self.q.shape[1])[:self.k]


def qmax(bits: int) -> int:
    return (1 << (bits - 1)) - 1


# Scales tried per block, as fractions of max|w| / qmax: clipping the few largest weights of a
# block buys a finer step for all the others. Round-to-nearest on max|w| alone leaves 4-bit
# errors ~15-20% larger (squared error, Gaussian-like weights).
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7)
_PIECE = 1 << 18  # float32 values quantised at once (1 MB): a piece and its scratch fit in L2


def quantize_blockwise(w: np.ndarray, bits: int, block_size: int,
                       clip_search: bool | None = None) -> BlockQuant:
    """w [K, N] float -> symmetric blocks of `block_size` rows along K (K padded with zeros),
    each block's scale the one of CLIP_RATIOS with the least squared error (by default for
    4 bits only: at 8 bits clipping gains nothing measurable and costs 7x the time).

    Worked one output channel at a time (w.T, free when w is a transposed view, as
    transpose_fold.py makes it), a few channels per piece so that a piece stays in cache, the
    pieces spread over the cores (numpy lets go of the GIL): a 7B layer in seconds."""
    if clip_search is None:
        clip_search = bits == 4
    if bits not in (4, 8):
        raise ValueError(f"weight-only quantisation supports 4 or 8 bits, not {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    w = np.asarray(w, dtype=np.float32)
    k, n = w.shape
    n_blocks = -(-k // block_size)
    channels = w.T  # [N, K]
    q = np.empty((n, n_blocks * block_size), np.int8)  # [N, K_pad]
    scales = np.empty((n, n_blocks), np.float32)  # [N, n_blocks]
    ratios = CLIP_RATIOS if clip_search else (1.0,)
    step = max(1, _PIECE // (n_blocks * block_size))

    def piece(lo: int) -> None:
        hi = min(n, lo + step)
        blocks = np.zeros((hi - lo, n_blocks, block_size), np.float32)  # [m, n_blocks, bs]
        blocks.reshape(hi - lo, -1)[:, :k] = channels[lo:hi]
        q[lo:hi], scales[lo:hi] = _quantize_blocks(blocks, bits, ratios)

    with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
        list(pool.map(piece, range(0, n, step)))
    return BlockQuant(q.T, scales.T, k, bits, block_size)


def _quantize_blocks(blocks: np.ndarray, bits: int, ratios) -> tuple[np.ndarray, np.ndarray]:
    """blocks [m, n_blocks, bs] -> (q [m, n_blocks * bs] int8, scales [m, n_blocks])."""
    absmax = np.abs(blocks).max(axis=2)  # [m, n_blocks]
    # an all-zero block gets scale 1 (any scale gives q = 0); avoids dividing by zero
    full = np.where(absmax > 0, absmax / qmax(bits), 1.0).astype(np.float32)
    work = np.empty_like(blocks)  # the one scratch every ratio's rounding and error reuse

    def rounded(scale: np.ndarray) -> np.ndarray:  # scale [m, n_blocks, 1]
        np.divide(blocks, scale, out=work)
        np.rint(work, out=work)
        return np.clip(work, -qmax(bits) - 1, qmax(bits), out=work)

    best_scale = full
    if len(ratios) > 1:  # the ratio with the least squared error, per block
        best_err = None
        for ratio in ratios:
            scale = (full * ratio).astype(np.float32)[..., None]  # [m, n_blocks, 1]
            err = rounded(scale)
            err *= scale
            err -= blocks
            np.square(err, out=err)
            err = err.sum(axis=2)  # [m, n_blocks]
            if best_err is None:
                best_scale, best_err = scale[..., 0], err
            else:
                better = err < best_err
                best_scale = np.where(better, scale[..., 0], best_scale)
                best_err = np.minimum(err, best_err)
    q = rounded(best_scale[..., None])
    return q.astype(np.int8).reshape(blocks.shape[0], -1), best_scale


def quantize_per_channel(w: np.ndarray, bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """w [K, N] -> (q [K, N] int8, scales [N] float32): one scale per output channel."""
    w = np.asarray(w, dtype=np.float32)
    absmax = np.abs(w).max(axis=0)  # [N]
    scales = np.where(absmax > 0, absmax / qmax(bits), 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scales), -qmax(bits) - 1, qmax(bits)).astype(np.int8)
    return q, scales


FP8_MAX = 448.0  # largest finite float8 e4m3fn


def quantize_fp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [K, N] -> (q [K, N] float8 e4m3fn (ml_dtypes), scales [N] float32), one scale per
    output channel mapping its max|w| to the largest finite e4m3 value."""
    import ml_dtypes

    w = np.asarray(w, dtype=np.float32)
    absmax = np.abs(w).max(axis=0)  # [N]
    scales = np.where(absmax > 0, absmax / FP8_MAX, 1.0).astype(np.float32)
    return (w / scales).astype(ml_dtypes.float8_e4m3fn), scales


def matmulnbits_layout(bq: BlockQuant) -> tuple[np.ndarray, np.ndarray]:
    """-> (B uint8 [N, n_blocks, blob], scales float32 [N, n_blocks]) as MatMulNBits reads them."""
    n = bq.q.shape[1]
    unsigned = (bq.q.astype(np.int16) + (1 << (bq.bits - 1))).astype(np.uint8)  # [K_pad, N]
    per_col = np.ascontiguousarray(unsigned.T).reshape(n, bq.n_blocks, bq.block_size)
    if bq.bits == 4:
        per_col = per_col[..., 0::2] | (per_col[..., 1::2] << 4)  # [N, n_blocks, bs / 2]
    return np.ascontiguousarray(per_col), np.ascontiguousarray(bq.scales.T)


def pack_int4(q: np.ndarray) -> bytes:
    """Signed 4-bit values (any shape, row-major) -> ONNX INT4 raw data: two per byte, the
    element with the even flat index in the low nibble; an odd count pads the last byte."""
    flat = (q.reshape(-1).astype(np.int16) & 0xF).astype(np.uint8)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).tobytes()


def block_for(k: int, block_size: int) -> int:
    """The block actually used for K rows: `block_size`, halved (not below 16) while padding K
    up to whole blocks would waste more than an eighth of it. Real layer widths (multiples of
    128) keep the requested block; a 64-wide test model gets 64, not 128 rows of padding."""
    bs = block_size
    while bs > 16 and -(-k // bs) * bs - k > k // 8:
        bs //= 2
    return bs


def stored_bytes(k: int, n: int, bits: int, block_size: int | None, scale_bytes: int) -> int:
    """Bytes a [K, N] weight takes in a format (block_size None: per output channel)."""
    if block_size is None:
        return k * n * bits // 8 + n * scale_bytes
    block_size = block_for(k, block_size)
    n_blocks = -(-k // block_size)
    return n * n_blocks * (block_size * bits // 8 + scale_bytes)
