"""The precision table: how each precision is laid out for each backend, and what each backend can
honour.

    precision  backend onnx (onnxruntime)            backend tensorrt
    fp32       float32                               float32 (TF32 off at build)
    fp16       fp16 islands, fp16 KV                 the same
    bf16       refused at export (below)             bf16 islands, bf16 KV
    int8       MatMulNBits 8-bit, block 128          DequantizeLinear int8, per channel
               (experimental for TensorRT: below)
    int4       MatMulNBits 4-bit, block 32           DequantizeLinear int4, block 128
               (int8/int4: fp16 islands; with
               compute="float32" every float is
               float32: WebGPU adapters without
               shader-f16)
    fp8        refused (TensorRT only)               DequantizeLinear float8 e4m3, per channel
               (experimental: below)

The KV ring's dtype is a separate choice (`kv_dtype`): onnxruntime on the CPU has no fp16 MatMul
on x86 and wraps one in casts of the whole ring every step (measured: 0.42 ms -> 4.8 ms for one
[16, 3000, 64] score product), so int8/int4 for the onnx backend keep a float32 ring by default;
on a GPU pass kv_dtype="float16" (the manifest records the ring dtype in each RingSpec).

What a backend cannot honour is refused before an export writes anything (`refusals`):
bf16 (weights or ring) for onnxruntime, whose runtime here binds no bfloat16 buffers - fp16 has
the same bytes and runs there. What TensorRT may not honour is said (`tensorrt_warnings`):
TensorRT documents weight-only quantisation for INT4 only (INT8 and FP8 are quantised with their
activations, from calibration), so a DequantizeLinear on an int8 or fp8 weight alone may be
folded back to fp16 when the engine is built - no memory saved - or run every frame. The
engine build compares each engine's size with the weight bytes it should hold and says which
happened (runtime/backends/trt_build.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from personaplex_edge.contract import (BACKENDS, DEPFORMER_STEP, HELIUM_STEP, PRECISIONS,
                                       TRANSCRIBER_STEP)
from personaplex_edge.errors import PersonaPlexError

KV_DTYPES = ("float32", "float16", "bfloat16")
COMPUTES = ("float16", "float32")  # what an int8/int4 graph computes in besides its products
TENSORRT_EXPERIMENTAL = ("int8", "fp8")


@dataclass(frozen=True)
class PrecisionPlan:
    """How one precision is laid out. `compute` is the low float type of the matrix products."""

    precision: str
    compute: str  # "float32", "float16" or "bfloat16"
    kv_dtype: str  # dtype of the KV ring and its row outputs
    bits: int | None = None  # weight-only integer bits (int8 / int4)
    weight_format: str = "float"  # "float", "matmulnbits" (onnxruntime) or "qdq" (TensorRT)
    block_size: int = 32
    accuracy_level: int = 4  # MatMulNBits: 4 = int8 activations on the CPU (ignored by CUDA)


def plan_for(precision: str, backend: str = "onnx", kv_dtype: str | None = None,
             block_size: int | None = None, compute: str | None = None) -> PrecisionPlan:
    """The layout of `precision` for `backend` ("onnx" or "tensorrt"). `compute` chooses the
    float type of an int8/int4 onnxruntime graph outside its weights' products (None: float16,
    the GPUs' fast path; "float32": every WebGPU adapter runs it, shader-f16 or not)."""
    if precision not in PRECISIONS:
        raise PersonaPlexError(f"unknown precision {precision!r}; choose one of "
                               f"{', '.join(PRECISIONS)}")
    if backend not in BACKENDS:
        raise PersonaPlexError(f"unknown backend {backend!r}; use {' or '.join(BACKENDS)}")
    if kv_dtype is not None and kv_dtype not in KV_DTYPES:
        raise PersonaPlexError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, "
                               f"got {kv_dtype!r}")
    if compute is not None:
        _check_compute(precision, backend, compute)
    if precision == "fp32":
        return PrecisionPlan("fp32", "float32", kv_dtype or "float32")
    if precision in ("fp16", "bf16"):
        low = "float16" if precision == "fp16" else "bfloat16"
        return PrecisionPlan(precision, low, kv_dtype or low)
    if precision == "fp8":
        if backend != "tensorrt":
            raise PersonaPlexError("fp8 is a TensorRT precision (Ada and Hopper GPUs); for "
                                   "onnxruntime use int8 or int4")
        # float8 e4m3 weights, one fp16 scale per output channel, in fp16 islands
        return PrecisionPlan("fp8", "float16", kv_dtype or "float16", 8, "qdq", 0)
    bits = 8 if precision == "int8" else 4
    if backend == "tensorrt":
        # TensorRT: dequantised fp16 weights in fp16 islands; int8 is per output channel
        return PrecisionPlan(precision, "float16", kv_dtype or "float16", bits, "qdq",
                             block_size or (128 if bits == 4 else 0))
    # int4 blocks of 32 keep the random-weight agreement of this project's benchmark high;
    # int8 needs no small blocks (its error is already below fp16's on the tables)
    # float32 compute is float32 everywhere, the products' activations too (accuracy level 1):
    # the CPU's int8 activations (level 4) would round differently from a GPU's float32
    return PrecisionPlan(precision, compute or "float16", kv_dtype or "float32", bits,
                         "matmulnbits", block_size or (32 if bits == 4 else 128),
                         1 if compute == "float32" else 4)


