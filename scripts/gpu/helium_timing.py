"""Stage 4 of the bare GPU check: one 7B-shaped Helium step (the real config: 32 layers of
d 4096, context 3000) in float16 on the GPU, captured as a CUDA graph and replayed, timed
against the bandwidth floor of the bytes it must read.

The module is the export's own (export/helium.Helium, the code the ONNX graph is traced from)
with random weights stored in float16, run under autocast (matmuls in float16, RMSNorm and the
softmax in float32, as the converted graphs run them), one frame at a time with its full KV
ring passed in. What a step must read: every linear weight once (attention, MLP, the text head)
and the whole ring (the mask hides slots, it does not skip them); the embedding rows of a frame
are a few KB. The floor is those bytes over the device's nominal bandwidth, and over the
bandwidth a plain device-to-device copy reaches on it (what any kernel can hope for).
"""

from __future__ import annotations

import contextlib
import time

import torch


def build(cfg, device: str, dtype: torch.dtype):
    """(Helium with random weights in `dtype` on `device`, its KV ring [B=1, H, T, Dh] each)."""
    from personaplex_edge.export.helium import Helium

    with torch.device("meta"):
        model = Helium(cfg)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.fill_(1.0)
            else:  # scaled so activations stay O(1) through the layers
                fan_in = p.shape[-1]
                p.normal_(0.0, fan_in ** -0.5, generator=g)
    model.make_buffers()
    model = model.to(device=device, dtype=dtype)
    model.freqs = model.freqs.float().to(device)
    model.table_offsets = model.table_offsets.to(device)
    shape = model.kv_shape(1)  # [1, H, T, Dh]
    ring = [torch.randn(shape, generator=g, device=device).to(dtype)
            for _ in range(2 * model.num_layers)]
    return model.eval(), ring


def bytes_read(model, ring) -> int:
    """Bytes one step reads: the linears' weights and the whole ring."""
    linears = sum(m.weight.numel() * m.weight.element_size()
                  for m in model.modules() if isinstance(m, torch.nn.Linear))
    return linears + sum(t.numel() * t.element_size() for t in ring)


def copy_bandwidth(device: str, nbytes: int = 2 << 30, repeats: int = 10) -> float:
    """GB/s of a device-to-device copy of `nbytes` (read + write counted)."""
    a = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        b.copy_(a)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / repeats
    del a, b
    return 2 * nbytes / seconds / 1e9


def time_step(cfg, device: str = "cuda", dtype: torch.dtype = torch.float16,
              iters: int = 50, graph: bool = True) -> dict:
    """Eager and (with `graph`) CUDA-graph replay time of one frame's step -> figures."""
    model, ring = build(cfg, device, dtype)
    h = cfg.temporal_config
    tokens = torch.zeros((1, 1, 17), dtype=torch.int64, device=device)  # [B, F, 17]
    extra = torch.zeros((1, 1, h.hidden_size), dtype=dtype, device=device)  # [B, F, D]
    position = torch.full((1,), 2000, dtype=torch.int64, device=device)  # [B]: a full ring
    noise = torch.zeros((1, cfg.text_vocab_size), dtype=torch.float32, device=device)
    temperature = torch.ones((1,), dtype=torch.float32, device=device)
    top_k = torch.zeros((1,), dtype=torch.int64, device=device)
    on_gpu = device.startswith("cuda")
    autocast = contextlib.nullcontext() if dtype == torch.float32 else torch.autocast(
        device_type="cuda" if on_gpu else "cpu", dtype=dtype, cache_enabled=False)

    def step():
        with torch.no_grad(), autocast, torch.device(device):
            return model.step(tokens, extra, position, noise, temperature, top_k, *ring)

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    out = step()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        out = step()
    sync()
    eager_ms = 1000 * (time.perf_counter() - t0) / iters
    figures = {"eager_ms": eager_ms, "bytes_per_step": bytes_read(model, ring),
               "hidden_finite": bool(torch.isfinite(out[1]).all()),
               "layers": model.num_layers, "hidden_size": h.hidden_size,
               "context": model.context}
    if graph and on_gpu:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up on a side stream, as capture requires
                step()
        torch.cuda.current_stream().wait_stream(side)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            captured = step()
        cuda_graph.replay()
        sync()
        same = bool(torch.equal(captured[0], out[0]))  # the same step, the same text token
        t0 = time.perf_counter()
        for _ in range(iters):
            cuda_graph.replay()
        sync()
        figures.update(graph_ms=1000 * (time.perf_counter() - t0) / iters,
                       replay_token_equals_eager=same)
        del cuda_graph
    figures["text_token"] = int(out[0].reshape(-1)[0])
    del model, ring
    return figures


def check(device: str = "cuda", iters: int = 50) -> dict:
    """The 7B-shaped fp16 step against its floors (module docstring) -> figures for the report."""
    from personaplex_edge.config import PersonaPlexConfig
    from frame_bytes import DEVICES

    f = time_step(PersonaPlexConfig(), device, torch.float16, iters)
    name = torch.cuda.get_device_name(0)
    nominal = next((bw for key, bw in DEVICES.items() if key in name), None)
    copy = copy_bandwidth(device)
    gb = f["bytes_per_step"] / 1e9
    best = f.get("graph_ms", f["eager_ms"])
    f.update(device=name, copy_gb_per_s=copy, nominal_gb_per_s=nominal,
             floor_copy_ms=1000 * gb / copy,
             floor_nominal_ms=None if nominal is None else 1000 * gb / nominal,
             achieved_gb_per_s=gb / (best / 1000))
    floors = f"floor {f['floor_copy_ms']:.2f} ms at the copy's {copy:.0f} GB/s"
    if nominal:
        floors += f", {f['floor_nominal_ms']:.2f} ms at the nominal {nominal:.0f} GB/s"
    f["detail"] = (f"{gb:.2f} GB per step; eager {f['eager_ms']:.2f} ms, CUDA graph "
                   f"{f.get('graph_ms', float('nan')):.2f} ms ({f['achieved_gb_per_s']:.0f} "
                   f"GB/s achieved); {floors}; replay token == eager: "
                   f"{f.get('replay_token_equals_eager')}")
    if not f["hidden_finite"]:
        raise AssertionError("the 7B-shaped fp16 step's hidden state is not finite")
    return f
