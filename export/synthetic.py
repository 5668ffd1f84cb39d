"""Random checkpoints in the published layout, for the built-in demo model: PersonaPlex's, and
the demo's transcriber in the layout of Kyutai's STT checkpoints (sharing its Mimi file).

Weights come from this project's own modules (seeded), written under the published key names, so
the demo exercises exactly the loading path the real weights take. Such a model babbles, and
its transcriber hears babble.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from personaplex_edge.config import PersonaPlexConfig, preset
from personaplex_edge.transcriber import TRANSCRIBER_PRESETS, TranscriberConfig

from .hub import CONFIG_FILE, LM_FILE, MIMI_FILE, TOKENIZER_FILE, VOICES_FILE
from .mimi import Mimi, _checkpoint_name

# A little English for the demo tokenizer (the demo LM is random: the text it "says" is noise).
_CORPUS = """Hello, this is PersonaPlex running on the edge, on my own machine.
A full duplex model listens and speaks at the same time, eighty milliseconds per frame.
The codec turns speech into eight codes per frame, and the language model answers in kind.
You are a wise and friendly teacher. Answer questions or provide advice in a clear way.
How are you today? I am fine, thank you. What would you like to talk about?
The weather is nice, the sun is shining, and the birds are singing in the trees."""


@torch.no_grad()
def random_mimi_tensors(cfg: PersonaPlexConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    mc = cfg.mimi_config
    torch.manual_seed(seed)
    model = Mimi(mc)
    gen = torch.Generator().manual_seed(seed + 1)
    out = {}
    for name, p in model.state_dict().items():
        if name.startswith("quantizer."):
            continue
        if name.endswith("layer_scale_1.scale") or name.endswith("layer_scale_2.scale"):
            p = torch.rand(p.shape, generator=gen) * 0.5 + 0.25
        out[_checkpoint_name(name)] = p.contiguous()
    d, cd, bins = mc.hidden_size, mc.codebook_dim, mc.card
    # centroids at the scale of the projected latents, so that codes spread out
    scale = 0.5 / cd ** 0.5
    for part, count in (("rvq_first", mc.num_semantic_quantizers),
                        ("rvq_rest", mc.num_quantizers - mc.num_semantic_quantizers)):
        out[f"quantizer.{part}.input_proj.weight"] = torch.randn(cd, d, 1, generator=gen) / d ** 0.5
        out[f"quantizer.{part}.output_proj.weight"] = torch.randn(d, cd, 1, generator=gen) / cd ** 0.5
        for i in range(count):
            prefix = f"quantizer.{part}.vq.layers.{i}._codebook"
            out[f"{prefix}.embedding_sum"] = torch.randn(bins, cd, generator=gen) * scale
            out[f"{prefix}.cluster_usage"] = torch.ones(bins)
            out[f"{prefix}._initialized"] = torch.ones(1)
    return out


@torch.no_grad()
def random_lm_tensors(cfg: PersonaPlexConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every LM tensor of the published layout, random (bf16, as the real file stores them)."""
    from .lm import expected_lm_tensors

    return _random_lm_layout(expected_lm_tensors(cfg), seed + 2)


def _random_lm_layout(shapes: dict[str, tuple], seed: int,
                      scale: dict[str, float] | None = None) -> dict[str, torch.Tensor]:
    """Random bf16 tensors of a moshi-layout LM's `shapes`: norm gains 1, embedding rows of
    unit variance, linear layers [out, in] with rows of unit norm - or, for a key starting
    with one of `scale`'s prefixes, unit variance times that scale over sqrt(in)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in sorted(shapes.items()):
        prefix = next((p for p in scale or {} if key.startswith(p)), None)
        if key.endswith(".alpha"):
            t = torch.ones(shape)
        elif "emb" in key.split(".")[0]:
            t = torch.randn(shape, generator=gen)
        elif prefix is not None:
            t = torch.randn(shape, generator=gen) * scale[prefix] / shape[-1] ** 0.5
        else:  # a linear layer [out, in]
            t = torch.randn(shape, generator=gen) / shape[-1] ** 0.5
        out[key] = t.to(torch.bfloat16)
    return out


def train_tokenizer(path: str | Path, vocab_size: int = 200) -> Path:
    """A small SentencePiece model with the real one's special ids (0 unk, 1 BOS, 2 EOS,
    3 PAD) and the `<system>` tag of the text prompts as one piece."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS.splitlines()), model_writer=model,
        vocab_size=vocab_size, model_type="unigram", unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        user_defined_symbols=["<system>"], hard_vocab_limit=False, minloglevel=2)
    Path(path).write_bytes(model.getvalue())
    return Path(path)


