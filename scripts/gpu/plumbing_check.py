"""Stage 1 of the bare GPU check: the CUDA plumbing of runtime/backends on real device memory,
with a stand-in engine whose arithmetic is known exactly.

The stand-in graph ("step", batch 2) has what the real graphs have: a host input, a position
input, ping-pong state (a float accumulator and an int64 step counter), two Helium-like KV
rings (1 row per call at the `position` input: one group, one strided copy) and a Mimi-like
one (2 rows per call at the counter state, mirrored to the host); a second, stateless graph
("head") reads the step's output on the device (`link_input`). Their kernel (`CUDA_SOURCE`,
compiled with cupy) and `step_math` (numpy) compute the same integer-valued float32 sums, exact
in any summation order, so every output, state tensor and ring slot has one right value:

    y       = acc + x + sum(k0) + 2 sum(k1) + 3 sum(m)     (ring sums over heads and slots)
    acc'    = acc + x;   offset' = offset + 2
    rows k0 = x + h + 1;  rows k1 = 2x + position % 7;  rows m = acc + r + 10h + offset % 5
    z       = 2y + bias                                     (head)

The same TrtGraph objects the TensorRT backend uses wrap the stand-in (a duck-typed engine:
TrtGraph needs only tensor shapes and an execution context), so what runs is cuda_runtime
(device buffers, pinned arrays, streams, copies), DeviceRings (grouped and per-row writes),
RingPositions (a position held in state), DeviceStore (state save/restore/reset/hold, ring
prefixes) and CapturedSequence (one CUDA graph per state parity). Checked per call, byte for
byte: the eager pair equals the captured pair equals the numpy reference, which writes its
rings with state.write_ring_rows, the CPU backend's own code. Then device memory is measured
(cudaMemGetInfo) before and after a large instance is made, run, captured and closed.
"""

from __future__ import annotations

import gc

import numpy as np

from personaplex_edge.manifest import GraphEntry, RingSpec, StateSpec, TensorSpec

BATCH = 2
CUDA_SOURCE = r"""
extern "C" __global__ void standin_step(
    const float* x, const long long* position, const float* acc, const long long* offset,
    const float* k0, const float* k1, const float* m,
    float* y, float* acc_out, long long* offset_out,
    float* rows_k0, float* rows_k1, float* rows_m,
    int B, int D, int HK, int TK, int HM, int TM, int RM)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;  // one thread per (b, d)
    if (i >= B * D) return;
    int b = i / D, d = i % D;
    float s0 = 0.f, s1 = 0.f, sm = 0.f;
    for (int h = 0; h < HK; ++h)
        for (int t = 0; t < TK; ++t) {
            long long at = (((long long)b * HK + h) * TK + t) * D + d;
            s0 += k0[at];
            s1 += k1[at];
        }
    for (int h = 0; h < HM; ++h)
        for (int t = 0; t < TM; ++t)
            sm += m[(((long long)b * HM + h) * TM + t) * D + d];
    y[i] = acc[i] + x[i] + s0 + 2.f * s1 + 3.f * sm;
    acc_out[i] = acc[i] + x[i];
    if (d == 0) offset_out[b] = offset[b] + 2;
    for (int h = 0; h < HK; ++h) {
        rows_k0[((long long)b * HK + h) * D + d] = x[i] + (float)(h + 1);
        rows_k1[((long long)b * HK + h) * D + d] = 2.f * x[i] + (float)(position[b] % 7);
    }
    for (int h = 0; h < HM; ++h)
        for (int r = 0; r < RM; ++r)
            rows_m[(((long long)b * HM + h) * RM + r) * D + d] =
                acc[i] + (float)(r + 10 * h + offset[b] % 5);
}

extern "C" __global__ void standin_head(const float* y, const float* bias, float* z,
                                        int B, int D)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < B * D) z[i] = 2.f * y[i] + bias[i / D];
}
"""


class CheckFailed(AssertionError):
    """The device disagreed with the reference (or eager with replay): the message says where."""


