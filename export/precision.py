"""Lower-precision language-model graphs from the float32 export: fp16, bf16, int8, int4.

Per frame the LM reads every weight once and its whole KV ring, for one token: it is memory
bound, so precision is about bytes. The rewrite therefore stores in low precision what is big
and keeps in float32 what is small and sensitive:

    low precision   weight matrices (MatMul B), embedding tables, the KV ring (inputs
                    `past_key_values.*` and the row outputs `present.*`)
    float32         activations between ops, RMSNorm, RoPE, softmax and its mask, residual
                    adds, logits and the in-graph sampling; graph inputs and outputs other than
                    the ring keep their dtypes, so the runtime's host buffers do not change

Each fp16/bf16 product is an island: MatMul(cast(x), W_low) -> cast back to float32. A low
tensor may pass through layout ops (Transpose, Reshape, Slice, Gather of table rows) before it
reaches a MatMul; any other op gets a cast to float32 in front. Activations are one row per
frame, so the casts cost nothing next to the weights.

int8 / int4 are weight-only (symmetric, blockwise, see weight_quant.py), in one of two forms
(fp8, TensorRT only: float8 e4m3 weights with a scale per output channel, like int8 there):

    backend onnx       MatMulNBits (onnxruntime contrib op, CPU and CUDA), float32 activations;
                       accuracy_level 4 lets the CPU kernel use int8 dot products (measured on
                       this 2-core AVX-512 VNNI CPU: int8 with level 0 is 100x slower)
    backend tensorrt   DequantizeLinear on the weight -> MatMul, the form TensorRT's weight-only
                       quantisation parses (int4 needs opset 21 for block_size); the dequantised
                       weight is fp16, inside the same fp16 islands

The KV ring's dtype is a separate choice (`kv_dtype`): onnxruntime on the CPU has no fp16 MatMul
on x86 and wraps one in casts of the whole ring every step (measured: 0.42 ms -> 4.8 ms for one
[16, 3000, 64] score product), so int8/int4 for the onnx backend keep a float32 ring by default;
on a GPU pass kv_dtype="float16" (the manifest records the ring dtype in each RingSpec).

The Mimi codec is not converted: it is compute bound on small convolutions, ~0.4 GB of weights
read per frame in float32 against ~15 GB for the LM, and its nearest-neighbour code choice and
audio are where fp16 rounding would be heard first.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.manifest import GraphEntry, Manifest, sha256_file

from .weight_quant import (block_for, matmulnbits_layout, quantize_blockwise, quantize_fp8,
                           quantize_per_channel)

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int4", "fp8")
Progress = Callable[[str], None]

_ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
              "bfloat16": TensorProto.BFLOAT16}
_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}
# ops that move or select elements without arithmetic: a low-precision tensor passes through
_LAYOUT_OPS = {"Transpose", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Slice", "Gather",
               "Flatten", "Expand"}
_INLINE_LIMIT = 1_800_000_000  # protobuf's 2 GB cap, with room for the graph itself
_EXTERNAL_ALIGN = 4096  # lets a loader map each tensor page-aligned


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
             block_size: int | None = None) -> PrecisionPlan:
    """The layout of `precision` for `backend` ("onnx" or "tensorrt")."""
    if precision not in PRECISIONS:
        raise PersonaPlexError(f"unknown precision {precision!r}; choose one of "
                               f"{', '.join(PRECISIONS)}")
    if backend not in ("onnx", "tensorrt"):
        raise PersonaPlexError(f"unknown backend {backend!r}; use onnx or tensorrt")
    if kv_dtype is not None and kv_dtype not in _ONNX_TYPE:
        raise PersonaPlexError(f"kv_dtype must be one of {', '.join(_ONNX_TYPE)}, "
                               f"got {kv_dtype!r}")
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
    return PrecisionPlan(precision, "float16", kv_dtype or "float32", bits, "matmulnbits",
                         block_size or (32 if bits == 4 else 128))


# ---- graph editing -------------------------------------------------------------------------------

class _Graph:
    """A loaded graph (its weights left on disk) with the few edits the passes need.

    New weights are lazy: `put_lazy` records a placeholder (name, type, shape) and a function
    that makes the array; nothing is computed until the graph is saved, one tensor at a time,
    each written before the next is made. Converting the 7B LM therefore holds one weight in
    memory, not the model."""

    def __init__(self, path: Path):
        self.path = path
        self.model = onnx.load(str(path), load_external_data=False)
        self.graph = self.model.graph
        self.inits = {t.name: t for t in self.graph.initializer}
        self.lazy: dict[str, Callable[[], np.ndarray]] = {}
        self.external = any(t.data_location == TensorProto.EXTERNAL for t in self.inits.values())
        self._taken = {n for node in self.graph.node for n in (*node.input, *node.output)}
        self._taken |= set(self.inits) | {v.name for v in self.graph.input}

    def array(self, name: str) -> np.ndarray:
        """The initializer's values (a lazy one is made now)."""
        if name in self.lazy:
            return self.lazy[name]()
        return numpy_helper.to_array(self.inits[name], base_dir=str(self.path.parent))

    def loader(self, name: str) -> Callable[[], np.ndarray]:
        """A function giving the initializer's values as they are now (for chaining)."""
        if name in self.lazy:
            return self.lazy[name]
        tensor, base = self.inits[name], str(self.path.parent)
        # bound to this proto: `name` may be replaced (by its converted self) before it runs
        return lambda: numpy_helper.to_array(tensor, base_dir=base)

    def put(self, tensor: TensorProto) -> None:
        """Adds or replaces an initializer."""
        if tensor.name in self.inits:
            self.graph.initializer.remove(self.inits[tensor.name])
        self.graph.initializer.append(tensor)
        self.inits[tensor.name] = tensor
        self.lazy.pop(tensor.name, None)
        self._taken.add(tensor.name)

    def put_lazy(self, name: str, data_type: int, dims, make: Callable[[], np.ndarray]) -> None:
        """An initializer whose values `make()` gives when the graph is written; `make` must
        return an array that numpy_helper.from_array stores as `data_type`."""
        placeholder = TensorProto(name=name, data_type=data_type, dims=[int(d) for d in dims])
        self.put(placeholder)
        self.lazy[name] = make

    def materialize(self, name: str) -> TensorProto:
        tensor = numpy_helper.from_array(np.ascontiguousarray(self.lazy[name]()), name)
        want = self.inits[name]
        if tensor.data_type != want.data_type or list(tensor.dims) != list(want.dims):
            raise AssertionError(f"{name}: made {tensor.data_type} {list(tensor.dims)}, "
                                 f"declared {want.data_type} {list(want.dims)}")
        return tensor

    def drop_unused(self) -> None:
        used = {n for node in self.graph.node for n in node.input}
        used |= {o.name for o in self.graph.output}
        for name in [n for n in self.inits if n not in used]:
            self.graph.initializer.remove(self.inits.pop(name))
            self.lazy.pop(name, None)

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self._taken:
            i += 1
            name = f"{base}_{i}"
        self._taken.add(name)
        return name


