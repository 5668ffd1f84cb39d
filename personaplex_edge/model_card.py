"""The model card (README.md) of an exported model published on the Hugging Face hub: what it was
exported from and how, what the export measured, the weights' licence, and how to run it.
Everything in it comes from the manifest, so the card cannot say what the files are not."""

from __future__ import annotations

from .contract import DEPFORMER_STEP, HELIUM_STEP
from .devices import model_devices
from .manifest import GraphEntry, Manifest

# The weights are NVIDIA's (nvidia/personaplex-7b-v1); this project's code is MIT.
WEIGHTS_LICENCE = "NVIDIA Open Model License"
WEIGHTS_LICENCE_ID = "nvidia-open-model-license"
WEIGHTS_LICENCE_LINK = ("https://www.nvidia.com/en-us/agreements/enterprise-software/"
                        "nvidia-open-model-license/")


def _figures(entry: GraphEntry) -> str:
    check = entry.check
    if not check:
        return "not checked at export"
    ints = {t.name for t in entry.outputs if t.dtype.startswith("int")}
    floats = {k: v for k, v in check["outputs"].items() if k not in ints}
    differing = {k: v for k, v in check["outputs"].items() if k in ints}
    parts = []
    if floats:
        worst = max(floats, key=floats.get)
        parts.append(f"largest difference {floats[worst]:.2g} ({worst})")
    if differing:
        parts.append(", ".join(f"{k} {'equal' if not v else f'{100 * v:.2f}% differ'}"
                               for k, v in sorted(differing.items())))
    how = check["how"] + (f", {check['weight_rows_compared']} weight rows compared"
                          if "weight_rows_compared" in check else "")
    return f"{how}, {check['calls']} calls: " + "; ".join(parts)


def _devices(manifest: Manifest) -> str:
    lines = model_devices(manifest)
    return "; ".join(lines[:-1]) + " and " + lines[-1] if len(lines) > 1 else lines[0]


def model_card(manifest: Manifest, repo: str) -> str:
    source = manifest.source or "?"
    revision = manifest.source_revision
    from_hub = "/" in source and not source.startswith(("/", ".")) and revision
    lm = "lm" in manifest.contents
    rows = "\n".join(
        f"| {name} | {entry.precision} | {_figures(entry)} |"
        for name, entry in manifest.graphs.items())
    kv = sorted({r.dtype for r in manifest.graphs[HELIUM_STEP].rings}) if lm else []
    depformer = manifest.graphs[DEPFORMER_STEP].precision if lm else None
    front = ["---", "license: other", f"license_name: {WEIGHTS_LICENCE_ID}",
             f"license_link: {WEIGHTS_LICENCE_LINK}", "library_name: personaplex-edge",
             "pipeline_tag: audio-to-audio",
             "tags: [personaplex, moshi, speech-to-speech, full-duplex, onnx"
             + (", tensorrt" if manifest.backend == "tensorrt" else "") + "]"]
    if from_hub:
        front.append(f"base_model: {source}")
    front.append("---")
    return "\n".join(front) + f"""

# {repo.split('/')[-1]}

An exported [PersonaPlex](https://huggingface.co/nvidia/personaplex-7b-v1) model for
personaplex-edge: ONNX graphs and their manifest, run by a torch-free runtime (onnxruntime,
TensorRT) and fetched by name:

```
pip install 'personaplex-edge[cpu]'        # or [gpu], [trt], [rtx], [webgpu], [jetson]
personaplex-edge run --model {repo} --input question.wav --output answer.wav
personaplex-edge serve --model {repo}
personaplex-edge verify --model {repo}      # every file's hash, every graph's signature
```

It runs on {_devices(manifest)}.

## Export

| | |
| --- | --- |
| source checkpoint | {source} |
| source revision | {revision or 'a local directory'} |
| contents | {', '.join(manifest.contents)} |
| precision | {manifest.precision}{f' (depformer {depformer})' if depformer and depformer != manifest.precision else ''} |
| KV ring | {', '.join(kv) or '-'} |
| backend | {manifest.backend} |
| batch | {manifest.batch} conversation(s) per graph call |
| personaplex-edge | {manifest.package_version} |

## What the export measured

Each graph was run in onnxruntime beside its torch module on the checkpoint's weights (in
float32, before any conversion to a lower precision); the export refuses a graph whose outputs
differ by more than 1e-4, and integer outputs (codes, tokens) must be equal.

| graph | stored as | checked |
| --- | --- | --- |
{rows}

## Licence

The weights are NVIDIA's, under the [{WEIGHTS_LICENCE}]({WEIGHTS_LICENCE_LINK}) (as
nvidia/personaplex-7b-v1); using them means accepting it. personaplex-edge's code is MIT.
"""