# ---- the stand-in graphs ----------------------------------------------------------------------

def entries(width: int = 4, heads: int = 3, slots: int = 6, m_heads: int = 2,
            m_slots: int = 5) -> tuple[GraphEntry, GraphEntry]:
    """(step, head) graph entries; the defaults make rings wrap within a few calls and rows
    too narrow for 256-byte alignment (so DeviceRings pads between the rings of a group)."""
    B, D = BATCH, width
    k = [RingSpec(f"ring.k{i}", f"rows.k{i}", (B, heads, slots, D), "float32")
         for i in range(2)]
    m = RingSpec("ring.m", "rows.m", (B, m_heads, m_slots, D), "float32", position="past.offset",
                 rows=2)
    step = GraphEntry("standin_step", "", [TensorSpec("x", (B, D), "float32"),
                                           TensorSpec("position", (B,), "int64")],
                      [TensorSpec("y", (B, D), "float32")],
                      [StateSpec("acc", (B, D), "float32", 0.0),
                       StateSpec("offset", (B,), "int64", 0.0)], rings=[*k, m])
    head = GraphEntry("standin_head", "", [TensorSpec("y", (B, D), "float32"),
                                           TensorSpec("bias", (B,), "float32")],
                      [TensorSpec("z", (B, D), "float32")])
    return step, head


def step_math(x, position, acc, offset, k0, k1, m, rows_m: int):
    """The step in numpy -> (y, acc', offset', rows k0, rows k1, rows m); x, acc [B, D],
    position, offset [B], rings [B, H, T, D]."""
    f = np.float32
    y = (acc + x + k0.sum((1, 2), dtype=np.float64) + 2 * k1.sum((1, 2), dtype=np.float64)
         + 3 * m.sum((1, 2), dtype=np.float64)).astype(f)
    hk, hm = np.arange(k0.shape[1]), np.arange(m.shape[1])
    r0 = (x[:, None, None, :] + (hk + 1)[None, :, None, None]).astype(f)  # [B, HK, 1, D]
    r1 = (2 * x[:, None, None, :] + (position % 7)[:, None, None, None]
          + 0 * hk[None, :, None, None]).astype(f)
    extra = (np.arange(rows_m)[None, None, :] + 10 * hm[None, :, None]
             + (offset % 5)[:, None, None])  # [B, HM, RM]
    rm = (acc[:, None, None, :] + extra[..., None]).astype(f)  # [B, HM, RM, D]
    return y, (acc + x).astype(f), offset + 2, r0, r1, rm


def head_math(y, bias):
    return (2 * y + bias[:, None]).astype(np.float32)


class Reference:
    """The two graphs on the host, as the CPU backend would run them: state by row, rings
    written with state.write_ring_rows."""

    def __init__(self, step: GraphEntry):
        from personaplex_edge.runtime.backends.state import host_dtype

        self.entry = step
        self.state = {s.name: np.full(s.shape, s.init, host_dtype(s.dtype)) for s in step.state}
        self.rings = {r.input_name: np.zeros(r.shape, np.float32) for r in step.rings}

    def call(self, x, position, bias, active):
        from personaplex_edge.runtime.backends.state import write_ring_rows

        acc, offset = self.state["acc"], self.state["offset"]
        rings = self.rings
        y, acc2, off2, r0, r1, rm = step_math(x, position, acc, offset, rings["ring.k0"],
                                              rings["ring.k1"], rings["ring.m"],
                                              self.entry.rings[2].rows)
        rows = active if active is not None else range(BATCH)
        positions = {"position": position, "past.offset": offset.copy()}
        for spec, new in zip(self.entry.rings, (r0, r1, rm)):
            write_ring_rows(spec, rings[spec.input_name], new, positions[spec.position], rows)
        for b in rows:
            acc[b], offset[b] = acc2[b], off2[b]
        return y, head_math(y, bias)

    def reset(self, rows):
        for s in self.entry.state:
            self.state[s.name][rows] = s.init

    def whole(self) -> dict[str, np.ndarray]:
        return {**self.state, **self.rings}


