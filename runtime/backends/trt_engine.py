"""What a TensorRT engine was built for, and the refusal of one built for something else.

A serialized engine only runs with the library and version that built it. Mainline TensorRT's
runs on GPUs of the compute capability it was built on; loaded elsewhere, TensorRT fails with an
opaque deserialisation error, or worse, picks kernels the GPU lacks. Within one compute
capability its kernels were still chosen by timing on one GPU model (H100 and H200 share 9.0 but
not their memory), so the GPU's name and memory size are compared too. TensorRT for RTX's runs
on any GPU of its targets (the compute capabilities it was built for). So every engine carries
an `EngineSpec` (in the manifest's graph entry, key "engine"; load_model_dir checks the engine
file's sha256 like every other file's), and the runtime compares it with the machine before it
deserialises anything (TensorRT for RTX then reads the engine's header too: trt_library.py).
"""

from __future__ import annotations

from pathlib import Path

from personaplex_edge.contract import EngineSpec
from personaplex_edge.errors import ModelDirError
from personaplex_edge.manifest import GraphEntry

from .trt_library import MAINLINE, RTX, TITLES

REBUILD = "rebuild the engines on this machine: personaplex-edge engines --model {model_dir}"


def rebuild_sentence(model_dir) -> str:
    """REBUILD as a sentence of its own."""
    text = REBUILD.format(model_dir=model_dir)
    return text[0].upper() + text[1:]


def engine_spec(model_dir: str | Path, entry: GraphEntry) -> EngineSpec:
    """The engine of a graph, from the entry's `engine` field."""
    data = entry.engine
    if data is None:
        raise ModelDirError(f"{model_dir}: {entry.file} has no TensorRT engine; "
                            + REBUILD.format(model_dir=model_dir))
    return data if isinstance(data, EngineSpec) else EngineSpec.from_dict(data)


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.0f} GiB" if nbytes else "memory not recorded"


def _memory_differs(built: int, here: int) -> bool:
    """Another memory size, where both are known. Cards of one model report the same figure;
    the 1/16 margin absorbs the few MB a board's firmware may reserve differently, and still
    tells 40 from 80 GB, 80 from 141 GB, or a 32 from a 64 GB Jetson."""
    return bool(built and here) and abs(built - here) > max(built, here) / 16


def check_compatible(spec: EngineSpec, tensorrt_version: str, compute_capability: str,
                     device_name: str, model_dir: str | Path, device_memory: int = 0,
                     library: str = MAINLINE) -> None:
    """Raises ModelDirError unless the engine was built by this library and version for this
    GPU: by TensorRT for RTX, for a target list holding this GPU's compute capability; by
    mainline TensorRT, for this GPU model - the same compute capability is not enough (H100 and
    H200 share 9.0, but the kernels timed on one are not the best on the other), so the GPU's
    name and, where recorded, its memory size must agree too."""
    problems = []
    if spec.library != library:
        # a manifest from a newer release may name a library this one does not know
        problems.append(f"{TITLES.get(spec.library, spec.library)} built it, this is "
                        f"{TITLES[library]}")
    elif spec.tensorrt_version != tensorrt_version:
        problems.append(f"{TITLES[library]} {spec.tensorrt_version} built it, this is "
                        f"{tensorrt_version}")
    if spec.library == RTX:
        if compute_capability not in spec.targets:
            problems.append(f"it was built for compute capabilities "
                            f"{', '.join(spec.targets) or 'none'}, this GPU is "
                            f"{compute_capability} ({device_name})")
    elif spec.compute_capability != compute_capability:
        problems.append(f"it was built for compute capability {spec.compute_capability} "
                        f"({spec.device_name}), this GPU is {compute_capability} "
                        f"({device_name})")
    elif spec.device_name not in ("?", device_name) or _memory_differs(spec.device_memory,
                                                                       device_memory):
        problems.append(f"it was built on a {spec.device_name} ({_gib(spec.device_memory)}), "
                        f"this is a {device_name} ({_gib(device_memory)}): the same compute "
                        "capability, but its kernels were chosen by timing on the other GPU")
    if problems:
        raise ModelDirError(f"{model_dir}/{spec.file} cannot run here: " + "; ".join(problems)
                            + ". " + rebuild_sentence(model_dir))


def check_engine_file(model_dir: str | Path, spec: EngineSpec) -> Path:
    """The engine's path, after checking that it exists (its sha256 is the manifest's, checked
    by load_model_dir with every other file)."""
    path = Path(model_dir) / spec.file
    if not path.is_file():
        raise ModelDirError(f"{path} is missing; " + REBUILD.format(model_dir=model_dir))
    return path
