"""The Mimi codec's two graphs as an export writes them: each traced from its torch module into
the model directory and checked in onnxruntime against it, on seeded examples (the same every
time, so `personaplex-edge verify` checks a finished export exactly as it was checked).

    codec_steps        (graph name, owner, step, inputs, outputs, state, rings) of the encoder
                       and decoder; the encoder may make more codebooks (a transcriber's 32)
    export_codec       each step traced into a directory and checked: its graph entries
    check_codec_graph  the check alone (verify runs it on a finished export)

Shared by the model's export (model_export.py), a transcriber added to one
(transcriber_export.py) and verify (check_export.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch

from personaplex_edge.contract import (CODES, MIMI_DECODER, MIMI_ENCODER, MIMI_RING_PREFIX,
                                       MIMI_ROWS_PREFIX, PCM)
from personaplex_edge.manifest import GraphEntry, TensorSpec

from .mimi import Mimi
from .onnx_export import CHECK_ATOL, export_step, verify_step
from .streaming import rings_as_io

Progress = Callable[[str], None]

CODEC_CHECK_CALLS = 3  # consecutive frames, each fed the state the one before returned


def codec_steps(mimi: Mimi, batch: int, encoder: Mimi | None = None,
                names: tuple[str, ...] = (MIMI_ENCODER, MIMI_DECODER)):
    """(graph name, owner, step, inputs [(spec, example)], output names, state, rings) of each
    codec graph of `names`, with the examples the export traces and checks it on (seeded: the
    same every time, so `personaplex-edge verify` checks a finished export exactly as it was
    checked). `encoder`: the same codec making more codebooks (a transcriber reads 32), whose
    encoder graph replaces `mimi`'s."""
    cfg = mimi.cfg
    enc = encoder or mimi
    gen = torch.Generator().manual_seed(0)
    pcm = torch.randn(batch, 1, cfg.samples_per_frame, generator=gen) * 0.1
    codes = torch.randint(0, cfg.card, (batch, cfg.num_codebooks), generator=gen)
    for name, owner, step, spec, example, output, state, rings in (
            (MIMI_ENCODER, enc, enc.encode_step, TensorSpec(PCM, tuple(pcm.shape), "float32"),
             pcm, CODES, enc.encoder_state(batch), enc.encoder_rings(batch)),
            (MIMI_DECODER, mimi, mimi.decode_step,
             TensorSpec(CODES, tuple(codes.shape), "int64"), codes, PCM,
             mimi.decoder_state(batch), mimi.decoder_rings(batch))):
        inputs = [(spec, example)] + [(TensorSpec(r.input_name, r.shape, r.dtype),
                                       torch.randn(r.shape, generator=gen)) for r in rings]
        if name in names:
            yield (name, owner, rings_as_io(step, rings), inputs,
                   [output] + [r.output_name for r in rings], state, rings)


def check_codec_graph(path: Path, fn, inputs, outputs, state,
                      atol: float | None = CHECK_ATOL) -> dict:
    """The export's check of a codec graph against its torch module (see codec_steps); the
    record of what it measured (GraphEntry.check)."""
    measured = verify_step(path, fn, {s.name: t.numpy() for s, t in inputs}, outputs, state,
                           frames=CODEC_CHECK_CALLS, atol=atol)
    return {"how": "full", "calls": CODEC_CHECK_CALLS, "outputs": measured}


def export_codec(steps, out: Path, progress: Progress) -> dict[str, GraphEntry]:
    """The codec graphs of `steps` (codec_steps), each traced into `out` and checked."""
    graphs = {}
    for name, owner, fn, inputs, outputs, state, rings in steps:
        t0 = time.perf_counter()
        path = out / f"{name}.onnx"
        entry = export_step(owner, fn, inputs, outputs, state, path)
        entry.check = check_codec_graph(path, fn, inputs, outputs, state)
        entry = entry.split_rings(MIMI_RING_PREFIX, MIMI_ROWS_PREFIX, position=rings[0].position)
        progress(f"  {name}.onnx: {len(state)} state tensors, {len(rings)} KV rings, checked "
                 f"against torch ({time.perf_counter() - t0:.1f} s)")
        graphs[name] = entry
    return graphs