def write_voices_tgz(path: str | Path, voices: dict[str, dict[str, torch.Tensor]]) -> Path:
    """A voice bank in the reference's format: `voices/NAME.pt` members of a tar.gz, each
    {"embeddings": [N, 1, 1, D], "cache": [1, 17, S]} saved with torch.save."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, state in voices.items():
            buf = io.BytesIO()
            torch.save(state, buf)
            info = tarfile.TarInfo(f"voices/{name}.pt")
            info.size = buf.tell()
            buf.seek(0)
            tar.addfile(info, buf)
    return Path(path)


# The names of the published voice bank (natural and varied, female and male): clients ask for
# them by name (PersonaPlex's web client for NATF0.pt), so the demo's bank has them all.
BANK_NAMES = tuple([f"NATF{i}" for i in range(4)] + [f"NATM{i}" for i in range(4)]
                   + [f"VARF{i}" for i in range(5)] + [f"VARM{i}" for i in range(5)])


TableRows = Callable[[str, torch.Tensor], torch.Tensor]  # (table key, row ids) -> rows float32


@torch.no_grad()
def random_voices(cfg: PersonaPlexConfig, rows: TableRows, seed: int = 0,
                  names: tuple[str, ...] = BANK_NAMES) -> dict[str, dict[str, torch.Tensor]]:
    """Voice prompts as the reference records them: the summed input embedding of each frame of
    random tokens, from the model's own tables (`rows`), and a token ring after them."""
    gen = torch.Generator().manual_seed(seed + 3)
    out = {}
    for name in names:
        frames = 8
        text = torch.randint(0, cfg.text_vocab_size, (frames,), generator=gen)
        emb = rows("text_emb.weight", text)  # [N, D]
        for k in range(cfg.num_audio_codebooks):
            codes = torch.randint(0, cfg.audio_vocab_size, (frames,), generator=gen)
            emb = emb + rows(f"emb.{k}.weight", codes)
        cache = torch.randint(0, cfg.audio_vocab_size, (1, 17, 4), generator=gen)
        cache[0, 0] = 3  # the text stream holds PAD during a voice prompt
        out[name] = {"embeddings": emb[:, None, None, :].to(torch.bfloat16), "cache": cache}
    return out


def file_rows(path: Path) -> TableRows:
    """Table rows read from a written LM file, one row at a time (a checkpoint too large to
    hold in memory)."""
    from .safetensors_file import SafetensorsHeader

    header = SafetensorsHeader(path)
    return lambda key, ids: torch.stack([torch.from_numpy(header.read_rows(key, r, r + 1)[0])
                                         for r in ids.tolist()])


def write_synthetic_checkpoint(cfg: PersonaPlexConfig, root: str | Path, seed: int = 0,
                               with_lm: bool = True, streamed: bool = False) -> Path:
    """A checkpoint directory for `cfg` with random weights in the published layout: Mimi,
    (the LM, a tokenizer and a voice bank,) and config.json. `streamed` writes the LM tensor
    by tensor (export/random_lm.py): any size in little memory, values from a shared pool."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    save_file(random_mimi_tensors(cfg, seed), str(root / MIMI_FILE))
    if with_lm:
        if streamed:
            from .random_lm import write_random_lm

            write_random_lm(cfg, root / LM_FILE, seed)
            rows = file_rows(root / LM_FILE)
        else:
            lm = random_lm_tensors(cfg, seed)
            save_file(lm, str(root / LM_FILE))
            rows = lambda key, ids: lm[key].float()[ids]  # noqa: E731
        write_voices_tgz(root / VOICES_FILE, random_voices(cfg, rows, seed))
        train_tokenizer(root / TOKENIZER_FILE, vocab_size=min(cfg.text_vocab_size, 200))
    (root / CONFIG_FILE).write_text(json.dumps(
        {"model_type": "personaplex", "version": "synthetic", **cfg.to_dict()}, indent=2))
    return root


VAD_LOGIT_STD = 2.0  # the random VAD heads' logits: their probabilities move with the audio


@torch.no_grad()
def random_transcriber_tensors(cfg: TranscriberConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of a Kyutai STT `model.safetensors` for `cfg`, random (bf16), the VAD
    heads' scaled so that their probability of no voice crosses the turn threshold now and
    then: a random transcriber whose turns end."""
    from .transcriber import VAD_KEY, expected_transcriber_tensors

    # the heads read a normed hidden state of unit rms: logits of std VAD_LOGIT_STD
    return _random_lm_layout(expected_transcriber_tensors(cfg), seed + 4,
                             {VAD_KEY.split(".")[0]: VAD_LOGIT_STD})


def write_synthetic_transcriber(raw: dict, root: str | Path, mimi_file: Path,
                                seed: int = 0) -> Path:
    """A Kyutai STT checkpoint directory with random weights for config.json `raw` (text_card
    left out: its tokenizer's size), sharing `mimi_file`, as resolve_transcriber reads one."""
    import shutil

    import sentencepiece as spm

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(root / raw["tokenizer_name"])
    raw = {**raw, "text_card": spm.SentencePieceProcessor(
        model_file=str(tokenizer)).get_piece_size()}
    cfg = TranscriberConfig.from_kyutai(raw, str(root / CONFIG_FILE))
    save_file(random_transcriber_tensors(cfg, seed), str(root / "model.safetensors"))
    shutil.copyfile(mimi_file, root / raw["mimi_name"])
    (root / CONFIG_FILE).write_text(json.dumps(raw, indent=2))
    return root


def write_builtin(name: str, root: str | Path) -> tuple[Path, Path | None]:
    """The checkpoints of built-in model `name` under `root`: PersonaPlex's, and its
    transcriber's where it has one (TRANSCRIBER_PRESETS) - (checkpoint, transcriber or None)."""
    root = Path(root)
    ckpt = write_synthetic_checkpoint(preset(name), root / "personaplex")
    raw = TRANSCRIBER_PRESETS.get(name)
    stt = None if raw is None else write_synthetic_transcriber(raw, root / "transcriber",
                                                               ckpt / MIMI_FILE)
    return ckpt, stt