class _Shared:
    """One computation feeding several lazy tensors (a quantised weight and its scales): made
    on the first call, dropped after the last of `uses` calls."""

    def __init__(self, make: Callable[[], object], uses: int):
        self.make, self.uses, self.value = make, uses, None

    def get(self):
        if self.value is None:
            self.value = self.make()
        result = self.value
        self.uses -= 1
        if self.uses == 0:
            self.value = None
        return result


def _matrix(t: TensorProto) -> bool:
    """Two or more axes longer than one: a weight or a table, not a gain or a frequency vector."""
    return t.data_type in _FLOAT_TYPES and sum(d > 1 for d in t.dims) >= 2


def _as(array: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values stored as `dtype` (bfloat16 through ml_dtypes, which onnx understands)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return array.astype(ml_dtypes.bfloat16)
    return array.astype(np.dtype(dtype))


def fold_weight_transposes(g: _Graph) -> int:
    """Transpose(W) feeding a MatMul, as the exporter writes nn.Linear, -> one initializer W^T
    [K, N]. Quantisers and TensorRT's weight-only path need the weight itself as the MatMul's
    B input. Returns how many were folded."""
    keep, folded = [], 0
    renames: dict[str, str] = {}
    for node in g.graph.node:
        w = node.input[0] if node.op_type == "Transpose" else None
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
        if w in g.inits and len(g.inits[w].dims) == 2 and perm == [1, 0]:
            name = g.fresh(f"{w}.T")
            source = g.loader(w)
            g.put_lazy(name, g.inits[w].data_type, list(g.inits[w].dims)[::-1],
                       lambda source=source: np.ascontiguousarray(source().T))
            renames[node.output[0]] = name
            folded += 1
            continue
        keep.append(node)
    for node in keep:
        for i, n in enumerate(node.input):
            if n in renames:
                node.input[i] = renames[n]
    del g.graph.node[:]
    g.graph.node.extend(keep)
    g.drop_unused()
    return folded


def _is_linear(g: _Graph, node: onnx.NodeProto) -> bool:
    """A MatMul whose B is a float32 weight matrix."""
    w = node.input[1] if node.op_type == "MatMul" else None
    return (w in g.inits and len(g.inits[w].dims) == 2
            and g.inits[w].data_type == TensorProto.FLOAT)


def quantize_linears(g: _Graph, plan: PrecisionPlan) -> int:
    """Replaces every float32 linear weight by its int8/int4/fp8 form (module docstring); the
    numbers are made when the graph is written."""
    import ml_dtypes

    low = _ONNX_TYPE[plan.compute]
    nodes, count = [], 0
    for node in list(g.graph.node):
        if not _is_linear(g, node):
            nodes.append(node)
            continue
        a, w = node.input
        k, n = (int(d) for d in g.inits[w].dims)  # [K, N]
        block = block_for(k, plan.block_size) if plan.block_size else 0
        source = g.loader(w)
        q_name, s_name = g.fresh(f"{w}.q{plan.bits}"), g.fresh(f"{w}.scales")
        if plan.weight_format == "matmulnbits":
            n_blocks = -(-k // block)
            shared = _Shared(lambda source=source, block=block: matmulnbits_layout(
                quantize_blockwise(source(), plan.bits, block)), uses=2)
            g.put_lazy(q_name, TensorProto.UINT8, [n, n_blocks, block * plan.bits // 8],
                       lambda shared=shared: shared.get()[0])  # [N, n_blocks, blob]
            g.put_lazy(s_name, TensorProto.FLOAT, [n * n_blocks],
                       lambda shared=shared: shared.get()[1].reshape(-1))  # [N * n_blocks]
            nodes.append(helper.make_node(
                "MatMulNBits", [a, q_name, s_name], list(node.output), name=node.name,
                domain="com.microsoft", K=k, N=n, bits=plan.bits, block_size=block,
                accuracy_level=plan.accuracy_level))
            count += 1
            continue
        # DequantizeLinear forms: the integer (or fp8) weight [K, N] and its low-type scales
        if plan.precision == "fp8":
            shared = _Shared(lambda source=source: quantize_fp8(source()), uses=2)
            q_type, s_dims, attrs = TensorProto.FLOAT8E4M3FN, [n], {"axis": 1}
            q_make = (lambda shared=shared: shared.get()[0])
        elif plan.bits == 4:
            shared = _Shared(lambda source=source, block=block, k=k: (
                lambda bq: (bq.q[:k].astype(ml_dtypes.int4), bq.scales))(
                    quantize_blockwise(source(), 4, block)), uses=2)
            q_type, s_dims = TensorProto.INT4, [-(-k // block), n]
            attrs = {"axis": 0, "block_size": block}
            q_make = (lambda shared=shared: shared.get()[0])
        else:
            shared = _Shared(lambda source=source: quantize_per_channel(source(), 8), uses=2)
            q_type, s_dims, attrs = TensorProto.INT8, [n], {"axis": 1}
            q_make = (lambda shared=shared: shared.get()[0])
        g.put_lazy(q_name, q_type, [k, n], q_make)
        g.put_lazy(s_name, low, s_dims,
                   lambda shared=shared: _as(shared.get()[1], plan.compute))
        deq = g.fresh(f"{w}.dequantized")
        nodes.append(helper.make_node("DequantizeLinear", [q_name, s_name], [deq],
                                      name=g.fresh(f"{node.name}/dequantize"), **attrs))
        nodes.append(helper.make_node("MatMul", [a, deq], list(node.output), name=node.name))
        count += 1
    del g.graph.node[:]
    g.graph.node.extend(nodes)
    g.drop_unused()
    return count


def lower_precision(g: _Graph, low: str, ring_inputs: Iterable[str],
                    ring_outputs: Iterable[str], kv_dtype: str) -> None:
    """Stores float matrices in `low`, types the ring as `kv_dtype`, and inserts the casts that
    keep everything else float32 (see the module docstring)."""
    low_type, kv_type = _ONNX_TYPE[low], _ONNX_TYPE[kv_dtype]
    ring_inputs, ring_outputs = set(ring_inputs), set(ring_outputs)
    dtype_of: dict[str, int] = {}  # tensors held in a non-float32 float type, and which
    for name, t in list(g.inits.items()):
        if _matrix(t) and t.data_type == TensorProto.FLOAT and low_type != TensorProto.FLOAT:
            source = g.loader(name)
            g.put_lazy(name, low_type, list(t.dims),
                       lambda source=source: _as(source(), low))
            dtype_of[name] = low_type
        elif t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
            dtype_of[name] = t.data_type  # e.g. the scales of dequantised weights
    for v in g.graph.input:
        if v.name in ring_inputs and kv_type != TensorProto.FLOAT:
            v.type.tensor_type.elem_type = kv_type
            dtype_of[v.name] = kv_type

    nodes: list[onnx.NodeProto] = []
    casts: dict[tuple[str, int], str] = {}  # (tensor, type) -> its cast (one per tensor)

    def cast(src: str, to: int, base: str) -> str:
        if (src, to) not in casts:
            out = g.fresh(base)
            nodes.append(helper.make_node("Cast", [src], [out], to=to,
                                          name=g.fresh(f"/cast/{out}")))
            casts[src, to] = out
        return casts[src, to]

    def as_float(name: str) -> str:
        return cast(name, TensorProto.FLOAT, f"{name}.f32")

    for node in list(g.graph.node):
        if node.op_type == "DequantizeLinear" and dtype_of.get(node.input[1]):
            nodes.append(node)  # its output takes the type of its (low) scale
            dtype_of[node.output[0]] = dtype_of[node.input[1]]
            continue
        lows = [i for i, n in enumerate(node.input) if n in dtype_of]
        if not lows:
            nodes.append(node)
        elif node.op_type in _LAYOUT_OPS and lows == [0]:
            nodes.append(node)  # pure data movement: the output stays low
            for o in node.output:
                dtype_of[o] = dtype_of[node.input[0]]
        elif node.op_type == "MatMul":
            # the product in the low type of its stored operand; inputs cast to it, the result
            # cast back to float32 for whatever follows
            t = dtype_of[node.input[lows[0]]]
            for i, n in enumerate(node.input):
                if n not in dtype_of:
                    node.input[i] = cast(n, t, f"{n}.low")
                elif dtype_of[n] != t:
                    node.input[i] = cast(as_float(n), t, f"{n}.low")
            out = node.output[0]
            node.output[0] = g.fresh(f"{out}.low")
            nodes.append(node)
            nodes.append(helper.make_node("Cast", [node.output[0]], [out],
                                          to=TensorProto.FLOAT, name=g.fresh(f"/cast/{out}")))
        else:
            for i in lows:
                node.input[i] = as_float(node.input[i])
            nodes.append(node)

    # graph outputs: ring rows in kv_dtype, everything else float32 as before
    for out in g.graph.output:
        have = dtype_of.get(out.name, out.type.tensor_type.elem_type)
        want = kv_type if out.name in ring_outputs else out.type.tensor_type.elem_type
        if have == want:
            continue
        inner = g.fresh(f"{out.name}.inner")
        for node in nodes:
            node.output[:] = [inner if o == out.name else o for o in node.output]
            node.input[:] = [inner if i == out.name else i for i in node.input]
        nodes.append(helper.make_node("Cast", [inner], [out.name], to=want,
                                      name=g.fresh(f"/cast/{out.name}")))
        out.type.tensor_type.elem_type = want
    del g.graph.node[:]
    g.graph.node.extend(nodes)
    del g.graph.value_info[:]  # intermediate types changed; nothing downstream needs them


# ---- writing -------------------------------------------------------------------------------------

def _tensor_bytes(g: _Graph, t: TensorProto) -> bytes:
    """An initializer's raw bytes: made now if lazy, else read from the source graph."""
    if t.name in g.lazy:
        return g.materialize(t.name).raw_data
    if t.data_location == TensorProto.EXTERNAL:
        t = TensorProto.FromString(t.SerializeToString())
        onnx.external_data_helper.load_external_data_for_tensor(t, str(g.path.parent))
    return t.raw_data if t.HasField("raw_data") else numpy_helper.from_array(
        numpy_helper.to_array(t), t.name).raw_data


def save_graph(g: _Graph, path: Path, data_name: str) -> list[str]:
    """Writes the graph to `path`; weights inline when they fit in one protobuf, else in the
    file `data_name` beside it, made and written one at a time. Returns the external data
    files written (names)."""
    total = sum(int(np.prod(t.dims, dtype=np.int64)) * 4 for t in g.inits.values())
    if not g.external and total < _INLINE_LIMIT:
        for t in g.graph.initializer:
            if t.name in g.lazy:
                t.CopyFrom(g.materialize(t.name))
        onnx.save_model(g.model, str(path))
        return []
    tmp = path.parent / f".{data_name}.partial"
    with open(tmp, "wb") as f:
        for t in g.graph.initializer:
            raw = _tensor_bytes(g, t)
            if len(raw) < 1024 and t.data_location != TensorProto.EXTERNAL:
                t.raw_data = raw  # small constants stay inline
                continue
            f.seek(-f.tell() % _EXTERNAL_ALIGN, os.SEEK_CUR)
            offset = f.tell()
            f.write(raw)
            length = len(raw)
            del raw
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                          "uint64_data"):
                t.ClearField(field)
            del t.external_data[:]
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)),
                               ("length", str(length))):
                t.external_data.add(key=key, value=value)
    onnx.save_model(g.model, str(path))
    os.replace(tmp, path.parent / data_name)
    return [data_name]


def _external_files(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return {e.value for t in model.graph.initializer for e in t.external_data
            if e.key == "location"}


# ---- one graph, one model directory --------------------------------------------------------------

def convert_graph(src: Path, dst: Path, entry: GraphEntry, plan: PrecisionPlan) -> GraphEntry:
    """Writes the `plan` version of graph `src` to `dst` (may be the same path) and returns its
    manifest entry (new sha256s, ring dtypes)."""
    g = _Graph(src)
    old_files = _external_files(src) if g.external else set()
    if plan.weight_format == "qdq":
        # DequantizeLinear with fp16 scales (opset 19) and block_size (21). Converted first,
        # while the weights are still references to files: the converter serialises the model.
        _raise_opset(g, 21)
    fold_weight_transposes(g)
    if plan.bits is not None:
        quantize_linears(g, plan)
        if plan.weight_format == "matmulnbits":
            _add_opset(g, "com.microsoft", 1)
    ring_in = [r.input_name for r in entry.rings]
    ring_out = [r.output_name for r in entry.rings]
    lower_precision(g, plan.compute, ring_in, ring_out, plan.kv_dtype)
    tmp = dst.parent / f".{dst.name}.partial"
    written = save_graph(g, tmp, f"{dst.name}.data")
    onnx.checker.check_model(str(tmp))
    os.replace(tmp, dst)
    if src.resolve() == dst.resolve():  # in place: the float32 weights' files are now unused
        for stale in old_files - set(written):
            (src.parent / stale).unlink(missing_ok=True)
    data_files = {name: sha256_file(dst.parent / name) for name in written}
    rings = [dataclasses.replace(r, dtype=plan.kv_dtype) for r in entry.rings]
    return dataclasses.replace(entry, file=dst.name, sha256=sha256_file(dst),
                               data_files=data_files, rings=rings, precision=plan.precision)


def _raise_opset(g: _Graph, version: int) -> None:
    from onnx import version_converter

    current = next(o.version for o in g.model.opset_import if o.domain in ("", "ai.onnx"))
    if current >= version:
        return
    model = version_converter.convert_version(g.model, version)
    g.model.CopyFrom(model)
    g.graph = g.model.graph
    g.inits = {t.name: t for t in g.graph.initializer}


def _add_opset(g: _Graph, domain: str, version: int) -> None:
    if not any(o.domain == domain for o in g.model.opset_import):
        g.model.opset_import.append(helper.make_opsetid(domain, version))


def lm_plans(precision: str, backend: str = "onnx", kv_dtype: str | None = None,
             block_size: int | None = None,
             depformer_precision: str | None = None) -> dict[str, PrecisionPlan]:
    """The plan of each LM graph. The depformer may take its own precision: it is ~9% of the
    7B's bytes per frame and makes every audio token, so an int4 Helium with an int8 or fp16
    depformer costs little and keeps the audio closer (bench_precision.py measures it). It has
    no KV ring."""
    return {"helium_step": plan_for(precision, backend, kv_dtype, block_size),
            "depformer_step": plan_for(depformer_precision or precision, backend, None,
                                       block_size)}


def _rewrites(plan: PrecisionPlan) -> bool:
    return plan.precision != "fp32" or plan.kv_dtype != "float32"


def _convert_lm(src: Path, dst: Path, manifest: Manifest, plans: dict[str, PrecisionPlan],
                progress: Progress) -> dict[str, GraphEntry]:
    """Converts the LM graphs of `src` into `dst` (the same directory: in place); returns all
    graph entries, the converted ones updated."""
    graphs = dict(manifest.graphs)
    for name, plan in plans.items():
        if name not in graphs or not _rewrites(plan):
            continue
        before = _dir_bytes(src, graphs[name])
        graphs[name] = convert_graph(src / graphs[name].file, dst / graphs[name].file,
                                     graphs[name], plan)
        after = _dir_bytes(dst, graphs[name])
        progress(f"  {graphs[name].file}: {plan.precision}"
                 + (f" ({plan.weight_format}, {plan.bits}-bit, block {plan.block_size})"
                    if plan.bits else "")
                 + (f", KV {plan.kv_dtype}" if graphs[name].rings else "")
                 + f": {before / 1e6:.0f} -> {after / 1e6:.0f} MB")
    return graphs


def convert_precision(model_dir: str | Path, manifest: Manifest, precision: str,
                      kv_dtype: str | None = None, block_size: int | None = None,
                      progress: Progress = print,
                      depformer_precision: str | None = None) -> Manifest:
    """Rewrites the LM graphs of a float32 model directory (in place; meant for the export's
    staging directory) to `precision` (the depformer to `depformer_precision` when given), for
    the manifest's backend. Returns the manifest to write: graph entries with new sha256s,
    precisions and ring dtypes, `precision` set."""
    model_dir = Path(model_dir)
    if manifest.precision != "fp32":
        raise PersonaPlexError(f"{model_dir} is already {manifest.precision}; convert from a "
                               "float32 export")
    plans = lm_plans(precision, manifest.backend, kv_dtype, block_size, depformer_precision)
    graphs = _convert_lm(model_dir, model_dir, manifest, plans, progress)
    return dataclasses.replace(manifest, graphs=graphs, precision=precision)


def convert_model_dir(src: str | Path, dst: str | Path, precision: str,
                      backend: str = "onnx", kv_dtype: str | None = None,
                      block_size: int | None = None, progress: Progress = print,
                      depformer_precision: str | None = None) -> Manifest:
    """A `precision` copy of the float32 model directory `src` in `dst` (written atomically;
    `src` is left as it is): the codec, tokenizer and voices copied, the LM graphs converted."""
    from personaplex_edge.atomic import staged_dir
    from personaplex_edge.manifest import load_model_dir, write_manifest

    src, dst = Path(src), Path(dst)
    manifest = dataclasses.replace(load_model_dir(src), backend=backend)
    plans = lm_plans(precision, backend, kv_dtype, block_size, depformer_precision)
    with staged_dir(dst) as stage:
        for name, entry in manifest.graphs.items():
            if name not in plans or not _rewrites(plans[name]):
                for f in (entry.file, *entry.data_files):
                    shutil.copy2(src / f, stage / f)
        for f in manifest.files:
            (stage / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / f, stage / f)
        graphs = _convert_lm(src, stage, manifest, plans, progress)
        manifest = dataclasses.replace(manifest, graphs=graphs, precision=precision)
        write_manifest(stage, manifest)
    return manifest


def _dir_bytes(model_dir: Path, entry: GraphEntry) -> int:
    return sum((model_dir / f).stat().st_size for f in (entry.file, *entry.data_files))


def ring_dtypes_agree(model_dir: str | Path, entry: GraphEntry) -> list[str]:
    """Where the graph's ring inputs/outputs disagree with the entry's RingSpecs (empty: none).
    The runtime allocates ring buffers from the manifest, so they must match the graph."""
    model = onnx.load(str(Path(model_dir) / entry.file), load_external_data=False)
    types = {v.name: v.type.tensor_type.elem_type
             for v in (*model.graph.input, *model.graph.output)}
    problems = []
    for r in entry.rings:
        for name in (r.input_name, r.output_name):
            if types.get(name) != _ONNX_TYPE.get(r.dtype):
                problems.append(f"{name}: graph {onnx.TensorProto.DataType.Name(types[name])}, "
                                f"manifest {r.dtype}")
    return problems
