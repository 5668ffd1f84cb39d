"""A Kyutai STT checkpoint -> the transcriber's step graph, beside the language model.

The checkpoint is a directory (or hub repository) as Kyutai publishes one for moshi:

    config.json         moshi's LMModel arguments at the top level, model_type "stt",
                        stt_config, lm_gen_config, mimi_name, tokenizer_name
    model.safetensors   bf16, moshi's names: transformer.layers.{i}.*, out_norm, emb.{0..n_q-1},
                        text_emb, text_linear, and in the -candle weights extra_heads.{0..3}
    <mimi_name>         the Mimi codec: PersonaPlex's (its encoder's first 8 codes are checked
                        against the model's: export/transcriber_export.py)
    <tokenizer_name>    its SentencePiece model

The step is Helium's (export/helium.py) over 1 + n_q streams, with the VAD heads on its normed
hidden state:

    transcriber_step    tokens [B, 1, 1 + n_q] i64 (its last text token, the user's codes),
                        position [B] i64, past_key_values.{i}.key / .value [B, H, T, Dh]
                        -> text_token [B] i64 (greedy, as Kyutai's lm_gen_config asks),
                           vad [B, heads, classes] (softmax per head; with VAD heads only),
                           present.{i}.key / .value [B, H, 1, Dh]

written, converted and checked as the LM's graphs are (lm.export_lm_graphs_frugal).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from personaplex_edge.config import PersonaPlexMimiConfig
from personaplex_edge.contract import (POSITION, TEXT_TOKEN, TOKENS, TRANSCRIBER_STEP, VAD,
                                       kv_output)
from personaplex_edge.errors import CheckpointError, ConfigError
from personaplex_edge.manifest import TensorSpec, sha256_file
from personaplex_edge.streams import CODEBOOKS_PER_SPEAKER
from personaplex_edge.transcriber import TranscriberConfig

from .frugal import SafetensorsHeader, Segment, WeightPlan
from .helium import Helium
from .hub import _REPO_ID, _spm_check, hub_fetch, prepare_download, remote_sizes
from .lm import (RING_GRAPHS, Shapes, checked_header, kv_ring_specs, placeholder_modules,
                 temporal_plan, temporal_tensors)

CONFIG_FILE = "config.json"
MOSHI_FILE = "model.safetensors"  # moshi's default `moshi_name`
VAD_KEY = "extra_heads.{}.weight"
assert TRANSCRIBER_STEP in RING_GRAPHS


@dataclass
class TranscriberFiles:
    """A Kyutai STT checkpoint's files, its config read and checked."""

    source: str
    config: TranscriberConfig
    lm: Path
    mimi: Path
    tokenizer: Path
    revision: str | None = None


# ---- the checkpoint ------------------------------------------------------------------------

def _names(raw: dict, where: Path | str) -> tuple[str, str, str]:
    """(LM, Mimi, tokenizer) file names of a Kyutai config.json, each a plain file name."""
    out = []
    for key, default in (("moshi_name", MOSHI_FILE), ("mimi_name", None),
                         ("tokenizer_name", None)):
        name = raw.get(key, default)
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise ConfigError(f"{where}: field '{key}' is {name!r}: it must name a file of the "
                              "checkpoint (Kyutai's configs give mimi_name and tokenizer_name)")
        out.append(name)
    return tuple(out)


