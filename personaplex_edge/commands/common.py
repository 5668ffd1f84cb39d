"""What several commands share: the flags of a conversation and of the runtime, the model
and conversation they load through the public API (runtime/api.py), and progress on stderr."""

from __future__ import annotations

import argparse
import sys

from ..contract import DEVICES

MODEL_HELP = ("model directory, an exported model on the Hugging Face hub (OWNER/NAME"
              "[@REVISION]), or a built-in model name (demo, tiny)")


def note(message: str) -> None:
    """Progress beside a command's own output on stdout (codes, a transcript)."""
    print(message, file=sys.stderr)


def sampling(args):
    from ..runtime.sampling import SamplingParams

    return SamplingParams(temp=args.temp, temp_text=args.temp_text, top_k=args.top_k,
                          top_k_text=args.top_k_text, greedy=args.greedy, seed=args.seed)


def persona_cache(args, progress=print):
    from ..runtime.persona_cache import PersonaCache

    return PersonaCache.sized(args.persona_cache_mb, args.persona_cache_dir, progress)


def load_model(args, progress=print):
    """The model of `args.model` through the public API (runtime/api.py), as an app loads it."""
    from ..runtime.api import load

    return load(args.model, device=args.device, threads=args.threads, progress=progress,
                persona_cache_mb=args.persona_cache_mb,
                persona_cache_dir=args.persona_cache_dir)


def conversation(args, progress=print):
    """The model of `args.model`, loaded, and one conversation on it, its persona run."""
    model = load_model(args, progress)
    conv = model.conversation(
        text_prompt=args.text_prompt, voice=args.voice_prompt, persona=not args.no_persona,
        greedy=args.greedy, seed=args.seed, temp=args.temp, temp_text=args.temp_text,
        top_k=args.top_k, top_k_text=args.top_k_text)
    if conv.prompt_frames:
        progress(f"persona: {conv.prompt_frames} prompt frames in "
                 f"{conv.core.prefill_seconds:.2f} s"
                 + (" (from the persona cache)" if conv.persona_cached else ""))
    return model, conv


def add_runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="where the graphs run: auto (an NVIDIA GPU where its backend works, "
                        "else a WebGPU GPU, else the CPU), cpu, cuda, or webgpu (AMD, Intel, "
                        "Apple, Qualcomm and NVIDIA GPUs through Vulkan, Metal or D3D12: "
                        "pip install 'personaplex-edge[webgpu]')")
    p.add_argument("--threads", type=int, default=None,
                   help="onnxruntime threads (default: PERSONAPLEX_THREADS, else all cores)")


def add_conversation_args(p: argparse.ArgumentParser, model_default: str | None = None) -> None:
    from ..runtime.persona import DEFAULT_TEXT_PROMPT
    from ..runtime.sampling import SamplingParams

    d = SamplingParams()  # the reference's defaults

    p.add_argument("--model", default=model_default, required=model_default is None,
                   help=MODEL_HELP)
    p.add_argument("--text-prompt", default=DEFAULT_TEXT_PROMPT, help="the persona's role")
    p.add_argument("--voice-prompt", default=None,
                   help="a voice of the model's bank (e.g. NATF2) or an audio file to imitate")
    p.add_argument("--no-persona", action="store_true", help="skip every prompt phase")
    p.add_argument("--persona-cache-mb", type=float, default=256,
                   help="prefilled personas kept in memory, at most this many MB (256; 0: none)")
    p.add_argument("--persona-cache-dir",
                   help="also keep prefilled personas in this directory, across runs")
    p.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampling noise")
    p.add_argument("--temp", type=float, default=d.temp, help=f"audio temperature ({d.temp})")
    p.add_argument("--temp-text", type=float, default=d.temp_text,
                   help=f"text temperature ({d.temp_text})")
    p.add_argument("--top-k", type=int, default=d.top_k, help=f"audio top-k ({d.top_k})")
    p.add_argument("--top-k-text", type=int, default=d.top_k_text,
                   help=f"text top-k ({d.top_k_text})")
    add_runtime_args(p)


def add_backlog_arg(p) -> None:
    p.add_argument("--max-backlog-frames", type=int, default=2,
                   help="input frames allowed to wait before the oldest are dropped (2)")
