"""The 7B at its real size through the product, as a user with the real checkpoint runs it.

    python benchmarks/rehearsal.py [--work DIR] [--frames 20] [--threads N] [--json out.json]
                                   [--recipes cpu,gpu,rtx] [--keep] [--baseline REV]
                                   [--layers N] [--build-memory-gb G]

Steps, each in a process of its own (its peak resident size is its own VmHWM):

  checkpoint   PersonaPlex-7B with random weights in the published layout (32 layers, d 4096,
               the 16-step depformer, 475 LM tensors, 16.7 GB of bf16; the real Mimi), the LM
               written tensor by tensor (export/random_lm.py)
  export cpu   export --precision int4 --depformer-precision int8 (the CPU's and an Orin's
               recipe)
  bench        bench --no-persona at position 0 and at --position 3000 (the KV ring full: the
               steady state of a conversation past 4 minutes), --aec off
  run          run with the default persona on the bundled 6 s speech sample
  export gpu   export --precision fp16 --backend tensorrt --no-engines (the GPU recipe, graphs
               only: the engines are built on the GPU)
  rtx          (--recipes rtx) the engines of TensorRT for RTX, built here without a GPU: the
               int4 + int8 recipe exported for TensorRT (export rtx int4), then each graph's
               engine in a process of its own (engines --library rtx --graphs G); then the same
               for the fp16 export (export gpu; the checkpoint deleted first where nothing
               later needs it). A build is stopped when its anonymous memory passes
               --build-memory-gb (on a shared machine: what it may take), or killed by the
               kernel where the machine cannot hold it; either is reported, with the peak
               its process had reached and when
  baseline     with --baseline REV: export cpu again with the project at git revision REV
               (installed under --work), side by side (its float32 scratch needs ~31 GB more)

Reported: each step's wall time and peak RSS (and peak anonymous memory: file pages the
engine builder maps are reclaimable); each export's peak disk (everything under --work but the
checkpoint, polled twice a second) beside the model it leaves, so the scratch is the
difference; each engine's size beside its graph's weight bytes and the verdict on them; per-stage ms of bench; bytes the LM reads per frame (weights, from the graphs, and
the KV ring, from the manifest) and the floor that is at this machine's measured copy bandwidth
(read + write counted, as bench_lm.py holds the LM to it), with the fraction of it the LM
reaches.

Disk: the checkpoint (16.7 GB) and one export at a time (the fp16 one ~15 GB): ~33 GB under
--work, all deleted at the end (--keep keeps the checkpoint). Memory: `run` holds the int4
model and its float32 KV ring, ~10 GB. The figures go in docs/full-size.md; on a shared machine
say the load beside them (printed with each step).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

GB = 1e9

# One step in its own process: a CLI command (or the checkpoint writer), its stdout and stderr
# kept, its peak resident size (VmHWM: this address space's own) and wall time reported last.
_CHILD = r"""
import contextlib, io, json, os, sys, threading, time
os.environ.setdefault("NO_TORCH_COMPILE", "1")
anon = [0]
def poll():  # the peak of anonymous memory (VmHWM also counts mapped file pages), kept on disk
    while True:  # too: a process the kernel kills for memory leaves it behind
        with open("/proc/self/status") as f:
            kb = next((int(l.split()[1]) for l in f if l.startswith("RssAnon:")), 0)
        if kb * 1024 > anon[0]:
            anon[0] = kb * 1024
            with open(sys.argv[1] + ".peak", "w") as f:
                f.write(str(anon[0]))
        time.sleep(0.2)
threading.Thread(target=poll, daemon=True).start()
report, argv = sys.argv[1], sys.argv[2:]
baseline = os.environ.get("REHEARSAL_BASELINE")
if baseline:  # an earlier version's copy instead of this checkout (installed editable)
    sys.meta_path[:] = [f for f in sys.meta_path
                        if "__editable__" not in (getattr(f, "__module__", "") or "")]
    sys.path.insert(0, baseline)
t0 = time.perf_counter()
out = io.StringIO()
class Tee(io.TextIOBase):  # the step's output shown as it comes, and kept
    def write(self, s):
        sys.__stdout__.write(s)
        sys.__stdout__.flush()
        return out.write(s)
