"""Peak memory and time of the memory-frugal LM export, at PersonaPlex-7B's full width.

For each temporal layer count, a synthetic checkpoint in the published layout (d 4096, text vocab
32000/32001, the real 16-step depformer, bf16, the real key names) is written by one process and
exported by another, whose peak resident size (VmHWM) is the number reported: graph tracing,
weight writing and the onnxruntime-vs-torch check included. The 7B's 32 layers follow the same
per-layer cost; the target is peak RSS <= 1.3 x written weight bytes + 1 GB.

    python benchmarks/bench_export_memory.py                  # layers 2 3 4, width 4096
    python benchmarks/bench_export_memory.py --width 1024 --layers 2 --no-verify

Needs ~10 GB of RAM and ~15 GB of disk at the defaults (under --workdir, removed afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import json, os, sys, time
os.environ.setdefault("NO_TORCH_COMPILE", "1")
from personaplex_edge.config import PersonaPlexConfig
cfg = PersonaPlexConfig.from_dict(json.loads(sys.argv[2]))
if sys.argv[1] == "write":
    from safetensors.torch import save_file
    from personaplex_edge.export.synthetic import random_lm_tensors
    save_file(random_lm_tensors(cfg), sys.argv[3])
    sys.exit(0)
from personaplex_edge.export.lm import export_lm_graphs_frugal
def rss():
    # VmHWM: this address space's own peak (ru_maxrss would include the forking parent's)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
base = rss()
t0 = time.perf_counter()
export_lm_graphs_frugal(cfg, sys.argv[3], sys.argv[4], verify=sys.argv[5] == "1",
                        progress=lambda s: print(s, file=sys.stderr, flush=True))
print(json.dumps({"seconds": time.perf_counter() - t0, "peak_rss": rss(), "base_rss": base}))
"""


def config_dict(width: int, layers: int) -> dict:
    """PersonaPlex-7B's config with `layers` temporal layers; width scales Helium only (heads
    of 128 as in the 7B, the same MLP ratio); the depformer is always the real one."""
    heads = max(1, width // 128)
    return {"temporal_config": {"hidden_size": width, "num_hidden_layers": layers,
                       "num_attention_heads": heads, "intermediate_size": width * 11 // 4}}


def run_one(width: int, layers: int, workdir: Path, verify: bool) -> dict:
    cfg = json.dumps(config_dict(width, layers))
    ckpt, out = workdir / f"model_{layers}.safetensors", workdir / f"out_{layers}"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", _CHILD, "write", cfg, str(ckpt)], check=True)
    t_write = time.perf_counter() - t0
    proc = subprocess.run([sys.executable, "-c", _CHILD, "export", cfg, str(ckpt), str(out),
                           "1" if verify else "0"], check=True, capture_output=True, text=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["written"] = sum(p.stat().st_size for p in out.glob("*.onnx.data"))
    result["checkpoint"] = ckpt.stat().st_size
    result["layers"], result["synth_seconds"] = layers, t_write
    shutil.rmtree(out)
    ckpt.unlink()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, nargs="+", default=[2, 3, 4])
    p.add_argument("--workdir", default=None, help="where checkpoints and exports go (temp)")
    p.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check")
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench_export_", dir=args.workdir))
    gb = 1e9
    print(f"width {args.width}, real depformer, bf16 checkpoint -> float32 external data; "
          f"check {'off' if args.no_verify else 'on'}; {os.cpu_count()} cpus")
    print(f"{'layers':>6} {'ckpt GB':>8} {'written GB':>10} {'peak RSS GB':>11} "
          f"{'bound GB':>8} {'RSS/written':>11} {'export s':>8} {'ok':>3}")
    rows = []
    try:
        for layers in args.layers:
            r = run_one(args.width, layers, workdir, not args.no_verify)
            bound = 1.3 * r["written"] + 1 * gb
            r["bound"] = bound
            rows.append(r)
            print(f"{layers:>6} {r['checkpoint'] / gb:>8.2f} {r['written'] / gb:>10.2f} "
                  f"{r['peak_rss'] / gb:>11.2f} {bound / gb:>8.2f} "
                  f"{r['peak_rss'] / r['written']:>11.2f} {r['seconds']:>8.1f} "
                  f"{'yes' if r['peak_rss'] <= bound else 'NO':>3}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if len(rows) >= 2:
        (a, b) = rows[0], rows[-1]
        per_layer = (b["seconds"] - a["seconds"]) / (b["layers"] - a["layers"])
        fixed = a["seconds"] - per_layer * a["layers"]
        print(f"time ~ {fixed:.1f} s + {per_layer:.1f} s/layer (fit through {a['layers']} and "
              f"{b['layers']} layers); 32 layers -> ~{fixed + 32 * per_layer:.0f} s here")
    print(f"python + torch + onnxruntime baseline RSS: {rows[0]['base_rss'] / gb:.2f} GB")


if __name__ == "__main__":
    main()