def _check_compute(precision: str, backend: str, compute: str) -> None:
    if compute not in COMPUTES:
        raise PersonaPlexError(f"compute must be one of {', '.join(COMPUTES)}, got {compute!r}")
    if precision not in ("int8", "int4"):
        natural = "float32" if precision == "fp32" else "its own float type"
        if not (precision == "fp32" and compute == "float32"):
            raise PersonaPlexError(f"--compute goes with --precision int8 or int4: {precision} "
                                   f"computes in {natural}")
    elif backend != "onnx" and compute == "float32":
        raise PersonaPlexError("--compute float32 is for onnxruntime (the CPU, WebGPU); "
                               "TensorRT's int8/int4 graphs compute in float16")


def lm_plans(precision: str, backend: str = "onnx", kv_dtype: str | None = None,
             block_size: int | None = None,
             depformer_precision: str | None = None,
             compute: str | None = None) -> dict[str, PrecisionPlan]:
    """The plan of each LM graph. The depformer may take its own precision: it is ~9% of the
    7B's bytes per frame and makes every audio token, so an int4 Helium with an int8 or fp16
    depformer costs little and keeps the audio closer (bench_precision.py measures it). It has
    no KV ring."""
    return {HELIUM_STEP: plan_for(precision, backend, kv_dtype, block_size,
                                  _compute_of(precision, compute)),
            DEPFORMER_STEP: plan_for(depformer_precision or precision, backend, None,
                                     block_size, _compute_of(depformer_precision or precision,
                                                             compute))}


def _compute_of(precision: str, compute: str | None) -> str | None:
    """`compute` where it applies to `precision` (int8/int4), else the precision's own: one
    --compute float32 serves an int4 Helium beside an fp32 depformer."""
    return compute if precision in ("int8", "int4") else None


def refusals(plans: dict[str, PrecisionPlan], backend: str) -> list[str]:
    """What `backend`'s runtime cannot run in these plans, each with what works instead."""
    if backend != "onnx":
        return []
    weights = [n for n, p in plans.items() if p.compute == "bfloat16"]
    ring = [n for n, p in plans.items() if p.kv_dtype == "bfloat16" and p.compute != "bfloat16"]
    out = []
    if weights:
        out.append(f"bf16 ({', '.join(weights)}) cannot run on onnxruntime here (the runtime "
                   "binds no bfloat16 buffers): use --precision fp16 for onnxruntime (the same "
                   "bytes), or --backend tensorrt for bf16")
    if ring:
        out.append(f"a bfloat16 KV ring ({', '.join(ring)}) cannot run on onnxruntime here: "
                   "use --kv-dtype float16 (or float32), or --backend tensorrt")
    return out


def tensorrt_warnings(plans: dict[str, PrecisionPlan], backend: str) -> list[str]:
    """What TensorRT may not honour as asked: int8 / fp8 weight-only (module docstring)."""
    if backend != "tensorrt":
        return []
    return [f"warning: {name} in {plan.precision} for TensorRT is experimental: mainline "
            "TensorRT documents weight-only quantisation for INT4 only, so it may fold these "
            f"{plan.precision} weights back to fp16 when it builds the engine (no memory saved) "
            "or dequantise them every frame (TensorRT for RTX keeps them: measured); the engine "
            "build reports which happened. int4 (or fp16) is the documented path"
            for name, plan in plans.items() if plan.precision in TENSORRT_EXPERIMENTAL]


def check_plans(precision: str, backend: str, kv_dtype: str | None = None,
                depformer_precision: str | None = None,
                transcriber_precision: str | None = None, compute: str | None = None,
                ) -> tuple[dict[str, PrecisionPlan], list[str]]:
    """The plans of an export, or one PersonaPlexError naming everything it cannot honour;
    with the warnings to show before it starts. `transcriber_precision` (the transcriber's
    step, by default the LM's `precision`) adds the transcriber's plan."""
    if compute is not None and not any(p in ("int8", "int4") for p in (
            precision, depformer_precision, transcriber_precision)):
        _check_compute(precision, backend, compute)  # says what --compute goes with
    plans = lm_plans(precision, backend, kv_dtype, None, depformer_precision, compute)
    if transcriber_precision is not None:
        plans[TRANSCRIBER_STEP] = plan_for(transcriber_precision, backend, kv_dtype, None,
                                           _compute_of(transcriber_precision, compute))
    return _checked(plans, backend)


def check_transcriber_plan(precision: str, backend: str, kv_dtype: str | None = None,
                           compute: str | None = None) -> tuple[PrecisionPlan, list[str]]:
    """check_plans for a transcriber added alone to an exported model: its step's plan, and
    the warnings to show before it is exported."""
    plans, warnings = _checked({TRANSCRIBER_STEP: plan_for(
        precision, backend, kv_dtype, None, _compute_of(precision, compute))}, backend)
    return plans[TRANSCRIBER_STEP], warnings


def _checked(plans: dict[str, PrecisionPlan], backend: str,
             ) -> tuple[dict[str, PrecisionPlan], list[str]]:
    refused = refusals(plans, backend)
    if refused:
        raise PersonaPlexError("; ".join(refused))
    return plans, tensorrt_warnings(plans, backend)