if argv[0] == "checkpoint":
    from personaplex_edge.config import PersonaPlexConfig
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint
    cfg = PersonaPlexConfig.from_dict(json.loads(argv[2]))
    write_synthetic_checkpoint(cfg, argv[1], streamed=True)
    rc = 0
else:
    from personaplex_edge.cli import main
    with contextlib.redirect_stdout(Tee()):
        rc = main(argv)
with open("/proc/self/status") as f:
    hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
json.dump({"rc": rc, "seconds": time.perf_counter() - t0, "peak_rss": hwm,
           "peak_anon": anon[0], "stdout": out.getvalue()}, open(report, "w"))
sys.exit(rc)
"""


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def tree_bytes(root: Path, skip: set[Path] = frozenset()) -> int:
    """The bytes of the files under `root`, a file hard-linked twice (the engine build's staging
    copy of a model) counted once."""
    total, seen = 0, set()
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) in skip:
            dirnames.clear()
            continue
        for name in filenames:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except FileNotFoundError:  # renamed or removed between the listing and the stat
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


class DiskPeak:
    """The most bytes under `root` (but `skip`) seen while it runs, polled twice a second."""

    def __init__(self, root: Path, skip: set[Path]):
        self.root, self.skip, self.peak = root, skip, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, tree_bytes(self.root, self.skip))

    def __enter__(self) -> "DiskPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_bytes(self.root, self.skip))


class StepFailed(SystemExit):
    """A step's process ended without its report: stopped at the memory it may take, killed
    (for memory, exit -9) or crashed."""

    def __init__(self, name: str, returncode: int, peak_anon: int, seconds: float,
                 stopped: bool = False):
        self.returncode, self.peak_anon, self.seconds = returncode, peak_anon, seconds
        how = ("stopped at the memory it may take" if stopped else
               "killed (SIGKILL: out of memory?)" if returncode == -9 else f"exit {returncode}")
        super().__init__(f"{name} failed, {how}, at {peak_anon / GB:.2f} GB of anonymous "
                         f"memory after {seconds:.0f} s: see above")


def step(name: str, argv: list[str], work: Path, disk: DiskPeak | None = None,
         baseline: Path | None = None, max_anon: float | None = None) -> dict:
    """Runs one step in its own process (with the `baseline` copy's code where given), stopped
    where its anonymous memory passes `max_anon` bytes; its report (rc, seconds, peak_rss,
    peak_anon, stdout)."""
    report = work / f".{name.replace(' ', '_')}.json"
    peak = Path(f"{report}.peak")
    print(f"\n== {name}: {' '.join(argv)}  ({load()})", flush=True)
    env = {**os.environ, **({"REHEARSAL_BASELINE": str(baseline)} if baseline else {})}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(report), *argv], env=env)
    stopped = False
    while proc.poll() is None:
        time.sleep(0.3)
        try:
            reached = int(peak.read_text())
        except (OSError, ValueError):  # not written yet, or being written
            continue
        if max_anon is not None and reached > max_anon:
            proc.kill()
            proc.wait()
            stopped = True
    if not report.is_file():
        reached = int(peak.read_text()) if peak.is_file() else 0
        peak.unlink(missing_ok=True)
        raise StepFailed(name, proc.returncode, reached, time.monotonic() - t0, stopped)
    result = json.loads(report.read_text())
    report.unlink()
    peak.unlink(missing_ok=True)
    if disk is not None:
        result["peak_disk"] = disk.peak
    print(f"== {name}: {result['seconds']:.0f} s, peak RSS {result['peak_rss'] / GB:.2f} GB "
          f"(anonymous {result.get('peak_anon', 0) / GB:.2f} GB)"
          + (f", peak disk {disk.peak / GB:.2f} GB" if disk is not None else "")
          + f"  ({load()})", flush=True)
    if proc.returncode != 0:
        sys.stdout.write(result["stdout"])
        raise SystemExit(f"{name} failed (exit {proc.returncode})")
    return result


def export(name: str, ckpt: Path, out: Path, work: Path, flags: list[str],
           baseline: Path | None = None) -> dict:
    skip = {ckpt, baseline.parent} if baseline else {ckpt}
    with DiskPeak(work, skip=skip) as disk:
        result = step(name, ["export", "--checkpoint", str(ckpt), "--out", str(out), *flags],
                      work, disk, baseline)
    result["model_bytes"] = tree_bytes(out)
    result["scratch_bytes"] = result["peak_disk"] - result["model_bytes"]
    print(f"   model {result['model_bytes'] / GB:.2f} GB; beyond it at the peak "
          f"{result['scratch_bytes'] / GB:.2f} GB")
    return result


def bench(model: Path, work: Path, frames: int, position: int | None) -> dict:
    name = "bench" + (f" --position {position}" if position is not None else "")
    out = work / "bench.json"
    argv = ["bench", "--model", str(model), "--frames", str(frames), "--warmup", "5",
            "--no-persona", "--aec", "off", "--json", str(out)]
    if position is not None:
        argv += ["--position", str(position)]
    result = step(name, argv, work)
    data = json.loads(out.read_text())
    out.unlink()
    result["stages"] = {k: v["p50"] for k, v in data["per_stream"][0].items()
                        if isinstance(v, dict)}
    result["position"] = data["position"]
    print("   p50 ms: " + ", ".join(f"{k} {v:.1f}" for k, v in result["stages"].items()))
    return result


def run(model: Path, work: Path) -> dict:
    from personaplex_edge.runtime.bench import bundled_speech

    result = step("run", ["run", "--model", str(model), "--input", str(bundled_speech()),
                          "--output", str(work / "answer.wav"), "--seed", "1"], work)
    (work / "answer.wav").unlink()
    for line in result["stdout"].splitlines():
        parts = line.split()
        if parts[:1] == ["frame"] and len(parts) == 5:  # the stage table's frame row
            result["frame_p50_ms"] = float(parts[1])
        elif parts[:1] == ["persona:"]:  # persona: N prompt frames in S s
            result["prompt_frames"], result["prompt_seconds"] = int(parts[1]), float(parts[5])
    return result


def install_baseline(rev: str, work: Path) -> Path:
    """The project at git revision `rev` (of this checkout's repository), installed into
    `work` for the child processes to import instead of this checkout."""
    repo = Path(__file__).resolve().parent.parent
    src, target = work / "baseline" / "src", work / "baseline" / "package"
    shutil.rmtree(work / "baseline", ignore_errors=True)
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(src)], check=True)
    return target


def available_memory() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f
                    if line.startswith("MemAvailable:"))


def rtx_engines(label: str, model: Path, work: Path, graphs: list[str] | None = None,
                max_anon: float | None = None) -> list[dict]:
    """Each graph's TensorRT for RTX engine (of `graphs`, default all) built in a process of its
    own, smallest first; a build stopped at `max_anon` bytes of anonymous memory, or killed, is
    reported with the peak it reached, and the next graph is built."""
    import re

    from personaplex_edge.manifest import load_model_dir
    from personaplex_edge.runtime.backends.trt_build import graph_weight_bytes

    manifest = load_model_dir(model)
    weights_of = {g: graph_weight_bytes(model / manifest.graphs[g].file).stored
                  for g in graphs or manifest.graphs}
    rows = []
    for graph in sorted(weights_of, key=weights_of.get):
        weights = weights_of[graph]
        row = {"recipe": label, "graph": graph, "weight_bytes": weights,
               "memory_available_before": available_memory()}
        rows.append(row)
        try:
            with DiskPeak(work, skip=set()) as disk:
                result = step(f"engines {label} {graph}", ["engines", "--model", str(model),
                                                           "--library", "rtx", "--graphs",
                                                           graph], work, disk,
                              max_anon=max_anon)
        except StepFailed as e:
            row["failed"] = str(e).split(": see above")[0].split(" failed, ")[1]
            row["peak_anon"], row["seconds"] = e.peak_anon, e.seconds
            print(f"   {row['failed']}", flush=True)
            continue
        line = re.search(rf"{graph}\.engine: built in .*?; engine ([\d.]+) MB, graph weights "
                         r"[\d.]+ MB(?: quantised)?(?: / [\d.]+ MB as float16)?(?:: (.*))?$",
                         result["stdout"], re.M)
        row.update(seconds=result["seconds"], peak_rss=result["peak_rss"],
                   peak_anon=result["peak_anon"], peak_disk=result["peak_disk"],
                   engine_bytes=(model / f"{graph}.engine").stat().st_size,
                   verdict=(line.group(2) if line and line.group(2) else "float weights"))
    return rows


def engines_table(rows: list[dict]) -> None:
    """rtx_engines' rows as a markdown table."""
    print("\nTensorRT for RTX engines, built without a GPU (targets 8.6, 8.9, 12.0; fp8 8.9, "
          "12.0)")
    print("| recipe | graph | s | peak RSS GB | peak anonymous GB | peak disk GB | "
          "weights MB | engine MB | verdict |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for e in rows:
        if "failed" in e:
            print(f"| {e['recipe']} | {e['graph']} | {e['seconds']:.0f} | | "
                  f"{e['peak_anon'] / GB:.2f} (reached) | | {e['weight_bytes'] / 1e6:.1f} | | "
                  f"{e['failed']} (with {e['memory_available_before'] / GB:.1f} GB available "
                  "before) |")
            continue
        print(f"| {e['recipe']} | {e['graph']} | {e['seconds']:.0f} | {e['peak_rss'] / GB:.2f} "
              f"| {e['peak_anon'] / GB:.2f} | {e['peak_disk'] / GB:.2f} | "
              f"{e['weight_bytes'] / 1e6:.1f} | {e['engine_bytes'] / 1e6:.1f} | {e['verdict']} |")


def frame_bytes(model: Path) -> dict:
    from frame_bytes import model_bytes_per_frame

    from personaplex_edge.manifest import load_model_dir

    counted = model_bytes_per_frame(model, load_model_dir(model))
    return {"helium": counted["helium_step"], "depformer": counted["depformer_step"],
            "kv": counted["kv"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/personaplex_rehearsal")
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--layers", type=int, default=32,
                    help="Helium's layers (32: the 7B; fewer: a quick trial of this script)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads of the bandwidth measurement (the runtime uses its default)")
    ap.add_argument("--recipes", default="cpu,gpu",
                    help="cpu: the int4 + int8 export, bench and run; gpu: the fp16 TensorRT "
                         "export (graphs only); rtx: TensorRT for RTX's engines of the int4 + "
                         "int8 and the fp16 TensorRT exports, built here")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint for a rerun")
    ap.add_argument("--baseline", metavar="REV",
                    help="also export the CPU recipe with the project at this git revision "
                         "(e.g. the commit before a change), side by side")
    ap.add_argument("--build-memory-gb", type=float,
                    help="rtx: stop an engine build whose anonymous memory passes this (on a "
                         "shared machine: what it may take); default: no limit")
    ap.add_argument("--json")
    args = ap.parse_args()
    from frame_bytes import copy_bandwidth

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ckpt, cpu, gpu = work / "checkpoint", work / "int4", work / "fp16"
    rtx_int4 = work / "rtx-int4"
    recipes = set(args.recipes.split(","))
    max_anon = args.build_memory_gb * GB if args.build_memory_gb else None
    free = shutil.disk_usage(work).free
    print(f"{work}: {free / GB:.0f} GB free; {os.cpu_count()} cpus; {load()}")
    results: dict = {"cpus": os.cpu_count()}
    try:
        if not (ckpt / "config.json").is_file():
            layers = {"temporal_config": {"num_hidden_layers": args.layers}}
            results["checkpoint"] = step("checkpoint", ["checkpoint", str(ckpt),
                                                        json.dumps(layers)], work)
        results["checkpoint_bytes"] = tree_bytes(ckpt)
        if "cpu" in recipes:
            results["export_cpu"] = export("export cpu", ckpt, cpu, work,
                                           ["--precision", "int4", "--depformer-precision",
                                            "int8"])
            results["bytes_per_frame"] = frame_bytes(cpu)
            results["bench"] = bench(cpu, work, args.frames, None)
            results["bench_full_ring"] = bench(cpu, work, args.frames, 3000)
            results["run"] = run(cpu, work)
            shutil.rmtree(cpu)
        if "rtx" in recipes:
            results["export_rtx_int4"] = export(
                "export rtx int4", ckpt, rtx_int4, work,
                ["--precision", "int4", "--depformer-precision", "int8", "--backend",
                 "tensorrt", "--no-engines"])
            results["engines"] = rtx_engines("int4+int8", rtx_int4, work, max_anon=max_anon)
            shutil.rmtree(rtx_int4)
        if args.baseline:
            package = install_baseline(args.baseline, work)
            results["export_cpu_baseline"] = export(
                f"export cpu ({args.baseline})", ckpt, cpu, work,
                ["--precision", "int4", "--depformer-precision", "int8"], baseline=package)
            results["baseline"] = args.baseline
            shutil.rmtree(cpu)
        if "cpu" in recipes:
            results["bandwidth"] = {"copy": copy_bandwidth(args.threads)}
        if recipes & {"gpu", "rtx"}:
            results["export_gpu"] = export("export gpu", ckpt, gpu, work,
                                           ["--precision", "fp16", "--backend", "tensorrt",
                                            "--no-engines"])
            if "rtx" in recipes:
                if not args.keep:  # nothing needs it any more: its disk for the engines
                    shutil.rmtree(ckpt, ignore_errors=True)
                results["engines"] = results.get("engines", []) + rtx_engines(
                    "fp16", gpu, work, max_anon=max_anon)
            shutil.rmtree(gpu)
    finally:
        from personaplex_edge.atomic import OLD_MARK, STAGE_MARK

        for out in (cpu, gpu, rtx_int4, work / "baseline"):
            shutil.rmtree(out, ignore_errors=True)
            # and the staging copy of a step killed mid-write (an engine build the kernel
            # stopped for memory cannot clean up after itself)
            for mark in (STAGE_MARK, OLD_MARK):
                for left in work.glob(f".{out.name}{mark}*"):
                    shutil.rmtree(left, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(ckpt, ignore_errors=True)
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def report(r: dict) -> None:
    print(f"\nPersonaPlex-7B (random weights), {r['cpus']} cpus; checkpoint "
          f"{r['checkpoint_bytes'] / GB:.2f} GB")
    print("| step | s | peak RSS GB | peak disk GB | model GB | beyond the model GB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for key in ("checkpoint", "export_cpu", "export_cpu_baseline", "export_rtx_int4",
                "export_gpu", "run"):
        if key not in r:
            continue
        s = r[key]
        label = f"{key} ({r['baseline']})" if key == "export_cpu_baseline" else key
        disk = (f"{s['peak_disk'] / GB:.2f} | {s['model_bytes'] / GB:.2f} | "
                f"{s['scratch_bytes'] / GB:.2f}" if "peak_disk" in s else " | | ")
        print(f"| {label} | {s['seconds']:.0f} | {s['peak_rss'] / GB:.2f} | {disk} |")
    if r.get("engines"):
        engines_table(r["engines"])
    if "bytes_per_frame" not in r:
        return
    b, bw = r["bytes_per_frame"], r["bandwidth"]
    lm = b["helium"] + b["depformer"] + b["kv"]
    print(f"\nbytes read per frame: Helium {b['helium'] / GB:.2f} GB, depformer "
          f"{b['depformer'] / GB:.2f} GB, KV ring {b['kv'] / GB:.2f} GB: {lm / GB:.2f} GB")
    print(f"copy bandwidth (numpy, read + write counted, {r['cpus']} threads): "
          f"{bw['copy'] / GB:.1f} GB/s")
    print("| bench | position | encode | temporal | depformer | decode | frame | LM | LM floor "
          "(copy) | of floor |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key in ("bench", "bench_full_ring"):
        st = r[key]["stages"]
        lm_ms = st["temporal"] + st["depformer"]
        floor = 1000 * lm / bw["copy"]
        print(f"| {key} | {r[key]['position']} | {st.get('encode', 0):.1f} | "
              f"{st['temporal']:.1f} | {st['depformer']:.1f} | {st.get('decode', 0):.1f} | "
              f"{st['frame']:.1f} | {lm_ms:.1f} | {floor:.1f} | {floor / lm_ms:.0%} |")
    run = r["run"]
    if "frame_p50_ms" in run and "prompt_frames" in run:
        print(f"run (default persona, 6 s of speech): {run['prompt_frames']} prompt frames in "
              f"{run['prompt_seconds']:.1f} s, then {run['frame_p50_ms']:.1f} ms per frame (p50)")


if __name__ == "__main__":
    main()