class _Context:
    """What TrtGraph asks of an execution context; a run launches the kernel at the
    addresses bound at that moment (as TensorRT records them at enqueue)."""

    def __init__(self, kernel):
        self.kernel, self.addresses = kernel, {}

    def set_input_shape(self, name, shape) -> bool:
        return True

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream: int) -> bool:
        self.kernel(stream, dict(self.addresses))
        return True


class _EngineView:
    def __init__(self, entry: GraphEntry, kernel):
        self._shapes = {t.name: t.shape for t in entry.inputs}
        self._kernel = kernel

    def get_tensor_shape(self, name):
        return self._shapes[name]

    def create_execution_context(self):
        return _Context(self._kernel)


class StandInEngine:
    """A loaded graph as TrtGraph sees a TrtEngine: `kernel(stream, addresses)` queues one run
    on the stream, reading and writing the tensors at those device addresses."""

    def __init__(self, entry: GraphEntry, kernel, device: int = 0):
        self.entry, self.device_index = entry, device
        self.engine = _EngineView(entry, kernel)

    def context(self):
        return self.engine.create_execution_context()

    def bind(self, stream=None):
        from personaplex_edge.runtime.backends.trt import TrtGraph

        return TrtGraph(self, stream)


# ---- kernels ------------------------------------------------------------------------------------

def _dims(step: GraphEntry) -> tuple[int, ...]:
    k, m = step.rings[0], step.rings[2]
    return (BATCH, k.shape[3], k.shape[1], k.shape[2], m.shape[1], m.shape[2], m.rows)


class CupyKernels:
    """The stand-in's arithmetic on the GPU (CUDA_SOURCE through cupy), launched on the
    backend's stream so that capture records it."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        self._step = cupy.RawKernel(CUDA_SOURCE, "standin_step")
        self._head = cupy.RawKernel(CUDA_SOURCE, "standin_head")
        for k in (self._step, self._head):  # compiled now, never inside a capture
            if hasattr(k, "compile"):
                k.compile()

    def _launch(self, kernel, stream: int, count: int, args) -> None:
        ptr, i32 = np.uint64, np.int32
        args = tuple(ptr(a) if isinstance(a, _Ptr) else i32(a) for a in args)
        with self.cupy.cuda.ExternalStream(stream):
            kernel(((count + 127) // 128,), (128,), args)

    def step(self, entry: GraphEntry):
        dims = _dims(entry)
        names = ("x", "position", "past.acc", "past.offset", "ring.k0", "ring.k1", "ring.m",
                 "y", "present.acc", "present.offset", "rows.k0", "rows.k1", "rows.m")

        def run(stream, at):
            self._launch(self._step, stream, dims[0] * dims[1],
                         [_Ptr(at[n]) for n in names] + list(dims))
        return run

    def head(self, entry: GraphEntry):
        B, D = entry.inputs[0].shape

        def run(stream, at):
            self._launch(self._head, stream, B * D,
                         [_Ptr(at["y"]), _Ptr(at["bias"]), _Ptr(at["z"]), B, D])
        return run


class _Ptr(int):
    """A device address among a kernel's arguments (passed as 64 bits, not as an int)."""


