"""A model directory whose graphs travel without their weights, the weights made again where
they run: how a 7B-shaped export (15.7 GB of fp16) reaches an offline GPU machine that files
reach only in small transfers, for a timing.

    here (onnx):   python scripts/gpu/skeleton.py make MODEL_DIR SKELETON [--graphs helium_step,depformer_step]
    there (numpy): python scripts/gpu/skeleton.py fill SKELETON OUT [--seed 0]

`make` keeps each graph's .onnx file (the graph and its small inline tensors, a few MB) and
describes its external data file as regions, one per initializer stored there:

    float, at least KEEP_BYTES   made again: the mean and standard deviation measured on the
                                 original (a norm gain of ones stays ones; a layer N(0, 1/fan_in))
    anything else                its exact bytes, kept in SKELETON/kept.bin

`fill` writes each data file at its original size with every region at its original offset
(the .onnx files point there), the made values cut from one pool of standard normals per
(dtype, mean, std), so filling costs little more than the write and its sha256; then a
manifest whose data-file hashes are the new files' (the .onnx hashes do not change). Random
weights of the right shape, layout and scale are what a timing needs: a timing of a 7B step
does not depend on what the weights say.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_stages import use_source_tree  # noqa: E402

use_source_tree()

RECORD = "skeleton.json"
KEPT = "kept.bin"
KEEP_BYTES = 1 << 16  # smaller tensors travel as they are
POOL = 1 << 24  # elements of a pool of standard normals
MAX_POOLS = 16  # made pools kept at once (32-64 MB each)
SAMPLE = 1 << 20  # elements read of a tensor to measure its mean and spread
FLOATS = {"float32": np.float32, "float16": np.float16, "bfloat16": None}  # bf16: bit-rounded


def _say(msg: str) -> None:
    print(f"[skeleton] {msg}", flush=True)


# ---- here: the graphs and a description of their data ----------------------------------------

def _regions(graph_path: Path, data_dir: Path, kept, kept_at: int,
             keep_bytes: int) -> tuple[dict, int]:
    """{data file: {"size", "regions": [...]}} for one graph's external initializers; small
    and non-float ones are appended to `kept` (a binary file) from offset `kept_at`."""
    import onnx

    model = onnx.load(str(graph_path), load_external_data=False)
    files: dict[str, dict] = {}
    for init in model.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        where = {e.key: e.value for e in init.external_data}
        name, offset = where["location"], int(where.get("offset", 0))
        length = int(where["length"])
        dtype = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
                 onnx.TensorProto.BFLOAT16: "bfloat16"}.get(init.data_type)
        entry = files.setdefault(name, {"size": (data_dir / name).stat().st_size,
                                        "regions": []})
        with open(data_dir / name, "rb") as f:
            f.seek(offset)
            if dtype in FLOATS and length >= keep_bytes:
                itemsize = 2 if dtype != "float32" else 4
                raw = np.frombuffer(f.read(min(length, SAMPLE * itemsize)),
                                    np.uint16 if itemsize == 2 else np.float32)
                values = _as_float32(raw, dtype)
                entry["regions"].append({"offset": offset, "length": length, "dtype": dtype,
                                         "mean": float(values.mean()),
                                         "std": float(values.std())})
            else:
                kept.write(f.read(length))
                entry["regions"].append({"offset": offset, "length": length, "kept": kept_at})
                kept_at += length
    return files, kept_at


def _as_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    from personaplex_edge.voices import bf16_bits_to_float32

    if dtype == "float16":
        return raw.view(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return bf16_bits_to_float32(raw)
    return raw


def make(model_dir: Path, out: Path, graphs: list[str], keep_bytes: int = KEEP_BYTES) -> Path:
    """The skeleton of `graphs` of `model_dir` in `out` (replaced); float tensors of at least
    `keep_bytes` are made again there."""
    import dataclasses
    import shutil

    from personaplex_edge.manifest import MANIFEST, load_model_dir, write_manifest

    manifest = load_model_dir(model_dir, need="lm", progress=_say)
    missing = [g for g in graphs if g not in manifest.graphs]
    if missing:
        raise SystemExit(f"{model_dir} has no graph {', '.join(missing)}")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    record = {"source": str(model_dir), "graphs": graphs, "data_files": {}}
    kept_at = 0
    with open(out / KEPT, "wb") as kept:
        for name in graphs:
            entry = manifest.graphs[name]
            shutil.copy2(model_dir / entry.file, out / entry.file)
            files, kept_at = _regions(model_dir / entry.file, model_dir, kept, kept_at,
                                      keep_bytes)
            if set(files) != set(entry.data_files):
                raise SystemExit(f"{entry.file}: its initializers name {sorted(files)}, the "
                                 f"manifest {sorted(entry.data_files)}")
            record["data_files"].update(files)
    (out / RECORD).write_text(json.dumps(record, indent=1))
    # the LM alone, without the tokenizer and voices: what a timing of its graphs opens
    lm = dataclasses.replace(manifest, graphs={g: manifest.graphs[g] for g in graphs},
                             contents=["lm"], tokenizer=None, voices=None, files={})
    write_manifest(out, lm)
    made = sum(r["length"] for f in record["data_files"].values() for r in f["regions"]
               if "kept" not in r)
    carried = sum(p.stat().st_size for p in out.iterdir())
    _say(f"{out}: {carried / 2**20:.1f} MiB carry {made / 1e9:.2f} GB of weights made again "
         f"({', '.join(graphs)}; {MANIFEST} without the codec, tokenizer and voices)")
    return out


# ---- there: the data files again -------------------------------------------------------------

class Pools:
    """Standard normals as stored values, one pool per (dtype, mean, std): a region is then
    slices of its pool written as they are."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.normals = self.rng.standard_normal(POOL, dtype=np.float32)
        self.made: dict[tuple, np.ndarray] = {}

    def bytes_of(self, dtype: str, mean: float, std: float) -> np.ndarray:
        # two significant digits, a mean far inside the spread taken as 0: the measured
        # figures of a few hundred tensors fall on a handful of pools
        std = float(f"{std:.2g}")
        mean = 0.0 if abs(mean) < 0.1 * std else float(f"{mean:.2g}")
        key = (dtype, mean, std)
        if key not in self.made:
            if len(self.made) >= MAX_POOLS:
                self.made.pop(next(iter(self.made)))
            values = self.normals * np.float32(std) + np.float32(mean)
            if dtype == "bfloat16":
                from personaplex_edge.export.random_lm import float32_to_bf16_bits

                stored = float32_to_bf16_bits(values)  # numpy only: no torch there
            else:
                stored = values.astype(FLOATS[dtype])
            self.made[key] = stored.view(np.uint8)
        return self.made[key]


