"""Mainline TensorRT or TensorRT for RTX: the one place where the two libraries differ.

                    mainline TensorRT (`tensorrt`)        TensorRT for RTX (`tensorrt_rtx`)
    for             Jetson (JetPack), data-centre GPUs    RTX 30/40/50 PCs, RTX PRO, DGX Spark
    builds on       the GPU it builds for (kernels        any machine, a GPU or none (ahead of
                    chosen by timing there)               time); kernels are compiled for the
                                                          GPU when a context is made (JIT)
    an engine runs  on that GPU model, that version       on its targets (compute capabilities),
                                                          that version
    build targets   this GPU                              set_compute_capability(SMxx, i)
    timing cache    kept per GPU and version              none (it does nothing there)
    before loading  the record against this GPU           the record, then get_engine_validity
                                                          on the engine's header
    a context       create_execution_context()            from a runtime config: a runtime cache
                                                          of the JIT's kernels kept per engine
                                                          and GPU; shape-specialised kernels
                                                          compiled eagerly, so that a CUDA graph
                                                          captures them, not the fallback ones

Everything else - the ONNX parser, strongly typed networks, optimization profiles, tensor
addresses, execute_async_v3 - is one API, so trt_build.py and trt.py are written once over a
`Library`. Weight formats need GPUs of their generation: TensorRT for RTX compiles int8 and int4
weights for 8.6 and newer, fp8 for 8.9 and newer, bf16 for 8.0 and newer; mainline TensorRT's
bf16 needs 8.0 too (a T4, 7.5, has none) and its fp8 8.9 (Ada, Hopper). Turing (7.5) is no
target of TensorRT for RTX here at all: it has no float32 matrix products there ("FP32 GEMM is
not supported"), and every graph of these models has some - the codec is float32 in every
precision, and Helium and the depformer keep float32 products beside their fp16 ones (measured
with 1.7: no graph of any precision builds for SM75).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from personaplex_edge.atomic import write_bytes_atomic
from personaplex_edge.errors import ModelDirError, PersonaPlexError
from personaplex_edge.user_cache import user_cache_dir

MAINLINE, RTX = "tensorrt", "tensorrt-rtx"
LIBRARIES = (MAINLINE, RTX)
_MODULES = {MAINLINE: "tensorrt", RTX: "tensorrt_rtx"}
TITLES = {MAINLINE: "TensorRT", RTX: "TensorRT for RTX"}
# what a user writes (--library) -> the library
CHOICES = {"auto": None, "tensorrt": MAINLINE, "rtx": RTX, "tensorrt-rtx": RTX}

INSTALL = {
    RTX: "pip install 'personaplex-edge[rtx]' (TensorRT for RTX: RTX 30/40/50 PCs and DGX "
         "Spark; it builds engines on any machine, no GPU needed)",
    MAINLINE: "pip install 'personaplex-edge[trt-cu12]' (mainline TensorRT: data-centre GPUs; "
              "[trt-cu13] for a CUDA 13 driver; on a Jetson, JetPack's TensorRT in a venv made "
              "with --system-site-packages and 'personaplex-edge[jetson]')",
}

# TensorRT for RTX's build targets for these models: compute capability -> trt.ComputeCapability
# member (Turing, which the library knows, is not one: TURING)
RTX_TARGETS = {"8.0": "SM80", "8.6": "SM86", "8.9": "SM89", "12.0": "SM120", "12.1": "SM121"}
# NVIDIA's portable set (RTX 30, 40 and 50); 8.0 and DGX Spark when named
DEFAULT_RTX_TARGETS = ("8.6", "8.9", "12.0")
TURING = "7.5"  # RTX 20 and T4: no float32 matrix products in TensorRT for RTX (docstring)
# the oldest GPU generation whose kernels hold a weight format (module docstring)
RTX_MIN_CC = {"bf16": "8.0", "int8": "8.6", "int4": "8.6", "fp8": "8.9"}
MAINLINE_MIN_CC = {"bf16": "8.0", "fp8": "8.9"}


class TensorRTMissing(PersonaPlexError):
    """Neither TensorRT can be imported here (or not the one asked for)."""


def cc_tuple(cc: str) -> tuple[int, int]:
    major, minor = cc.split(".")
    return int(major), int(minor)


@dataclass(frozen=True)
class Library:
    name: str  # MAINLINE or RTX
    trt: ModuleType

    @property
    def version(self) -> str:
        return self.trt.__version__

    @property
    def rtx(self) -> bool:
        return self.name == RTX

    @property
    def title(self) -> str:
        return f"{TITLES[self.name]} {self.version}"

    # ---- building ----------------------------------------------------------------------------
    def network_flags(self) -> int:
        """Strongly typed: every tensor's type comes from the graph (fp16/bf16 islands,
        DequantizeLinear weights). TensorRT 10 needs the flag; TensorRT for RTX and TensorRT 11
        know no other kind (the flag is still accepted)."""
        flag = getattr(self.trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
        return 0 if flag is None else 1 << int(flag)

    def set_targets(self, config, targets: tuple[str, ...]) -> None:
        """TensorRT for RTX: compile for exactly `targets`; mainline builds for this GPU."""
        if not self.rtx:
            return
        config.num_compute_capabilities = len(targets)
        for i, cc in enumerate(targets):
            # by the library's own name (SM75 too: a test shows the builder's word on Turing)
            member = RTX_TARGETS.get(cc) or "SM" + cc.replace(".", "")
            config.set_compute_capability(getattr(self.trt.ComputeCapability, member), i)

    @property
    def timing_cache(self) -> bool:
        return not self.rtx

    def weightless_flags(self) -> list:
        """A weightless engine (trt_build.py): no weights in the plan (STRIP_PLAN), refittable
        from the same ONNX graph with the refit each library documents for it."""
        names = ("STRIP_PLAN", "REFIT") if self.rtx else ("STRIP_PLAN", "REFIT_IDENTICAL")
        return [getattr(self.trt.BuilderFlag, n) for n in names]

    def refit(self, engine, onnx_path: Path, logger) -> str | None:
        """Puts a weightless engine's weights back from its ONNX graph (and the graph's
        external data beside it); why not, or None when done."""
        trt = self.trt
        refitter = trt.Refitter(engine, logger)
        if not trt.OnnxParserRefitter(refitter, logger).refit_from_file(str(onnx_path)):
            return f"{onnx_path.name} does not hold the weights the engine was built from"
        if not refitter.refit_cuda_engine():
            return "TensorRT could not refit the engine (see its log above)"
        return None


def load_library(name: str | None = None) -> Library:
    """The library `name` (MAINLINE, RTX; None: mainline TensorRT where it is installed, else
    TensorRT for RTX), or TensorRTMissing naming the install line."""
    order = [name] if name else list(LIBRARIES)
    errors = []
    for lib in order:
        try:
            module = importlib.import_module(_MODULES[lib])
        except (ImportError, OSError) as e:  # OSError: the wheel is there, its libraries not
            errors.append(f"{_MODULES[lib]}: {e}")
            continue
        if lib == MAINLINE and int(module.__version__.split(".")[0]) < 10:
            # before 10 a network without EXPLICIT_BATCH is implicit-batch (the ONNX parser
            # refuses it), int64 inputs do not exist, and fp16 layers need builder flags
            errors.append(f"TensorRT {module.__version__} is too old: the engines need "
                          "TensorRT 10 or newer (JetPack 6.2)")
            continue
        return Library(lib, module)
    lines = [INSTALL[lib] for lib in (order if name else (RTX, MAINLINE))]
    what = "TensorRT for RTX" if name == RTX else "mainline TensorRT" if name else "TensorRT"
    raise TensorRTMissing(f"{what} cannot be used here ({'; '.join(errors)}): "
                          + "; or ".join(lines))


def library_of(record: dict | None) -> str:
    """The library that built an engine record (records written before there were two are
    mainline TensorRT's)."""
    return (record or {}).get("library", MAINLINE)


def build_targets(lib: Library, precisions, asked: tuple[str, ...] | None = None,
                  gpu_cc: str | None = None) -> tuple[str, ...]:
    """The compute capabilities engines of these precisions are built for: `gpu_cc`, the GPU of
    this machine (always, for mainline TensorRT); else, for TensorRT for RTX, the targets
    `asked` (--targets) or the default targets that hold every precision. Refuses a precision
    a target cannot hold, naming both, and targets TensorRT for RTX does not know."""
    precisions = set(precisions)
    if asked and not lib.rtx:
        raise PersonaPlexError("--targets is for TensorRT for RTX (--library rtx); mainline "
                               "TensorRT builds for the GPU it runs on")
    table = RTX_MIN_CC if lib.rtx else MAINLINE_MIN_CC
    if gpu_cc is not None:
        _refuse_below(precisions, (gpu_cc,), table, f"this GPU is {gpu_cc}")
        return (gpu_cc,)
    if not lib.rtx:
        raise PersonaPlexError("mainline TensorRT builds engines on the GPU they are for")
    if asked:
        if TURING in asked:
            raise PersonaPlexError(turing_refusal(f"--targets {TURING}",
                                                  [cc for cc in asked if cc != TURING]))
        unknown = [cc for cc in asked if cc not in RTX_TARGETS]
        if unknown:
            raise PersonaPlexError(f"--targets {','.join(unknown)}: TensorRT for RTX builds for "
                                   f"compute capabilities {', '.join(RTX_TARGETS)}")
        _refuse_below(precisions, asked, table, "--targets include {low}")
        return tuple(dict.fromkeys(asked))
    floor = max((cc_tuple(table[p]) for p in precisions if p in table), default=(0, 0))
    return tuple(cc for cc in DEFAULT_RTX_TARGETS if cc_tuple(cc) >= floor)


def turing_refusal(what: str, others: list[str] | None = None) -> str:
    """Why TensorRT for RTX builds nothing of these models for Turing (module docstring), and
    what works instead. `what`: the request refused; `others`: the other --targets it named
    (None: a Turing card asked to run them)."""
    if others is None:
        build = ""
    elif others:
        build = f"leave {TURING} out (--targets {','.join(others)}); "
    else:
        build = (f"build for {', '.join(DEFAULT_RTX_TARGETS)} (RTX 30, 40, 50: the default) or "
                 f"{', '.join(cc for cc in RTX_TARGETS if cc not in DEFAULT_RTX_TARGETS)}; ")
    return (f"{what}: TensorRT for RTX has no float32 matrix products on Turing (RTX 20, "
            f"compute capability {TURING}), and every graph of these models has some (the "
            f"codec is float32 in every precision): {build}on a Turing card use mainline "
            "TensorRT (--library tensorrt, engines built on that card) or a model exported "
            "with --backend onnx")


def _refuse_below(precisions: set[str], targets, table: dict[str, str], where: str) -> None:
    """Refuses the first precision some target is too old for; `where` says which ({low}:
    those targets)."""
    for p in sorted(precisions & set(table)):
        low = [cc for cc in targets if cc_tuple(cc) < cc_tuple(table[p])]
        if low:
            fit = [cc for cc in targets if cc not in low]
            fix = (f"build for {','.join(fit)} only" if fit else
                   "export another precision (fp16, int8 or int4 where the GPU holds them)")
            raise PersonaPlexError(f"{p} needs compute capability {table[p]} or newer; "
                                   f"{where.format(low=', '.join(low))}: {fix}")


# ---- loading -----------------------------------------------------------------------------------

def rtx_refusal(lib: Library, runtime, path: Path) -> str | None:
    """Why TensorRT for RTX would not run the engine at `path` on this GPU, from the engine's
    header alone (get_engine_validity, before anything is deserialised); None where it would.
    Mainline TensorRT has no such check (its record is compared instead)."""
    if not lib.rtx:
        return None
    with open(path, "rb") as f:
        header = f.read(int(getattr(runtime, "engine_header_size", 0) or 64))
    validity, diagnostics = runtime.get_engine_validity(header)
    if validity != lib.trt.EngineValidity.INVALID:
        return None
    flags = lib.trt.EngineInvalidityDiagnostics
    reasons = {"VERSION_MISMATCH": f"it was built by another version of TensorRT for RTX "
                                   f"(this is {lib.version})",
               "UNSUPPORTED_CC": "it was not built for this GPU's compute capability",
               "OLD_CUDA_DRIVER": "the NVIDIA driver is too old for it: update the driver",
               "OLD_CUDA_RUNTIME": "the CUDA runtime is too old for it",
               "INSUFFICIENT_GPU_MEMORY": "this GPU has too little memory for it",
               "MALFORMED_ENGINE": "the file is not a TensorRT for RTX engine (damaged?)",
               "CUDA_ERROR": "CUDA failed while checking it (see the log above)"}
    found = [text for name, text in reasons.items() if int(diagnostics) & int(getattr(flags,
                                                                                    name))]
    return "; ".join(found) or "TensorRT for RTX says it is not valid here"


class RuntimeCache:
    """TensorRT for RTX's JIT kernels for one engine on one GPU, kept in the per-user cache
    (<user cache>/tensorrt-rtx/<engine sha256>-<GPU>.cache) so that the next start skips the
    compilation. Every context of the engine shares it; save() writes it whole."""

    def __init__(self, lib: Library, engine_sha256: str, gpu: str):
        self.lib = lib
        safe = "".join(c if c.isalnum() or c in ".-" else "-" for c in gpu).strip("-")
        self.path = user_cache_dir("tensorrt-rtx", f"{engine_sha256[:32]}-{safe}-"
                                                   f"{lib.version}.cache")
        self.cache = None
        self._kept: bytes | None = None  # what the file holds: read from it, or written

    def context(self, engine):
        """An execution context whose JIT reads and fills the runtime cache, shape-specialised
        kernels compiled eagerly (the module docstring); a plain one on mainline TensorRT."""
        if not self.lib.rtx:
            return engine.create_execution_context()
        trt = self.lib.trt
        config = engine.create_runtime_config()
        config.dynamic_shapes_kernel_specialization_strategy = (
            trt.DynamicShapesKernelSpecializationStrategy.EAGER)
        # CUDA graphs are ours (cuda_graphs.py captures a frame's engines together)
        config.cuda_graph_strategy = trt.CudaGraphStrategy.DISABLED
        if self.cache is None:
            self.cache = config.create_runtime_cache()
            if self.path.is_file():
                try:
                    kept = self.path.read_bytes()
                    self.cache.deserialize(kept)
                    self._kept = kept
                except (RuntimeError, TypeError, ValueError):
                    pass  # another version's or damaged: compiled again, then replaced
        config.set_runtime_cache(self.cache)
        return engine.create_execution_context(config)

    def save(self) -> None:
        """Writes the cache where it holds what the file does not (a context made, kernels
        compiled for a new shape since). Best effort: a cache that cannot be written means
        compiling again next time."""
        if self.cache is None:
            return
        try:
            data = bytes(memoryview(self.cache.serialize()))
            if data == self._kept:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(self.path, data)
            self._kept = data
        except (OSError, RuntimeError):
            pass


def unsupported_gpu(lib: Library, compute_capability: str, device_name: str) -> None:
    """Refuses a GPU TensorRT for RTX does not run these models on (Hopper 9.0, Orin 8.7,
    Volta ...; Turing 7.5: module docstring)."""
    if lib.rtx and compute_capability == TURING:
        raise ModelDirError(turing_refusal(f"this {device_name}"))
    if lib.rtx and compute_capability not in RTX_TARGETS:
        raise ModelDirError(f"TensorRT for RTX does not run on {device_name} (compute "
                            f"capability {compute_capability}): use mainline TensorRT there, "
                            + INSTALL[MAINLINE])