class NumpyKernels:
    """The same arithmetic on the simulated GPU of tests/fake_gpu.py (host memory): queued on
    its stream, so capture records it and replay reruns it."""

    def __init__(self, cuda):
        self.cuda = cuda

    @staticmethod
    def _view(ptr, shape, dtype):
        import ctypes

        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        raw = (ctypes.c_byte * n).from_address(ptr)
        return np.frombuffer(raw, dtype=dtype).reshape(shape)

    def step(self, entry: GraphEntry):
        shapes = {t.name: (t.shape, t.dtype) for t in entry.inputs + entry.outputs}
        for s in entry.state:
            shapes[s.input_name] = shapes[s.output_name] = (s.shape, s.dtype)
        for r in entry.rings:
            shapes[r.input_name], shapes[r.output_name] = (r.shape, r.dtype), (r.rows_shape,
                                                                               r.dtype)

        def run(stream, at):
            def work():
                v = {n: self._view(at[n], *shapes[n]) for n in shapes}
                out = step_math(v["x"], v["position"], v["past.acc"], v["past.offset"],
                                v["ring.k0"], v["ring.k1"], v["ring.m"], entry.rings[2].rows)
                for name, value in zip(("y", "present.acc", "present.offset", "rows.k0",
                                        "rows.k1", "rows.m"), out):
                    v[name][...] = value
            self.cuda.enqueue(work)
        return run

    def head(self, entry: GraphEntry):
        B, D = entry.inputs[0].shape

        def run(stream, at):
            def work():
                z = head_math(self._view(at["y"], (B, D), np.float32),
                              self._view(at["bias"], (B,), np.float32))
                self._view(at["z"], (B, D), np.float32)[...] = z
            self.cuda.enqueue(work)
        return run


# ---- the checks ---------------------------------------------------------------------------------

def _pair(kernels, step: GraphEntry, head: GraphEntry, stream):
    s = StandInEngine(step, kernels.step(step)).bind(stream)
    h = StandInEngine(head, kernels.head(head)).bind(stream)
    h.link_input("y", s, "y")
    return s, h


