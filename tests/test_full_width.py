"""The 7B's path at its real width, cut to one layer: what breaks only at size breaks here.

PersonaPlex-7B's config with one Helium layer and one depformer layer: d 4096, 32 heads of 128,
the MLP of 11264, the text vocabulary of 32000 (32001 embedding rows), the 16 audio tables,
the 16-step depformer (8 active) with its real width and vocabulary, the 3000-frame context; the
tests' tiny Mimi (the codec's size is tested elsewhere). Its checkpoint (1.9 GB of bf16) is
written in the published layout tensor by tensor (export/random_lm.py), then the product path
runs as a user runs it:

    export --precision int4 --depformer-precision int8     the CPU's and an Orin's recipe:
                                                            int4 packing at K = 4096 and 11264,
                                                            the 32000-wide text head
    export (float32)                                        a Helium graph of 2.4 GB: past
                                                            protobuf's 2 GB, external data
                                                            offsets past 2^31
    run (a few frames, default persona)                     on both: the graphs load, the KV
                                                            ring of [1, 32, 3000, 128] binds
    the float32 export converted for TensorRT (int4,        an RTX PC's recipe: real TensorRT
    int8 depformer), its engines built (TensorRT for RTX,   for RTX engines, and the verdict on
    no GPU needed)                                          the quantised weights for real

A 7B-only failure (a size limit, an offset, a packing) fails here, in a minute, not for a user
after an hour.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from personaplex_edge.config import PRESETS, PersonaPlexConfig

RUN_SECONDS = 0.5  # about 6 frames after the persona


def full_width_config() -> PersonaPlexConfig:
    d = PersonaPlexConfig().to_dict()
    d["temporal_config"]["num_hidden_layers"] = 1
    d["depformer_config"]["num_hidden_layers"] = 1
    d["mimi_config"] = dict(PRESETS["tiny"]["mimi_config"])
    return PersonaPlexConfig.from_dict(d)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from personaplex_edge.export.synthetic import write_synthetic_checkpoint

    return write_synthetic_checkpoint(full_width_config(), tmp_path_factory.mktemp("full_width"),
                                      streamed=True)


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    from personaplex_edge.audio import write_audio

    path = tmp_path_factory.mktemp("speech") / "in.wav"
    t = np.arange(int(24000 * RUN_SECONDS)) / 24000
    write_audio(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))
    return path


@pytest.fixture(scope="module")
def float32_export(checkpoint, tmp_path_factory):
    from personaplex_edge.cli import main

    out = tmp_path_factory.mktemp("full_width_fp32") / "fp32"
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(out)]) == 0
    return out


def _export_and_run(checkpoint, out, speech, *flags):
    from personaplex_edge.cli import main

    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(out), *flags]) == 0
    return _run(out, speech)


def _run(out, speech):
    from personaplex_edge.cli import main
    from personaplex_edge.manifest import load_model_dir

    manifest = load_model_dir(out)
    text = out.parent / f"{out.name}.json"
    assert main(["run", "--model", str(out), "--input", str(speech), "--output",
                 str(out.parent / f"{out.name}.wav"), "--text-out", str(text),
                 "--seed", "1"]) == 0
    return manifest, json.loads(text.read_text())


@pytest.mark.slow
def test_the_cpu_recipe_at_full_width(checkpoint, speech, tmp_path):
    from personaplex_edge.audio import read_audio

    out = tmp_path / "int4"
    manifest, records = _export_and_run(checkpoint, out, speech, "--precision", "int4",
                                        "--depformer-precision", "int8")
    helium, depformer = manifest.graphs["helium_step"], manifest.graphs["depformer_step"]
    assert (helium.precision, depformer.precision) == ("int4", "int8")
    ring = helium.rings[0]
    assert ring.shape == (1, 32, 3000, 128) and ring.dtype == "float32"
    # the weights really are 4 bits: the layer, the text head and the tables' fp16
    data = out / next(iter(helium.data_files))
    assert 0.6e9 < data.stat().st_size < 0.9e9
    answer = read_audio(tmp_path / "int4.wav")
    assert answer.shape[0] == int(24000 * RUN_SECONDS) and np.isfinite(answer).all()
    assert len(records) >= int(RUN_SECONDS * 12.5)


@pytest.mark.slow
def test_float32_past_protobufs_limit(float32_export, speech):
    out = float32_export
    manifest, records = _run(out, speech)
    helium = manifest.graphs["helium_step"]
    data = out / next(iter(helium.data_files))
    assert data.stat().st_size > 2**31  # offsets past a signed 32-bit integer
    assert helium.check["how"] == "full"
    assert len(records) >= int(RUN_SECONDS * 12.5)


@pytest.mark.slow
def test_rtx_engines_at_full_width_keep_the_quantised_weights(float32_export, tmp_path):
    """The float32 export converted for TensorRT (int4 Helium, int8 depformer) builds into real
    TensorRT for RTX engines (no GPU needed), and at this width the engine's size against its
    graph's weight bytes is a verdict, not noise: TensorRT for RTX keeps int4 and int8 weights
    at their width (each engine within a few MB of its quantised weights, far below their
    float16 size)."""
    try:
        import tensorrt_rtx  # noqa: F401
    except (ImportError, OSError) as e:
        pytest.skip(f"TensorRT for RTX is not installed ({e}): pip install "
                    "'personaplex-edge[rtx]' (scripts/install.sh does)")
    from personaplex_edge.export.precision import convert_model_dir
    from personaplex_edge.manifest import load_model_dir, write_manifest
    from personaplex_edge.runtime.backends.trt_build import build_engines, build_setup

    out = tmp_path / "trt-int4"
    convert_model_dir(float32_export, out, "int4", backend="tensorrt",
                      depformer_precision="int8", progress=lambda s: None)
    said = []
    names = ["helium_step", "depformer_step"]
    write_manifest(out, build_engines(out, graphs=names, progress=said.append,
                                      setup=build_setup(["int4", "int8"], "rtx")))
    manifest = load_model_dir(out)
    for name in names:
        (line,) = [s for s in said if s.startswith(f"  {name}.engine: built")]
        assert line.endswith("weights kept quantised"), line
        engine = manifest.graphs[name].engine
        size = (out / engine["file"]).stat().st_size
        assert engine["weight_bytes"] < size < engine["weight_bytes"] + (64 << 20), line
