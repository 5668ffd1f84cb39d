"""The transcriber's test reference: a Kyutai STT checkpoint with random weights, built by moshi's
own classes in stt-1b-en_fr's layout (32 codebooks, dep_q 0, 33 zero delays, the semantic-VAD
extra heads) at a small width and depth, saved as Kyutai publishes one, and moshi's own STT
inference on it.

Only tests and benchmarks import this. The checkpoint directory is what `moshi.run_inference
--hf-repo` reads: config.json (LMModel's arguments at the top level, model_type "stt",
stt_config, lm_gen_config, mimi_name, tokenizer_name, and the -candle weights' extra heads),
model.safetensors (bf16, moshi's names), the Mimi file and the SentencePiece model under the
names the config gives. Its Mimi is the PersonaPlex checkpoint's file: one codec for both.
"""

from __future__ import annotations

import os

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import json  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from personaplex_edge.config import PersonaPlexMimiConfig  # noqa: E402

MIMI_NAME = "mimi-pytorch-e351c8d8@125.safetensors"  # the names Kyutai's STT repos use
TOKENIZER_NAME = "tokenizer_en_fr_audio_8000.model"
MIMI_CONFIG = "mimi_config.json"  # moshi's Mimi arguments for a small codec (not published:
#                                   the real checkpoint uses moshi's default Mimi)


def stt_config(text_card: int, dim: int = 64, layers: int = 2, heads: int = 4,
               context: int = 24, vad_heads: int = 4, delay: float = 0.5) -> dict:
    """A config.json in stt-1b-en_fr's layout at a small size: the published keys (the
    depformer's sizes included: a dep_q 0 model builds no depformer), the -candle weights'
    extra heads declared, greedy decoding as Kyutai's lm_gen_config asks."""
    cfg = {
        "card": 2048, "n_q": 32, "dep_q": 0, "delays": [0] * 33, "dim": dim,
        "text_card": text_card, "existing_text_padding_id": 3, "num_heads": heads,
        "num_layers": layers, "hidden_scale": 4.125, "causal": True, "layer_scale": None,
        "context": context, "max_period": 100000.0, "gating": "silu", "norm": "rms_norm_f32",
        "positional_embedding": "rope", "depformer_dim": 1024, "depformer_num_heads": 16,
        "depformer_num_layers": 6, "depformer_dim_feedforward": None,
        "depformer_multi_linear": True, "depformer_pos_emb": "none",
        "depformer_weights_per_step": True, "conditioners": {}, "cross_attention": False,
        "model_id": {"sig": "random", "epoch": 0},
        "lm_gen_config": {"temp": 0.0, "temp_text": 0.0, "top_k": 250, "top_k_text": 50},
        "stt_config": {"audio_delay_seconds": delay, "audio_silence_prefix_seconds": 0.0},
        "model_type": "stt", "mimi_name": MIMI_NAME, "tokenizer_name": TOKENIZER_NAME,
    }
    if vad_heads:
        cfg.update(extra_heads_num_heads=vad_heads, extra_heads_dim=6)
    return cfg


def _lm_kwargs(config: dict) -> dict:
    """LMModel's arguments from a config.json, as moshi's loaders read them."""
    drop = {"model_type", "lm_gen_config", "stt_config", "mimi_name", "tokenizer_name",
            "model_id", "conditioners"}
    return {k: v for k, v in config.items() if k not in drop}


@torch.no_grad()
def reference_stt(config: dict, seed: int = 0):
    """moshi's LMModel for `config`, float32, random bf16-representable weights with random
    norm gains (moshi_lm_reference.randomise) and VAD heads."""
    from moshi.models.lm import LMModel

    from moshi_lm_reference import randomise

    torch.manual_seed(seed)
    model = LMModel(**_lm_kwargs(config), device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    for head in model.extra_heads:  # logits of a few units: the probabilities move
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.5)
    randomise(model, gen)
    assert model.dep_q == 0 and model.depformer is None
    return model.eval()