def _same(name: str, a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
        where = ""
        if a.shape == b.shape:
            bad = np.argwhere(a != b)
            where = f" first at {bad[0].tolist()}: {a[tuple(bad[0])]} vs {b[tuple(bad[0])]}" \
                if len(bad) else ""
        raise CheckFailed(f"{name}: {what} differ{where}")


def _schedule(calls: int) -> list[list[int] | None]:
    """Rows stepped per call: all rows together first (one copy per ring group), then rows held
    in turn, so that rows sit at different positions (one copy per ring and row)."""
    turns = [[0], None, [1], [0, 1], [1], [0]]
    return [None] * 4 + [turns[i % len(turns)] for i in range(calls - 4)]


def check_plumbing(kernels, calls: int = 30, seed: int = 0) -> dict:
    """Eager vs captured vs reference over `calls` calls (module docstring); raises CheckFailed
    at the first difference. -> figures for the report."""
    from personaplex_edge.runtime.backends.cuda_graphs import CapturedSequence
    from personaplex_edge.runtime.backends.cuda_runtime import Stream

    step, head = entries()
    streams = [Stream(), Stream()]
    eager, captured = (_pair(kernels, step, head, s) for s in streams)
    seq = CapturedSequence(list(captured))
    ref = Reference(step)
    rng = np.random.default_rng(seed)
    position = np.zeros(BATCH, np.int64)  # each row's own position: the calls it took part in
    parities, per_row_calls = set(), 0
    try:
        for call, active in enumerate(_schedule(calls)):
            x = rng.integers(0, 8, (BATCH, step.inputs[0].shape[1])).astype(np.float32)
            bias = rng.integers(0, 8, BATCH).astype(np.float32)
            for s, h in (eager, captured):
                s.inputs["x"][...] = x
                s.inputs["position"][...] = position
                h.inputs["bias"][...] = bias
            parities.add(captured[0]._turn)
            per_row_calls += active is not None or len(set(position.tolist())) > 1
            s, h = eager
            s.enqueue(active=active)
            h.enqueue(active=active)
            s.stream.synchronize()
            s.finish_call(active)
            h.finish_call(active)
            seq.run(active)
            y, z = ref.call(x, position.copy(), bias, active)
            for graphs, label in ((eager, "eager"), (captured, "replay")):
                _same(f"call {call} y", graphs[0].outputs["y"], y, f"{label} and reference")
                _same(f"call {call} z", graphs[1].outputs["z"], z, f"{label} and reference")
            _compare_state(f"call {call}", eager[0], captured[0], ref)
            position[[*(active if active is not None else range(BATCH))]] += 1
            if call == calls // 2:
                _state_round_trips(eager[0], captured[0], ref)
        if parities != {0, 1}:
            raise CheckFailed(f"replay ran on state parities {sorted(parities)} only")
    finally:
        seq.close()
        for g in (*eager, *captured):
            g.close()
        for s in streams:
            s.close()
    return {"detail": f"{calls} calls ({per_row_calls} with rows at their own positions), "
                      "eager == CUDA-graph replay == CPU reference byte for byte, both "
                      "state parities, state save/restore/reset and ring prefixes on device",
            "calls": calls, "per_row_calls": per_row_calls}


def _compare_state(where: str, eager, captured, ref: Reference) -> None:
    want = ref.whole()
    got = [eager.state(), captured.state()]
    for name, value in want.items():
        for label, state in zip(("eager", "replay"), got):
            _same(f"{where} {name}", state[name], value, f"{label} and reference")


def _state_round_trips(eager, captured, ref: Reference) -> None:
    """DeviceStore on real memory: a row saved, reset, restored; a ring prefix read and
    written (through BoundGraph, as a persona cache does), on both graphs and the reference."""
    row = [1]
    for g in (eager, captured):
        saved = g.state(row)
        g.reset(row)
        after = g.state(row)
        for s in g.entry.state:
            if not (after[s.name] == s.init).all():
                raise CheckFailed(f"reset left {s.name} at {after[s.name].ravel()[:4]}")
        g.set_state(saved, row)
    _compare_state("after save/reset/restore", eager, captured, ref)
    n = 3
    prefix = captured.ring_prefix([0], n)
    for name, ring in ref.rings.items():
        _same(f"ring prefix {name}", prefix[name], ring[[0], :, :n], "device and reference")
        ring[0, :, :n] += 1
    changed = {k: v + 1 for k, v in prefix.items()}
    for g in (eager, captured):
        g.set_ring_prefix(changed, [0])
    _compare_state("after set_ring_prefix", eager, captured, ref)
    for g in (eager, captured):
        g.reset([0])
    ref.reset([0])
    _compare_state("after reset", eager, captured, ref)


def check_memory(kernels, tolerance: int = 4 << 20) -> dict:
    """cudaMemGetInfo before, while and after a large stand-in pair exists (rings of
    ~100 MB, run eagerly, captured and replayed): the device memory it took must be back after
    close() (to within `tolerance`), and must have been visible while it existed."""
    from personaplex_edge.runtime.backends.cuda_runtime import call

    def free() -> int:
        gc.collect()
        return int(call("cudaMemGetInfo")[0])

    def cycle(measure):
        from personaplex_edge.runtime.backends.cuda_graphs import CapturedSequence
        from personaplex_edge.runtime.backends.cuda_runtime import Stream

        step, head = entries(width=128, heads=8, slots=4096, m_heads=2, m_slots=4096)
        stream = Stream()
        s, h = _pair(kernels, step, head, stream)
        seq = CapturedSequence([s, h])
        for _ in range(3):
            seq.run()
        s.run()
        held = s.rings.nbytes + sum(b.nbytes for st in s._state for b in st.values())
        during = measure()
        seq.close()
        for g in (s, h):
            g.close()
        stream.close()
        del s, h, seq
        return held, during

    cycle(free)  # first: module loading, graph machinery, allocator pools settle
    before = free()
    held, during = cycle(free)
    after = free()
    taken = before - during
    if taken < 0.9 * held:
        raise CheckFailed(f"cudaMemGetInfo saw {taken / 2**20:.1f} MiB taken while the graphs "
                          f"held {held / 2**20:.1f} MiB: the measurement sees nothing")
    if abs(before - after) > tolerance:
        raise CheckFailed(f"{(before - after) / 2**20:.1f} MiB of device memory not freed "
                          f"by close() (held {held / 2**20:.1f} MiB)")
    return {"detail": f"{held / 2**20:.0f} MiB held, {taken / 2**20:.0f} MiB seen taken, "
                      f"{(before - after) / 2**20:+.2f} MiB left after close",
            "held_mib": held / 2**20, "taken_mib": taken / 2**20,
            "left_mib": (before - after) / 2**20}