def _write_file(path: Path, spec: dict, kept: np.ndarray, pools: Pools) -> str:
    """Writes one data file from its regions, in order, gaps zero; returns its sha256."""
    h = hashlib.sha256()
    at = 0
    with open(path, "wb") as f:
        def put(block) -> None:
            nonlocal at
            f.write(block)
            h.update(block)
            at += len(block)

        for r in sorted(spec["regions"], key=lambda r: r["offset"]):
            if r["offset"] < at:
                raise SystemExit(f"{path.name}: regions overlap at byte {r['offset']}")
            put(bytes(r["offset"] - at))
            if "kept" in r:
                put(kept[r["kept"]:r["kept"] + r["length"]])
                continue
            pool = pools.bytes_of(r["dtype"], r["mean"], r["std"])
            step = 2 if r["dtype"] != "float32" else 4
            left = r["length"]
            while left:
                n = min(left, len(pool))
                start = int(pools.rng.integers(0, (len(pool) - n) // step + 1)) * step
                put(pool[start:start + n])
                left -= n
        put(bytes(spec["size"] - at))
    return h.hexdigest()


def fill(skeleton: Path, out: Path, seed: int = 0) -> Path:
    """A model directory in `out` (replaced) from `skeleton`: its graphs, their data files
    made, a manifest naming the new files' hashes. Numpy and the standard library only."""
    import dataclasses
    import shutil

    from personaplex_edge.manifest import read_manifest, write_manifest

    record = json.loads((skeleton / RECORD).read_text())
    manifest, _ = read_manifest(skeleton / "manifest.json")
    kept = np.fromfile(skeleton / KEPT, np.uint8)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pools = Pools(seed)
    total = sum(f["size"] for f in record["data_files"].values())
    t0, done = time.perf_counter(), 0
    hashes = {}
    for name, spec in record["data_files"].items():
        hashes[name] = _write_file(out / name, spec, kept, pools)
        done += spec["size"]
        _say(f"{name}: {spec['size'] / 1e9:.2f} GB ({done / total:.0%} of "
             f"{total / 1e9:.2f} GB, {time.perf_counter() - t0:.0f} s)")
    graphs = {}
    for g, entry in manifest.graphs.items():
        shutil.copy2(skeleton / entry.file, out / entry.file)
        graphs[g] = dataclasses.replace(entry, data_files={f: hashes[f] for f in
                                                           entry.data_files})
    write_manifest(out, dataclasses.replace(manifest, graphs=graphs))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("make", help="here: a model directory's skeleton (needs onnx)")
    m.add_argument("model_dir", type=Path)
    m.add_argument("out", type=Path)
    m.add_argument("--graphs", default="helium_step,depformer_step")
    m.add_argument("--keep-bytes", type=int, default=KEEP_BYTES,
                   help=f"float tensors smaller than this travel as they are ({KEEP_BYTES})")
    f = sub.add_parser("fill", help="there: the skeleton's model directory (numpy only)")
    f.add_argument("skeleton", type=Path)
    f.add_argument("out", type=Path)
    f.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.what == "make":
        make(args.model_dir, args.out, [g for g in args.graphs.split(",") if g], args.keep_bytes)
    else:
        free = os.statvfs(args.out.parent if args.out.parent.exists() else ".")
        need = sum(s["size"] for s in json.loads((args.skeleton / RECORD).read_text())
                   ["data_files"].values())
        if free.f_bavail * free.f_frsize < need:
            raise SystemExit(f"{args.out}: {need / 1e9:.1f} GB needed, "
                             f"{free.f_bavail * free.f_frsize / 1e9:.1f} GB free")
        fill(args.skeleton, args.out, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
