"""Bytes the language model reads per frame: counted in exported graphs, and estimated for any
config (the 7B) at each precision. One token per frame makes the LM memory bound, so these bytes
over a device's memory bandwidth are a floor on its ms/frame.

Counted: every initializer of the LM graphs (weights, scales, packed integers), except the
embedding tables, of which a frame reads a handful of rows (a Gather's data, directly or through
a Reshape); plus the whole KV ring, which each step attends over (slots not yet written are
masked, not skipped, so the bytes do not depend on the position).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from personaplex_edge.config import PersonaPlexConfig
from personaplex_edge.contract import DEPFORMER_STEP, HELIUM_STEP, LM_GRAPHS
from personaplex_edge.manifest import Manifest

_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "bool": 1}
# memory bandwidth, GB/s (vendor figures)
DEVICES = {"Jetson AGX Orin": 204.8, "Jetson AGX Thor": 273.0, "RTX 4090": 1008.0,
           "H200": 4800.0}


# onnx is imported where a graph is read: the figures and estimates below also serve a GPU
# machine that has no onnx (scripts/gpu/helium_timing.py)


def _tables(graph) -> set[str]:
    """Initializers that only feed Gather data inputs (through Reshape/Identity/Cast)."""
    producers = {o: n for n in graph.node for o in n.output}
    tables = set()
    for node in graph.node:
        if node.op_type != "Gather":
            continue
        name = node.input[0]
        while name in producers and producers[name].op_type in ("Reshape", "Identity", "Cast"):
            name = producers[name].input[0]
        tables.add(name)
    return tables


def graph_bytes_per_frame(path: str | Path) -> int:
    """Initializer bytes one run of a graph reads (tables excluded)."""
    import onnx

    from personaplex_edge.export.graph_edit import tensor_bytes

    graph = onnx.load(str(path), load_external_data=False).graph
    tables = _tables(graph)
    return sum(tensor_bytes(t) for t in graph.initializer if t.name not in tables)


def model_bytes_per_frame(model_dir: str | Path, manifest: Manifest,
                          graphs: tuple[str, ...] = LM_GRAPHS,
                          ) -> dict[str, int]:
    """{graph: weight bytes, "kv": ring bytes} for the LM graphs of a model directory."""
    out = {name: graph_bytes_per_frame(Path(model_dir) / manifest.graphs[name].file)
           for name in graphs if name in manifest.graphs}
    out["kv"] = sum(int(np.prod(r.shape)) * _ITEM[r.dtype] for name in graphs
                    if name in manifest.graphs for r in manifest.graphs[name].rings)
    return out


@dataclass(frozen=True)
class Layout:
    """Bytes of a precision: weights as `float_bytes` floats, or `bits`-bit integers with one
    scale of `scale_bytes` per `block` values along K (block None: one per output channel)."""

    float_bytes: int
    kv_bytes: int
    bits: int = 0
    block: int | None = None
    scale_bytes: int = 4


def layout_for(plan) -> Layout:
    """The Layout of a precision.PrecisionPlan."""
    kv = _ITEM[plan.kv_dtype]
    if plan.bits is None:
        return Layout(_ITEM[plan.compute], kv)
    if plan.weight_format == "matmulnbits":  # float32 scales, blocks along K
        return Layout(_ITEM[plan.compute], kv, plan.bits, plan.block_size, 4)
    block = plan.block_size if plan.bits == 4 else None  # int8 DQ: per output channel
    return Layout(_ITEM[plan.compute], kv, plan.bits, block, _ITEM[plan.compute])


def linear_shapes(cfg: PersonaPlexConfig) -> dict[str, list[tuple[int, int]]]:
    """[K, N] of every linear layer one frame runs, per graph: Helium with its text head, and
    the active depformer steps."""
    h, d = cfg.temporal_config, cfg.depformer_config
    D, I = h.hidden_size, h.intermediate_size
    helium = [(D, 3 * D), (D, D), (D, 2 * I), (I, D)] * h.num_hidden_layers
    helium.append((D, cfg.text_vocab_size))
    dim, di = d.hidden_size, d.intermediate_size
    depformer = []
    for _ in range(d.num_active_codebooks):
        depformer += [(D, dim), (dim, d.card)]
        depformer += [(dim, 3 * dim), (dim, dim), (dim, 2 * di), (di, dim)] * d.num_hidden_layers
    return {HELIUM_STEP: helium, DEPFORMER_STEP: depformer}


def _weight_bytes(shapes: list[tuple[int, int]], layout: Layout) -> int:
    if layout.bits:
        from personaplex_edge.export.weight_quant import stored_bytes

        return sum(stored_bytes(k, n, layout.bits, layout.block, layout.scale_bytes)
                   for k, n in shapes)
    return sum(k * n * layout.float_bytes for k, n in shapes)


def estimate_bytes_per_frame(cfg: PersonaPlexConfig, layout: Layout,
                             depformer_layout: Layout | None = None) -> dict[str, int]:
    """Weights and KV bytes per frame for `cfg` stored in `layout` (the depformer in
    `depformer_layout` when it has its own; norm gains and table rows, a few hundred KB, are
    left out)."""
    shapes = linear_shapes(cfg)
    weights = (_weight_bytes(shapes[HELIUM_STEP], layout)
               + _weight_bytes(shapes[DEPFORMER_STEP], depformer_layout or layout))
    h = cfg.temporal_config
    kv = 2 * h.num_hidden_layers * h.max_position_embeddings * h.hidden_size * layout.kv_bytes
    return {"weights": weights, "kv": kv, "total": weights + kv}


def copy_bandwidth(threads: int, mbytes: int = 512, repeats: int = 5) -> float:
    """Bytes/s moved by parallel numpy copies (read + write counted, like STREAM's copy): the
    floor bench_lm.py holds the LM to. The fastest of `repeats`, the array split evenly between
    `threads` (numpy lets go of the GIL while it copies)."""
    n = mbytes * (1 << 20) // 4
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)
    bounds = np.linspace(0, n, threads + 1).astype(int)

    def copy(i: int) -> None:
        a, b = bounds[i], bounds[i + 1]
        np.copyto(dst[a:b], src[a:b])

    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(copy, range(threads)))
            best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def floor_ms(nbytes: int, gb_per_s: float) -> float:
    return 1000 * nbytes / (gb_per_s * 1e9)
