"""The per-user engine cache on a real GPU (runtime/backends/engine_cache.py), one stage of
gpu_check.py: a TensorRT model without engines (as downloaded) gets them built on first use into
the cache, keyed per graph, with this machine's TensorRT:

    first start     every graph's engine built into the cache
    second start    none built: every engine found, loaded and checked by the real runtime
    a graph changed one graph re-exported (as adding a transcriber re-exports the encoder):
                    its engine alone built again, the old one pruned and said
    tokens          the cached engines' greedy tokens against onnxruntime on the CPU

Each disagreement raises, so the stage reports FAILED with what was seen. The same logic runs
on the simulated GPU in tests/test_trt_build.py; here it meets real engines, real files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

NAMES = ["mimi_encoder", "mimi_decoder", "helium_step", "depformer_step"]


def without_engines(model: Path, out: Path) -> Path:
    """A copy of `model` whose manifest records no engine and that holds none."""
    from personaplex_edge.manifest import load_model_dir, write_manifest

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(model, out, ignore=shutil.ignore_patterns("*.engine"))
    manifest = load_model_dir(out)
    write_manifest(out, dataclasses.replace(manifest, graphs={
        n: dataclasses.replace(g, engine=None) for n, g in manifest.graphs.items()}))
    return out


def reexport(model: Path, graph: str) -> None:
    """`graph` changed as a re-export changes it (one more metadata entry: it computes the
    same), its new sha256 in the manifest."""
    import onnx

    from personaplex_edge.manifest import MANIFEST, sha256_file

    path = model / f"{graph}.onnx"
    proto = onnx.load(str(path), load_external_data=False)
    proto.metadata_props.add(key="reexport", value=str(len(proto.metadata_props)))
    onnx.save(proto, str(path))
    data = json.loads((model / MANIFEST).read_text())
    data["graphs"][graph]["sha256"] = sha256_file(path)
    (model / MANIFEST).write_text(json.dumps(data))


def _start(model: Path) -> tuple[list[str], str]:
    """Every graph's engine for this GPU, loaded by the runtime; (graphs built, what was
    said)."""
    from personaplex_edge.manifest import load_model_dir
    from personaplex_edge.runtime.backends import load_graphs

    said: list[str] = []
    graphs = load_graphs(model, load_model_dir(model), NAMES, "cuda", progress=said.append)
    for g in graphs.values():
        g.close()
    text = "\n".join(said)
    # "  <graph>-<key>.engine: built in ...": graph names have no hyphen
    built = [line.strip().split("-", 1)[0] for line in text.splitlines()
             if ".engine: built in" in line]
    return built, text


def first_use(model: Path, work: Path, user, reference) -> str:
    """The stages of the module docstring on a copy of `model` (a --backend tensorrt export,
    float32), the cache in `work`/cache; the LM's greedy run on `user` codes is compared with
    `reference`, onnxruntime CPU's tokens."""
    from lm_probe import GreedyLM, agreement

    copy = without_engines(model, work / "first-use")
    before = os.environ.get("PERSONAPLEX_CACHE")
    os.environ["PERSONAPLEX_CACHE"] = str(work / "cache")
    shutil.rmtree(work / "cache", ignore_errors=True)
    try:
        built, _ = _start(copy)
        if sorted(built) != sorted(NAMES):
            raise RuntimeError(f"the first start built {built}, not every graph")
        built, said = _start(copy)
        if built:
            raise RuntimeError(f"the second start built {built} again:\n{said}")
        reexport(copy, "mimi_encoder")
        built, said = _start(copy)
        if built != ["mimi_encoder"] or "removed from the engine cache" not in said:
            raise RuntimeError(f"after the encoder changed: built {built}, said:\n{said}")
        removed = said.split("removed from the engine cache", 1)[1].splitlines()[1].strip()
        run = GreedyLM(copy, device="cuda").run(user, forced=reference)
        a = agreement(run.tokens, reference)
    finally:
        if before is None:
            os.environ.pop("PERSONAPLEX_CACHE", None)
        else:
            os.environ["PERSONAPLEX_CACHE"] = before
    return (f"4 engines built into the cache, found at the next start; the changed encoder's "
            f"alone built again, the old one pruned ({removed}); cached engines' tokens vs "
            f"ort-cpu: text {a['text']:.1%} audio {a['audio']:.1%}")
