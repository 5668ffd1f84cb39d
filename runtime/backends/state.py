"""What every graph backend (OrtGraph, OrtCudaGraph, TrtGraph) checks the same way: a state
given to `set_state()` and an input given to `set_input()`. Host-side numpy only, no CUDA."""

from __future__ import annotations

import numpy as np

from personaplex_edge.errors import StateError
from personaplex_edge.manifest import GraphEntry


def host_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a manifest dtype on the host (bfloat16 through ml_dtypes)."""
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise StateError("bfloat16 tensors on the host need ml_dtypes: pip install "
                             "ml_dtypes") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def check_state(entry: GraphEntry, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`arrays` checked against the graph's whole state (its state tensors and KV rings): the
    same names, each with its shape and dtype. Returns them as contiguous arrays, in the
    entry's order; raises StateError before anything is written."""
    specs = {s.name: s for s in entry.state}
    specs.update({r.input_name: r for r in entry.rings})
    missing, unknown = sorted(set(specs) - set(arrays)), sorted(set(arrays) - set(specs))
    if missing or unknown:
        raise StateError(f"{entry.file}: state is missing {missing or 'nothing'} and "
                         f"has unknown {unknown or 'nothing'}")
    checked = {}
    for name, spec in specs.items():
        a = np.ascontiguousarray(arrays[name])
        if a.shape != tuple(spec.shape) or a.dtype != host_dtype(spec.dtype):
            raise StateError(f"{entry.file}: state '{name}' must be {spec.dtype} "
                             f"{list(spec.shape)}, got {a.dtype} {list(a.shape)}")
        checked[name] = a
    return checked


def copy_input(entry_file: str, inputs: dict[str, np.ndarray], name: str,
               value: np.ndarray) -> None:
    """Copies `value` into the host input array `inputs[name]` (a same-kind cast, the shape
    must match)."""
    target = inputs.get(name)
    if target is None:
        raise StateError(f"{entry_file} has no input '{name}'; it takes " + ", ".join(inputs))
    if value.shape != target.shape:
        raise StateError(f"{entry_file} input '{name}' must have shape "
                         f"{list(target.shape)}, got {list(value.shape)}")
    np.copyto(target, value, casting="same_kind")