@torch.no_grad()
def teach_silence(model, mimi, pcm: np.ndarray, spoken: int, head: int = 2,
                  sharpness: float = 5.0) -> None:
    """The VAD head `head` (moshi's model, in place) made to tell silence from sound, as a
    trained one does: class 0 ("no voice ahead") scores the normed hidden state's alignment
    with its mean over the silence that follows sound in `pcm` (its frames from `spoken` on),
    the other classes with its mean over the sound (moshi's own steps on `mimi`'s codes, a
    moshi MimiModel making n_q codes). So the tests' audio ends a turn where it falls silent,
    whatever the random weights."""
    from moshi.models import LMGen

    hidden: list[torch.Tensor] = []
    hook = model.out_norm.register_forward_hook(lambda m, i, o: hidden.append(o[:, 0].clone()))
    frame = int(mimi.sample_rate / mimi.frame_rate)
    gen = LMGen(model, temp=0, temp_text=0)
    try:
        with mimi.streaming(1), gen.streaming(1):
            for i in range(pcm.shape[0] // frame):
                gen.step(mimi.encode(torch.from_numpy(
                    pcm[None, None, i * frame:(i + 1) * frame]).float()))
    finally:
        hook.remove()
    states = torch.cat(hidden)  # [frames, D]

    def direction(rows: torch.Tensor) -> torch.Tensor:
        mean = rows.mean(0)
        return mean / mean.norm()

    weight = model.extra_heads[head].weight  # [classes, D]
    weight[0] = sharpness * direction(states[spoken + 3:])  # past the delay's first frames
    weight[1:] = sharpness * direction(states[3:spoken])
    weight.copy_(weight.to(torch.bfloat16).float())


def write_stt_checkpoint(root: str | Path, config: dict, model, mimi_file: Path,
                         tokenizer: Path, mimi_cfg: PersonaPlexMimiConfig) -> Path:
    """The checkpoint directory (module docstring), plus moshi's arguments of the small Mimi
    in MIMI_CONFIG for the reference to build it."""
    from moshi_lm_reference import save_published_lm
    from moshi_reference import moshi_mimi_kwargs

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    save_published_lm(model, root / "model.safetensors")
    shutil.copyfile(mimi_file, root / config["mimi_name"])
    shutil.copyfile(tokenizer, root / config["tokenizer_name"])
    (root / "config.json").write_text(json.dumps(config, indent=2))
    (root / MIMI_CONFIG).write_text(json.dumps(moshi_mimi_kwargs(mimi_cfg)))
    return root


# ---- a codec whose 32 codebooks decide clearly ---------------------------------------------------
# Residual quantisation shrinks the residual level after level: with reference_mimi's codebooks
# (2048 centroids drawn around each level's residual) it is 0.1 % of the latent by codebook 31,
# so a latent that differs from moshi's in its 7th digit (another float32 order of operations)
# can flip a deep code, and no input of 60 frames is clear of that at all 32 levels. Here each
# level keeps `active` centroids near its residual (drawn level by level, as reference_mimi
# does) and sends the rest far away: every code still varies and all 32 feed the transcriber,
# but each decision is between a few centroids, clear of float noise.
LATENT_MARGIN = 1e-6  # (second nearest - nearest) / the largest latent, at every decision


def sparse_codebooks(model, active: int = 8, spread: float = 0.3, seed: int = 11):
    """Re-randomises `model`'s (a moshi MimiModel) codebooks as the comment above says."""
    from moshi_reference import draw_codebooks

    draw_codebooks(model, torch.Generator().manual_seed(seed), active, spread)
    return model


def clear_input(run, make_input, tries: int = 8):
    """(input, run(input)) for the first seed whose every codebook decision (in moshi's Mimi,
    which `run` encodes it with) is clear by LATENT_MARGIN of the largest latent."""
    from moshi.quantization.core_vq import EuclideanCodebook

    original = EuclideanCodebook._quantize
    gaps: list[tuple[float, float]] = []

    def quantize(self, x):
        d = torch.cdist(x[None].double(), self.embedding[None].double())[0]  # [N, bins]
        two = torch.topk(d, 2, dim=-1, largest=False).values  # [N, 2]
        gaps.append((float((two[:, 1] - two[:, 0]).min()), float(x.double().norm(dim=-1).max())))
        return original(self, x)

    best = 0.0
    for seed in range(tries):
        pcm = make_input(seed)
        gaps.clear()
        EuclideanCodebook._quantize = quantize
        try:
            result = run(pcm)
        finally:
            EuclideanCodebook._quantize = original
        margin = min(g for g, _ in gaps) / max(n for _, n in gaps)
        if margin >= LATENT_MARGIN:
            return pcm, result
        best = max(best, margin)
    raise AssertionError(f"no input of {tries} quantizes clear of ties (best margin {best:.2g})")


def checkpoint_info(root: Path):
    from moshi.models import loaders

    return loaders.CheckpointInfo.from_hf_repo(
        str(root), moshi_weights=root / "model.safetensors",
        mimi_weights=root / MIMI_NAME, tokenizer=root / TOKENIZER_NAME,
        config_path=root / "config.json", mimi_config_path=root / MIMI_CONFIG)


@torch.no_grad()
def reference_transcribe(root: Path, pcm: np.ndarray, with_vad: bool = True) -> dict:
    """moshi's own STT inference on `pcm` (24 kHz, any length): run_inference's
    InferenceState.run, first frame fed twice and the audio padded as it pads it (the silence
    prefix before, `audio_delay_seconds` + 1 s of silence after), the text token of every
    step taken from LMGen's on_text_hook; and the VAD heads' probabilities from
    LMGen.step_with_extra_heads on the same codes, on the same schedule. Returns text: every
    token it writes after its first step's and the prefix's - the input's frames, then the
    silence after them (moshi's whole output); and per whole input frame vad [F, heads,
    classes] and Mimi's codes [F, n_q] (the text alone for a checkpoint with a silence prefix,
    or without `with_vad`)."""
    from moshi.models import LMGen
    from moshi.run_inference import InferenceState

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is many times faster on a busy CPU
    try:
        return _transcribe(root, pcm, InferenceState, LMGen, with_vad)
    finally:
        torch.set_num_threads(threads)


def _transcribe(root: Path, pcm: np.ndarray, InferenceState, LMGen, with_vad: bool) -> dict:
    info = checkpoint_info(root)
    mimi = info.get_mimi(device="cpu")
    lm = info.get_moshi(device="cpu", dtype=torch.float32)
    tokens: list[int] = []
    state = InferenceState(info, mimi, info.get_text_tokenizer(), lm, batch_size=1,
                           cfg_coef=1.0, device="cpu",
                           on_text_hook=lambda t: tokens.append(int(t[0])),
                           **info.lm_gen_config)
    frames = pcm.shape[0] // mimi.frame_size
    state.run(torch.from_numpy(pcm[None, None, :]).float())
    # the first step read the initial tokens only; then the silence prefix's whole frames
    # (run_inference pads int(seconds x rate) samples: the frame after them straddles the
    # audio's start, and is the first the runtime records)
    skip = int(info.stt_config.get("audio_silence_prefix_seconds", 0.0) * mimi.sample_rate) \
        // mimi.frame_size
    text = np.array(tokens[1 + skip:])
    if skip or not with_vad:
        return {"text": text}

    # the VAD heads: the same steps again through step_with_extra_heads (a fresh model:
    # InferenceState keeps the first one streaming)
    mimi = info.get_mimi(device="cpu")
    gen = LMGen(info.get_moshi(device="cpu", dtype=torch.float32), **info.lm_gen_config)
    vad, codes_out = [], []
    with mimi.streaming(1), gen.streaming(1):
        for i in range(frames):
            codes = mimi.encode(torch.from_numpy(
                pcm[None, None, i * mimi.frame_size:(i + 1) * mimi.frame_size]).float())
            codes_out.append(codes[0, :, 0].numpy())
            if i == 0:
                gen.step_with_extra_heads(codes)
            out, heads = gen.step_with_extra_heads(codes)
            vad.append(torch.stack([h[0, 0] for h in heads]).numpy() if heads else None)
    return {"text": text, "vad": None if vad[0] is None else np.stack(vad),
            "codes": np.stack(codes_out)}