def _read_config(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return raw


def vad_heads_of(lm: Path, cfg: TranscriberConfig, where: Path) -> TranscriberConfig:
    """The config with the VAD heads the weights hold: Kyutai's -candle checkpoints carry
    `extra_heads.{i}` whether or not their config declares them; a config that declares a
    number the weights do not hold is refused, naming the field."""
    header = SafetensorsHeader(lm)
    heads = sorted(int(k.split(".")[1]) for k in header.shapes
                   if k.startswith("extra_heads.") and k.endswith(".weight"))
    if heads != list(range(len(heads))):
        raise CheckpointError(f"{lm}: extra_heads {heads} are not numbered 0..n-1")
    if cfg.vad_heads and cfg.vad_heads != len(heads):
        raise ConfigError(f"{where}: field 'extra_heads_num_heads' is {cfg.vad_heads}, but "
                          f"{lm} holds {len(heads)} extra_heads")
    if not heads:
        return cfg
    classes = header.shapes[VAD_KEY.format(0)][0]
    return replace(cfg, vad_heads=len(heads), vad_classes=classes)


def _finish(source: str, config_path: Path, lm: Path | None, mimi: Path | None,
            tokenizer: Path | None, revision: str | None = None) -> TranscriberFiles:
    raw = _read_config(config_path)
    cfg = TranscriberConfig.from_kyutai(raw, str(config_path))
    lm_name, mimi_name, tok_name = _names(raw, config_path)
    for path, name, field_ in ((lm, lm_name, "moshi_name"), (mimi, mimi_name, "mimi_name"),
                               (tokenizer, tok_name, "tokenizer_name")):
        if path is None or not path.is_file():
            raise CheckpointError(f"{source} has no {name} (config.json field '{field_}'): a "
                                  "Kyutai STT checkpoint holds config.json, model.safetensors, "
                                  "its Mimi file and its SentencePiece model")
    SafetensorsHeader(lm).check_complete()
    SafetensorsHeader(mimi).check_complete()
    _spm_check(tokenizer)
    cfg = vad_heads_of(lm, cfg, config_path)
    cfg = replace(cfg, tokenizer=tokenizer.name, source=source, source_revision=revision)
    return TranscriberFiles(source, cfg, lm, mimi, tokenizer, revision)


def resolve_transcriber(spec: str, progress: Callable[[str], None] = print) -> TranscriberFiles:
    """`spec`: a local directory or a hub repository id (kyutai/stt-1b-en_fr-candle). Its config
    and files are checked before anything long starts."""
    path = Path(spec).expanduser()
    if path.is_dir():
        config = path / CONFIG_FILE
        if not config.is_file():
            raise CheckpointError(f"{path} has no {CONFIG_FILE}: a Kyutai STT checkpoint "
                                  "directory holds config.json beside its weights")
        raw = _read_config(config)
        TranscriberConfig.from_kyutai(raw, str(config))  # what it is, before its files
        names = _names(raw, config)
        return _finish(str(path), config, *(path / n for n in names))
    if path.exists():
        raise CheckpointError(f"--transcriber {spec} is a file; give the checkpoint directory")
    if not _REPO_ID.match(spec) or spec.startswith((".", "/")):
        raise CheckpointError(f"--transcriber {spec} is neither a directory nor a hub "
                              "repository id (like kyutai/stt-1b-en_fr-candle)")
    config = hub_fetch(spec, CONFIG_FILE, True, None, progress)
    raw = _read_config(config)
    TranscriberConfig.from_kyutai(raw, f"{spec}/{CONFIG_FILE}")
    names = list(_names(raw, f"{spec}/{CONFIG_FILE}"))
    sizes = remote_sizes(spec, names)
    prepare_download(spec, sizes, names, progress, "a Kyutai STT checkpoint")
    files = [hub_fetch(spec, n, True, sizes, progress) for n in names]
    return _finish(spec, config, *files, revision=config.parent.name)


def check_shared_codec(stt: TranscriberFiles, mimi_cfg: PersonaPlexMimiConfig) -> None:
    """The transcriber reads the codes of PersonaPlex's own encode: only where the codec has
    the codebooks it reads. (That both use one codec is checked on the codes themselves, once
    its encoder is exported: transcriber_export.export_transcriber_encoder.)"""
    n_q = stt.config.num_audio_codebooks
    if not CODEBOOKS_PER_SPEAKER <= n_q <= mimi_cfg.num_quantizers:
        raise ConfigError(f"{stt.source}/{CONFIG_FILE}: field 'n_q' is {n_q}: the shared Mimi "
                          f"encode makes {CODEBOOKS_PER_SPEAKER}..{mimi_cfg.num_quantizers} "
                          "codebooks")


# ---- weights -------------------------------------------------------------------------------------

def expected_transcriber_tensors(cfg: TranscriberConfig) -> Shapes:
    """Every tensor of a Kyutai STT `model.safetensors` with the shape `cfg` implies: the
    temporal transformer's (131 for the 1B) and the VAD heads'."""
    shapes = temporal_tensors(cfg)
    for i in range(cfg.vad_heads):
        shapes[VAD_KEY.format(i)] = (cfg.vad_classes, cfg.temporal_config.hidden_size)
    return shapes


def open_transcriber_header(path: str | Path, cfg: TranscriberConfig) -> SafetensorsHeader:
    return checked_header(path, expected_transcriber_tensors(cfg), "Kyutai STT")


def transcriber_plan(cfg: TranscriberConfig) -> dict[str, WeightPlan]:
    """What each parameter of TranscriberStep is made of: Helium's, and the VAD heads stacked
    into one projection [heads * classes, D] (head after head)."""
    plan = temporal_plan(cfg, expected_transcriber_tensors(cfg))
    if cfg.vad_heads:
        plan["vad.weight"] = WeightPlan(
            tuple(Segment(VAD_KEY.format(i)) for i in range(cfg.vad_heads)),
            (cfg.vad_heads * cfg.vad_classes, cfg.temporal_config.hidden_size))
    return plan


# ---- the step --------------------------------------------------------------------------------------

class TranscriberStep(Helium):
    """Helium over 1 + n_q streams, greedy, with the VAD heads (module docstring)."""

    def __init__(self, cfg: TranscriberConfig):
        super().__init__(cfg)
        self.vad_heads, self.vad_classes = cfg.vad_heads, cfg.vad_classes
        if cfg.vad_heads:
            self.vad = nn.Linear(cfg.temporal_config.hidden_size,
                                 cfg.vad_heads * cfg.vad_classes, bias=False)

    def forward_outputs(self, tokens, position, past):
        """-> (text logits [B, V], VAD probabilities [B, heads, classes] or None, new rows)."""
        hidden, rows = self.forward_hidden(tokens, None, position, past)
        last = hidden[:, -1]  # [B, D]
        vad = None
        if self.vad_heads:
            vad = torch.softmax(self.vad(last).reshape(-1, self.vad_heads, self.vad_classes),
                                dim=-1)
        return self.text_linear(last), vad, rows

    def step(self, tokens, position, *ring):
        """The exported step (module docstring)."""
        past = list(zip(ring[0::2], ring[1::2]))
        logits, vad, rows = self.forward_outputs(tokens, position, past)
        token = torch.argmax(logits, dim=-1)  # [B]: greedy, first of equals as moshi's
        head = (token,) if vad is None else (token, vad)
        return (*head, *[t for kv in rows for t in kv])


def transcriber_inputs(cfg: TranscriberConfig, batch: int) -> list[TensorSpec]:
    return [TensorSpec(TOKENS, (batch, 1, cfg.num_streams), "int64"),  # [B, 1, 1 + n_q]
            TensorSpec(POSITION, (batch,), "int64")] + kv_ring_specs(cfg, batch)


def transcriber_outputs(cfg: TranscriberConfig) -> list[str]:
    return [TEXT_TOKEN] + ([VAD] if cfg.vad_heads else []) + [
        kv_output(i, kind) for i in range(cfg.temporal_config.num_hidden_layers)
        for kind in ("key", "value")]


def transcriber_jobs(cfg: TranscriberConfig, batch: int, k_max: int = 0):
    """The transcriber's one graph as lm.export_lm_graphs_frugal's `jobs` (see lm.lm_jobs):
    (name, module, step, input specs, output names, plans, streamed parts)."""
    step, = placeholder_modules([lambda: TranscriberStep(cfg)])
    streamed = [f"layers.{i}" for i in range(cfg.temporal_config.num_hidden_layers)] + [
        "text_linear"]
    return [(TRANSCRIBER_STEP, step, step.step, transcriber_inputs(cfg, batch),
             transcriber_outputs(cfg), transcriber_plan(cfg), streamed)]


# ---- into a model directory ---------------------------------------------------------------------

def export_transcriber_graph(stt: TranscriberFiles, out: Path, batch: int,
                             progress: Callable[[str], None], verify: str = "auto",
                             plan=None, taken: set[str] = frozenset(),
                             ) -> tuple[dict, dict[str, str], TranscriberConfig]:
    """Writes transcriber_step.onnx (its weights in `plan`'s precision, checked as `verify`
    says: lm.export_lm_graphs_frugal) and the transcriber's tokenizer into `out`. `taken`:
    file names the directory already uses. -> (graph entries, {file: sha256}, its config as
    the manifest records it)."""
    import shutil
    import time

    from .lm import export_lm_graphs_frugal

    t0 = time.perf_counter()
    progress(f"exporting the transcriber from {stt.lm}")
    graphs = export_lm_graphs_frugal(
        stt.config, stt.lm, out, batch=batch, verify=verify, progress=progress,
        precisions=None if plan is None else {TRANSCRIBER_STEP: plan},
        jobs=transcriber_jobs, open_header=open_transcriber_header)
    name = stt.tokenizer.name
    if name in taken:
        name = f"transcriber_{name}"
    shutil.copyfile(stt.tokenizer, out / name)
    cfg = replace(stt.config, tokenizer=name)
    heads = f", {cfg.vad_heads} VAD heads" if cfg.vad_heads else ", no VAD heads"
    progress(f"  {TRANSCRIBER_STEP}.onnx: {cfg.temporal_config.num_hidden_layers} layers, "
             f"{cfg.num_audio_codebooks} codebooks{heads}, written and checked "
             f"({time.perf_counter() - t0:.1f} s)")
    return graphs, {name: sha256_file(out / name)}, cfg
