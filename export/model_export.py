"""Checkpoint -> model directory: build the torch modules, export each graph, check each graph in
onnxruntime against its torch module, then write the manifest. The directory is staged and
appears complete or not at all."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.manifest import (GraphEntry, Manifest, TensorSpec, staged_dir,
                                       write_manifest)

from .hub import CheckpointFiles
from .mimi import Mimi, load_mimi
from .onnx_export import export_step, initial_state

Progress = Callable[[str], None]
PRECISIONS = ("fp32",)
BACKENDS = ("onnx",)


class ExportCheckError(PersonaPlexError):
    """An exported graph that does not compute what its torch module computes."""


def _check_against_torch(model_dir: Path, entry: GraphEntry, step, inputs: dict[str, torch.Tensor],
                         frames: int = 3, atol: float = 1e-4) -> None:
    """Runs graph and module side by side for a few frames from the initial state."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_dir / entry.file), providers=["CPUExecutionProvider"])
    state_t = initial_state(entry.state)
    state_n = {s.input_name: v.numpy() for s, v in zip(entry.state, state_t.values())}
    for frame in range(frames):
        with torch.no_grad():
            outs, new = step(*inputs.values(), state_t)
        outs = (outs,) if isinstance(outs, torch.Tensor) else outs
        state_t.update(new)
        feed = {name: t.numpy() for name, t in inputs.items()} | state_n
        results = sess.run(None, feed)
        for spec, want, got in zip(entry.outputs, outs, results):
            if want.dtype.is_floating_point:
                err = float(np.max(np.abs(want.numpy() - got)))
                ok = err <= atol
            else:
                ok = bool(np.array_equal(want.numpy(), got))
                err = 0.0 if ok else float("nan")
            if not ok:
                raise ExportCheckError(f"{entry.file}: output {spec.name} differs from the torch "
                                       f"module at frame {frame} (max error {err:.3g})")
        names = [o.name for o in sess.get_outputs()]
        state_n = {s.input_name: results[names.index(s.output_name)] for s in entry.state}


def export_codec(mimi: Mimi, out: Path, batch: int, progress: Progress) -> dict[str, GraphEntry]:
    cfg = mimi.cfg
    gen = torch.Generator().manual_seed(0)
    pcm = torch.randn(batch, 1, cfg.frame_size, generator=gen) * 0.1
    codes = torch.randint(0, cfg.codebook_size, (batch, cfg.num_codebooks), generator=gen)
    graphs = {}
    for name, step, spec, example, output, state in (
            ("mimi_encoder", mimi.encode_step, TensorSpec("pcm", tuple(pcm.shape), "float32"),
             pcm, "codes", mimi.encoder_state(batch)),
            ("mimi_decoder", mimi.decode_step, TensorSpec("codes", tuple(codes.shape), "int64"),
             codes, "pcm", mimi.decoder_state(batch))):
        t0 = time.perf_counter()
        entry = export_step(mimi, step, [(spec, example)], [output], state, out / f"{name}.onnx")
        _check_against_torch(out, entry, step, {spec.name: example})
        progress(f"  {name}.onnx: {len(state)} state tensors, checked against torch "
                 f"({time.perf_counter() - t0:.1f} s)")
        graphs[name] = entry
    return graphs


def export_model(ckpt: CheckpointFiles, out_dir: str | Path, precision: str = "fp32",
                 backend: str = "onnx", batch: int = 1,
                 progress: Progress = print) -> Manifest:
    if precision not in PRECISIONS:
        raise PersonaPlexError(f"precision {precision} is not available yet; this version "
                               f"exports {', '.join(PRECISIONS)}")
    if backend not in BACKENDS:
        raise PersonaPlexError(f"backend {backend} is not available yet; this version exports "
                               f"{', '.join(BACKENDS)}")
    cfg = ckpt.config
    progress(f"loading Mimi from {ckpt.mimi}")
    mimi = load_mimi(ckpt.mimi, cfg.mimi)
    with staged_dir(out_dir) as stage:
        graphs = export_codec(mimi, stage, batch, progress)
        manifest = Manifest(config=cfg, graphs=graphs, contents=["codec"], precision=precision,
                            backend=backend, source=ckpt.source)
        write_manifest(stage, manifest)
    progress(f"wrote {out_dir} ({', '.join(manifest.contents)})")
    return manifest
