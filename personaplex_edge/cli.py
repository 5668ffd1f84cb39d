"""The `personaplex-edge` command.

Every user-facing failure is a PersonaPlexError: its message is printed alone (no traceback) and
the exit status is non-zero. Torch is imported only by `export` (and by the first use of a
built-in model, which is exported on the spot).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import __version__
from .contract import BACKENDS, DEVICES, PRECISIONS
from .errors import PersonaPlexError
from .model_ref import need_export_extra, resolve_model

PRECISION_CHOICES = PRECISIONS  # from the contract: building the parser needs no export extra
MODEL_HELP = ("model directory, an exported model on the Hugging Face hub (OWNER/NAME"
              "[@REVISION]), or a built-in model name (demo, tiny)")


class SayAction(argparse.Action):
    """`--say TEXT` and `--say-at SECONDS` into one list of (text, seconds or None), in their
    order on the command line: a --say-at times the --say before it, and only that one."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        says = list(getattr(namespace, self.dest) or [])
        if option_string == "--say":
            says.append((value, None))
        else:
            if not says:
                parser.error(f"--say-at {value:g} before any --say: give it after the --say "
                             "it times")
            text, at = says[-1]
            if at is not None:
                parser.error(f"a second --say-at for --say {text!r}: each --say takes one, "
                             "after it")
            if not value >= 0 or value == float("inf"):
                parser.error(f"--say-at {value}: seconds from the start of the input, >= 0")
            says[-1] = (text, value)
        setattr(namespace, self.dest, says)


def _note(message: str) -> None:
    """Progress beside a command's own output on stdout (codes, a transcript)."""
    print(message, file=sys.stderr)


def _need_serve_extra() -> None:
    # checked before the server's modules are imported: they import these at their top
    for module in ("aiohttp", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            raise PersonaPlexError(
                f"serve needs the serve extra ({module} is missing): pip install "
                '"personaplex-edge[serve]"') from None
    from .runtime.serve.opus import check_opus  # Opus is the system's libopus

    check_opus()


def cmd_export(args) -> int:
    if args.push_to_hub:  # no token: refused now, not after an hour of export
        from .publish import require_token

        require_token(args.push_to_hub)
    elif args.private:
        raise PersonaPlexError("--private goes with --push-to-hub OWNER/NAME")
    need_export_extra()
    if args.checkpoint is None:
        return _export_transcriber(args)
    from .export.hub import resolve_checkpoint
    from .export.model_export import export_model
    from .export.precision_plan import check_plans

    # what cannot run is refused before a checkpoint is downloaded or anything written
    check_plans(args.precision, args.backend, args.kv_dtype, args.depformer_precision,
                (args.transcriber_precision or args.precision) if args.transcriber else None,
                args.compute)
    if args.batch < 1:
        raise PersonaPlexError(f"--batch {args.batch}: the conversations a graph call steps "
                               "must be at least 1")
    from .runtime.backends.engines_entry import export_builder

    # TensorRT, onnx, the targets (a GPU for mainline TensorRT) are checked now, not after an
    # hour of export
    precisions = [args.precision, args.depformer_precision or args.precision]
    if args.transcriber:  # its graph's engine is built too
        precisions.append(args.transcriber_precision or args.precision)
    builder = export_builder(args, precisions)
    t0 = time.perf_counter()
    ckpt = resolve_checkpoint(args.checkpoint, with_lm=not args.codec_only)
    transcriber = None
    if args.transcriber:
        from .export.transcriber import resolve_transcriber

        transcriber = resolve_transcriber(args.transcriber)
    export_model(ckpt, args.out, precision=args.precision, backend=args.backend,
                 batch=args.batch, kv_dtype=args.kv_dtype, engine_builder=builder,
                 verify=args.verify, depformer_precision=args.depformer_precision,
                 transcriber=transcriber, transcriber_precision=args.transcriber_precision,
                 compute=args.compute)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    if args.push_to_hub:
        from .publish import push_model

        print(f"published: {push_model(args.out, args.push_to_hub, args.private)}")
    return 0


def _export_transcriber(args) -> int:
    """`export --transcriber STT --out DIR` without --checkpoint: the transcriber added to the
    model already exported at DIR (export/transcriber_export.py). The flags that cannot apply
    to it are refused first; the engine flags build its graphs' engines on a TensorRT model;
    --push-to-hub publishes the result."""
    if not args.transcriber:
        raise PersonaPlexError("export needs --checkpoint (or --transcriber STT_CHECKPOINT "
                               "alone, to add a transcriber to the model at --out)")
    if not (Path(args.out) / "manifest.json").is_file():
        raise PersonaPlexError(f"--out {args.out} is not an exported model: give --checkpoint "
                               "to export one with the transcriber, or --out an exported model")
    from .contract import HELIUM_STEP
    from .export.transcriber import resolve_transcriber
    from .export.transcriber_export import add_transcriber, builds_engines, check_add_flags
    from .manifest import read_manifest

    manifest, _ = read_manifest(Path(args.out) / "manifest.json")
    check_add_flags(args, manifest, args.out)
    builder = None
    if builds_engines(args, manifest):  # checked now, not after the export
        from .runtime.backends.engines_entry import export_builder

        precision = args.transcriber_precision or manifest.graphs[HELIUM_STEP].precision
        builder = export_builder(argparse.Namespace(**{**vars(args), "backend": "tensorrt"}),
                                 ["fp32", precision])
    t0 = time.perf_counter()
    add_transcriber(args.out, resolve_transcriber(args.transcriber),
                    precision=args.transcriber_precision, verify=args.verify,
                    engine_builder=builder, compute=args.compute)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    if args.push_to_hub:
        from .publish import push_model

        print(f"published: {push_model(args.out, args.push_to_hub, args.private)}")
    return 0


def cmd_verify(args) -> int:
    """Hashes, graph signatures and, with --checkpoint, each graph against its torch module;
    every finding printed, exit 1 on any disagreement (2: nothing could be verified)."""
    from .atomic import write_text_atomic
    from .runtime.verify import verify_model

    if args.checkpoint:  # before a download or an hour of hashing
        need_export_extra()
    model_dir = resolve_model(args.model, _note)
    report, manifest = verify_model(model_dir, args.model, progress=_note)
    if args.checkpoint:
        from .export.check_export import against_checkpoint

        report.findings += against_checkpoint(model_dir, manifest, args.checkpoint, _note,
                                              transcriber=args.transcriber)
    from .devices import model_devices

    for finding in report.findings:
        print(finding.line())
    print("runs on: " + "; ".join(model_devices(manifest)))
    if args.json:
        write_text_atomic(Path(args.json), report.to_json())
    failures = report.failures()
    print(f"{args.model}: " + ("verified" if not failures else
                               f"{len(failures)} disagreement(s): "
                               + ", ".join(f"{f.check} {f.target}" for f in failures)))
    return 0 if not failures else 1


def cmd_codec(args) -> int:
    import numpy as np

    from .audio import read_audio, save_array_atomic, write_audio
    from .runtime.codec import Codec

    if args.codes_out is None and args.output is None:
        raise PersonaPlexError("nothing to write: give --codes-out and/or --output")
    codec = Codec.load(resolve_model(args.model, _note), device=args.device,
                       threads=args.threads, progress=_note)
    pcm = read_audio(args.input, codec.sample_rate)
    t0 = time.perf_counter()
    codes = codec.encode(pcm)
    t_enc = time.perf_counter() - t0
    frames = codes.shape[0]
    line = (f"{args.input}: {pcm.shape[0] / codec.sample_rate:.2f} s, {frames} frames; "
            f"encode {1000 * t_enc / frames:.1f} ms/frame")
    if args.output is not None:
        t0 = time.perf_counter()
        recon = codec.decode(codes)[:pcm.shape[0]]
        line += f", decode {1000 * (time.perf_counter() - t0) / frames:.1f} ms/frame"
        write_audio(args.output, recon, codec.sample_rate)
    if args.codes_out is not None:
        save_array_atomic(args.codes_out, codes.astype(np.int64))
    print(line)
    return 0


def _sampling(args):
    from .runtime.sampling import SamplingParams

    return SamplingParams(temp=args.temp, temp_text=args.temp_text, top_k=args.top_k,
                          top_k_text=args.top_k_text, greedy=args.greedy, seed=args.seed)


def _persona_cache(args, progress=print):
    from .runtime.persona_cache import PersonaCache

    return PersonaCache.sized(args.persona_cache_mb, args.persona_cache_dir, progress)


def _load_model(args, progress=print):
    """The model of `args.model` through the public API (runtime/api.py), as an app loads it."""
    from .runtime.api import load

    return load(args.model, device=args.device, threads=args.threads, progress=progress,
                persona_cache_mb=args.persona_cache_mb,
                persona_cache_dir=args.persona_cache_dir)


def _conversation(args, progress=print):
    """The model of `args.model`, loaded, and one conversation on it, its persona run."""
    model = _load_model(args, progress)
    conv = model.conversation(
        text_prompt=args.text_prompt, voice=args.voice_prompt, persona=not args.no_persona,
        greedy=args.greedy, seed=args.seed, temp=args.temp, temp_text=args.temp_text,
        top_k=args.top_k, top_k_text=args.top_k_text)
    if conv.prompt_frames:
        progress(f"persona: {conv.prompt_frames} prompt frames in "
                 f"{conv.core.prefill_seconds:.2f} s"
                 + (" (from the persona cache)" if conv.persona_cached else ""))
    return model, conv


class _LiveStatus:
    """The live loop's status line (frame times over the last 100 frames, drops, underruns),
    and once, past start-up, a warning when the machine runs the model slower than real time:
    the drops are then the machine's limit, not a glitch, and the fix is another export."""

    def __init__(self, warn_after_frames: int = 25):
        self.warn_after_frames = warn_after_frames
        self.warned = False

    def __call__(self, loop) -> None:
        s = loop.stats
        t = s.timing.summary(last=100)
        frame_ms = t.get("frame", {"p50": 0.0, "p99": 0.0})
        line = (f"frames {s.frames}  frame {frame_ms['p50']:.1f}/{frame_ms['p99']:.1f} ms "
                f"(p50/p99)  dropped {s.dropped_frames}  underruns {s.underruns}"
                + s.status())
        live = sys.stderr.isatty()
        print(("\r" + line + "   ") if live else line, end="" if live else "\n",
              file=sys.stderr, flush=True)
        budget = s.timing.budget_ms
        if (not self.warned and s.frames >= self.warn_after_frames
                and frame_ms["p50"] > budget):
            self.warned = True
            print(f"\nwarning: a frame takes {frame_ms['p50']:.0f} ms (p50) against its "
                  f"{budget:.0f} ms of audio: this machine runs this model slower than real "
                  "time, so input is being dropped. Export a lower --precision or use a GPU "
                  "backend (README: which export for which machine).", file=sys.stderr,
                  flush=True)


def _live_summary(loop, conv) -> None:
    from .runtime.metrics import format_summary

    s = loop.stats
    print(file=sys.stderr)
    print(f"{'stopped' if s.interrupted else 'done'}: {s.frames} frames, {s.dropped_frames} "
          f"dropped, {s.underruns} underruns, {s.input_overflows} input overflows",
          file=sys.stderr)
    for line in s.report():  # echo cancelled, answer lost to clock drift
        print(line, file=sys.stderr)
    print(format_summary(conv.metrics.summary()), file=sys.stderr)


def cmd_run(args) -> int:
    """A recording in, the model's answer out (same length), text per frame: as fast as the
    machine goes, or with --realtime through the live loop at the pace of a microphone."""
    from .audio import read_audio, write_audio
    from .runtime.metrics import format_summary
    from .runtime.words.text import Transcript, write_records
    from .transcriber import no_transcriber

    pcm = read_audio(args.input)  # before the model loads: a bad file fails fast
    from .runtime.words.say import check_say_text, said_line

    says = [(at or 0.0, check_say_text(text, "--say")) for text, at in args.says or []]
    model, conv = _conversation(args)
    if args.user_text_out and not conv.transcribing:
        raise PersonaPlexError(f"--user-text-out: {no_transcriber(model.model_dir)}")
    if args.realtime:
        import numpy as np

        from .runtime.audio_io.paced_file import run_paced
        from .runtime.words.say import SayPlan

        transcript = Transcript(model.text, records=bool(args.text_out))
        heard = Transcript(model.loaded.heard_text, records=True) if conv.transcribing else None
        plan = SayPlan(says, model.sample_rate / model.frame_size)

        def step(frame):
            plan.say_due(conv.position - conv.prompt_frames, conv.say)
            audio, token = conv.core.step(frame)
            transcript.add(token)
            if heard is not None:
                heard.add(conv.core.heard_token)
            return audio

        # the last frame completed with silence, as respond() does: every sample is heard
        padding = (-pcm.shape[0]) % model.frame_size
        out, loop = run_paced(step, np.concatenate([pcm, np.zeros(padding, pcm.dtype)]),
                              frame_size=model.frame_size,
                              max_backlog_frames=args.max_backlog_frames, on_tick=_LiveStatus())
        if heard is not None:  # the words still inside the transcriber's delay (heard.md)
            for token in conv.core.flush_heard(padding):
                heard.add(token)
        text, records = transcript.text, transcript.records
        user_text, user_records = (heard.text, heard.records) if heard else ("", [])
    else:
        response = conv.respond(pcm, say=says)
        out, text, records = response.pcm, response.text, response.records
        user_text, user_records = response.heard, response.heard_records
    write_audio(args.output, out[:pcm.shape[0]])
    if args.text_out:
        write_records(args.text_out, records)
    if args.user_text_out:
        write_records(args.user_text_out, user_records)
    if args.realtime:
        _live_summary(loop, conv)  # first: it ends the status line the transcript would join
    print(text or "(no text)")
    if conv.transcribing:
        print(f"heard: {user_text or '(nothing)'}")
    if says:
        conv.cancel_say()  # the input is over: what was not reached is reported as such
        print(said_line(conv.say_events(), conv.prompt_frames), file=sys.stderr)
    if not args.realtime:
        print(format_summary(conv.metrics.summary()))
    return 0


def cmd_mic(args) -> int:
    """Full duplex on the sound devices until Ctrl-C (or --duration seconds)."""
    model, conv = _conversation(args, progress=_note)
    if conv.transcribing:  # what the user said, turn by turn (docs/heard.md)
        def heard(event):
            if event.kind == "turn":
                print(f"\n[heard: {event.text}]", flush=True)
        conv.on_heard = heard
    print("listening; Ctrl-C to stop", file=sys.stderr)
    loop = conv.live(on_text=lambda piece: print(piece, end="", flush=True),
                     input_device=args.input_device, output_device=args.output_device,
                     duration=args.duration, on_tick=_LiveStatus(),
                     max_backlog_frames=args.max_backlog_frames, aec=args.aec == "on",
                     progress=_note)
    _live_summary(loop, conv)
    return 0


def cmd_batch(args) -> int:
    """Many recordings, unpaced, in lockstep (runtime/batch): the answers beside them or under
    --output, a summary, exit 1 when any item failed."""
    import time

    from .runtime.batch import find_items, parse_shard, run_batch, shard
    from .runtime.persona import Persona

    k, n = parse_shard(args.shard)  # before the model loads: a bad flag fails fast
    layout = find_items(args.input, args.output)
    items = shard(layout.items, k, n)
    if args.rows is not None and args.rows < 1:
        raise PersonaPlexError("--rows must be at least 1")
    if args.workers is not None and args.workers < 1:
        raise PersonaPlexError("--workers must be at least 1")
    # the model's batch and backend decide the default, before anything is loaded: on a
    # batch-1 model on the CPU a worker per core, each session call on one thread, beats one
    # item at a time on every core (README, Measured: Batch - 1.4-1.5x on the demo model,
    # 1.07x on the mid one)
    from .manifest import load_model_dir
    from .runtime.backends import cpu_only

    args.model = str(resolve_model(args.model, _note))  # a hub id is fetched once
    manifest = load_model_dir(args.model, need="lm", progress=_note)
    cores = os.cpu_count() or 1
    workers = args.workers or 1
    if args.workers is None and cores > 1 and manifest.batch == 1 \
            and cpu_only(manifest, args.device):
        workers = cores
        if args.threads is None:
            args.threads = 1
    model = _load_model(args, _note)
    model.text  # every item's prompt and text need it: a model without one stops here
    _note(f"{layout.kind}: {len(items)} of {len(layout.items)} items (shard {k}/{n}), "
          f"{args.rows or model.batch} at a time"
          + (f" by each of {workers} workers" if workers > 1 else "")
          + f" on {model.model_dir}")
    summary = run_batch(model, items, _sampling(args),
                        Persona(text_prompt=args.text_prompt, voice=args.voice_prompt,
                                enabled=not args.no_persona),
                        overwrite=args.overwrite, codes=args.codes, rows=args.rows,
                        workers=workers)
    summary.extra = {"model": str(model.model_dir), "input": str(args.input),
                     "layout": layout.kind, "shard": f"{k}/{n}",
                     "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "flags": {"greedy": args.greedy, "seed": args.seed, "temp": args.temp,
                               "temp_text": args.temp_text, "top_k": args.top_k,
                               "top_k_text": args.top_k_text}}
    name = "batch-summary.json" if n == 1 else f"batch-summary-{k}-of-{n}.json"
    summary.write(layout.summary_dir / name)
    counts = summary.to_json()["counts"]
    print(f"{counts['done']} done, {counts['skipped']} skipped (finished before), "
          f"{counts['failed']} failed, {counts['interrupted']} interrupted; "
          f"{summary.audio_seconds / 3600:.3f} h of audio in {summary.wall_seconds:.1f} s "
          f"({summary.to_json()['times_real_time']:.1f}x real time); summary: "
          f"{layout.summary_dir / name}")
    if summary.interrupted:
        raise KeyboardInterrupt
    if counts["failed"]:
        print(f"personaplex-edge: {counts['failed']} item(s) failed (listed above and in the "
              "summary)", file=sys.stderr)
        return 1
    return 0


def cmd_decode(args) -> int:
    """A codes file of batch --codes -> the audio the batch wrote (Mimi decoder alone)."""
    from .audio import write_audio
    from .runtime.batch import AgentCodes
    from .runtime.codec import Codec

    codes = AgentCodes.load(args.codes)  # before the model loads
    codec = Codec.load(resolve_model(args.model, _note), device=args.device,
                       threads=args.threads, progress=_note)
    write_audio(args.output, codes.to_audio(codec), codec.sample_rate)
    print(f"{args.codes}: {codes.codes.shape[0]} frames -> {args.output} "
          f"({codes.samples / codes.sample_rate:.2f} s)")
    return 0


def cmd_stdio(args) -> int:
    """One conversation over stdin/stdout in framed messages (runtime/stdio.py)."""
    from .runtime.stdio import serve_stdio

    if args.max_backlog_frames is not None and args.max_backlog_frames < 0:
        raise PersonaPlexError("--max-backlog-frames must be 0 or more")
    return serve_stdio(lambda: _conversation(args, progress=_note)[1],
                       args.max_backlog_frames, progress=_note)


def cmd_bench(args) -> int:
    """Per-stage timings of N conversations on one model (the bundled speech sample, looped):
    per stream, per round and the largest N that keeps up (runtime/bench.py)."""
    import json

    from .atomic import write_text_atomic
    from .runtime.audio_io.echo import TimedStage
    from .runtime.bench import plot, run_bench
    from .runtime.persona import Persona

    if args.plot:  # before the run: a missing matplotlib fails now, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise PersonaPlexError("--plot needs matplotlib: pip install "
                                   "'personaplex-edge[plot]'") from None
    model = _load_model(args)
    persona = Persona(text_prompt=args.text_prompt, voice=args.voice_prompt,
                      enabled=not args.no_persona)

    def canceller(conv):
        # the echo canceller on the bench's frames: the input as the microphone, the answer
        # as what the speaker played (its "aec" stage; absent without libspeexdsp)
        return TimedStage(conv.metrics, model.sample_rate, model.frame_size, warn=_note)

    result = run_bench(model, args.frames, args.warmup, args.streams, _sampling(args), persona,
                       front=canceller if args.aec == "on" else None, position=args.position)
    print(f"{model.model_dir}: {args.streams} stream(s), {args.frames} frames after "
          f"{args.warmup} warm-up, position {result.position} (context {result.context}), "
          f"on {model.device}")
    print(result.report())
    if args.json:
        data = {"model": str(model.model_dir), **result.to_json()}
        write_text_atomic(Path(args.json), json.dumps(data))
    if args.plot:
        plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0


def cmd_aec(args) -> int:
    """The --mic echo canceller over two recordings (runtime/audio_io/echo.py)."""
    from .runtime.audio_io.echo import cancel_file

    print(cancel_file(args.mic, args.ref, args.output, args.delay_ms))
    return 0


def cmd_devices(args) -> int:
    from .runtime.audio_io.devices import list_devices

    print(list_devices())
    return 0


def cmd_serve(args) -> int:
    """The moshi/PersonaPlex and OpenAI Realtime WebSocket protocols and a web page, until
    Ctrl-C (runtime/serve)."""
    _need_serve_extra()
    from .runtime.persona import Persona
    from .runtime.serve import ServeOptions, serve

    model_dir = resolve_model(args.model, _note)
    return serve(ServeOptions(
        model_dir=model_dir, model_name=args.model if not Path(args.model).is_dir()
        else model_dir.name, host=args.host, port=args.port, max_sessions=args.max_sessions,
        ssl_dir=Path(args.ssl) if args.ssl else None, auth_token=args.auth_token,
        allowed_origins=_listed(args.allowed_origins), allowed_hosts=_listed(args.allowed_hosts),
        voice_dir=Path(args.voice_dir) if args.voice_dir else None, sampling=_sampling(args),
        persona=Persona(text_prompt=args.text_prompt, voice=args.voice_prompt,
                        enabled=not args.no_persona),
        max_backlog=args.max_backlog_frames, device=args.device, threads=args.threads,
        persona_cache=_persona_cache(args, _note), ice_servers=tuple(args.ice_server or ()),
        turn_username=args.turn_username, turn_credential=args.turn_credential),
        progress=_note)


def _listed(value: str | None) -> tuple[str, ...]:
    """A comma-separated flag's entries."""
    return tuple(value.split(",")) if value else ()


def _add_runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="where the graphs run: auto (an NVIDIA GPU where its backend works, "
                        "else a WebGPU GPU, else the CPU), cpu, cuda, or webgpu (AMD, Intel, "
                        "Apple, Qualcomm and NVIDIA GPUs through Vulkan, Metal or D3D12: "
                        "pip install 'personaplex-edge[webgpu]')")
    p.add_argument("--threads", type=int, default=None,
                   help="onnxruntime threads (default: PERSONAPLEX_THREADS, else all cores)")


def _add_conversation_args(p: argparse.ArgumentParser, model_default: str | None = None) -> None:
    from .runtime.persona import DEFAULT_TEXT_PROMPT
    from .runtime.sampling import SamplingParams

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
    _add_runtime_args(p)


def _add_backlog_arg(p) -> None:
    p.add_argument("--max-backlog-frames", type=int, default=2,
                   help="input frames allowed to wait before the oldest are dropped (2)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="personaplex-edge",
        description="Run NVIDIA PersonaPlex on your own machine (ONNX / TensorRT, no torch).")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("export", help="checkpoint (directory or hub repo) -> model directory")
    e.add_argument("--checkpoint",
                   help="checkpoint directory or Hugging Face repo, e.g. nvidia/personaplex-7b-v1 "
                        "(leave it out with --transcriber to add one to the model at --out)")
    e.add_argument("--transcriber", metavar="STT_CHECKPOINT",
                   help="also hear the user: a Kyutai STT checkpoint (directory or hub repo, e.g. "
                        "kyutai/stt-1b-en_fr-candle) whose step runs beside the model's on the "
                        "same Mimi codes (docs/heard.md)")
    e.add_argument("--transcriber-precision", choices=PRECISION_CHOICES,
                   help="the transcriber's precision (default: --precision, or the model's)")
    e.add_argument("--out", required=True, help="model directory to write")
    e.add_argument("--precision", default="fp32", choices=PRECISION_CHOICES,
                   help="weights of the language model (the codec stays fp32); int8/int4 are "
                        "weight-only; fp8 is TensorRT only")
    e.add_argument("--depformer-precision", choices=PRECISION_CHOICES,
                   help="the depformer's own precision (default: --precision). It is ~9%% of "
                        "the 7B's weights and makes the audio tokens: e.g. --precision "
                        "int4 --depformer-precision int8")
    e.add_argument("--compute", choices=["float16", "float32"],
                   help="with int8/int4: the float type around the integer weights' products - "
                        "float16 (default: GPUs; WebGPU adapters with shader-f16) or float32 "
                        "(every WebGPU adapter; docs/install.md)")
    e.add_argument("--backend", default="onnx", choices=BACKENDS,
                   help="tensorrt also builds TensorRT engines (--library, --targets)")
    e.add_argument("--kv-dtype", choices=["float32", "float16", "bfloat16"],
                   help="KV ring dtype (default: float16 for GPU precisions, float32 on the CPU)")
    e.add_argument("--verify", default="auto", choices=["auto", "full", "reduced", "off"],
                   help="check of the LM graphs against torch before the manifest is written: "
                        "full (needs the weights in memory once), reduced (one layer at full "
                        "width + a spot check of every written weight), auto (full if it fits)")
    e.add_argument("--no-engines", action="store_true",
                   help="with --backend tensorrt: write the graphs only; build the engines later "
                        "with personaplex-edge engines --model DIR")
    from .runtime.backends.engines_entry import add_build_flags

    add_build_flags(e)
    e.add_argument("--batch", type=int, default=1, help="streams per graph call (default 1)")
    e.add_argument("--codec-only", action="store_true",
                   help="export only the Mimi codec (no model.safetensors needed)")
    e.add_argument("--push-to-hub", metavar="OWNER/NAME",
                   help="after the export, publish it on the Hugging Face hub with a model card "
                        "(needs a token: HF_TOKEN or 'hf auth login'); run it with --model "
                        "OWNER/NAME")
    e.add_argument("--private", action="store_true",
                   help="with --push-to-hub: create the repository private")
    e.set_defaults(func=cmd_export)

    from .runtime.backends.engines_entry import add_parser as add_engines_parser

    add_engines_parser(sub)

    f = sub.add_parser("verify", help="check a finished or downloaded export: every file's "
                                      "hash, every graph's signature, and with --checkpoint "
                                      "each graph against torch; exit 1 on a disagreement")
    f.add_argument("--model", required=True, help=MODEL_HELP)
    f.add_argument("--checkpoint", help="the checkpoint it was exported from (directory or hub "
                                        "repo): run each graph beside its torch module as the "
                                        "export checks it (needs the export extra)")
    f.add_argument("--transcriber", metavar="STT_CHECKPOINT",
                   help="with --checkpoint: the Kyutai STT checkpoint the transcriber came from, "
                        "to check its step against torch too")
    f.add_argument("--json", help="write every finding here")
    f.set_defaults(func=cmd_verify)

    c = sub.add_parser("codec", help="encode a file to Mimi codes and decode it back")
    c.add_argument("--model", required=True, help=MODEL_HELP)
    c.add_argument("--input", required=True, help="audio file (any rate, mono or stereo)")
    c.add_argument("--codes-out", help="write codes here as int64 .npy [frames, 8]")
    c.add_argument("--output", help="write the reconstruction here (24 kHz mono wav)")
    _add_runtime_args(c)
    c.set_defaults(func=cmd_codec)

    r = sub.add_parser("run", help="offline conversation: a wav in, the answer out")
    _add_conversation_args(r)
    r.add_argument("--input", required=True, help="what the user says (audio file)")
    r.add_argument("--output", required=True, help="the model's answer (24 kHz wav, same length)")
    r.add_argument("--text-out", help="per-frame text as JSON (piece, \"PAD\" or \"EPAD\")")
    r.add_argument("--user-text-out", metavar="FILE",
                   help="what the user said, per input frame as JSON, heard by the model's "
                   "transcriber (export --transcriber); like --text-out")
    r.add_argument("--say", action=SayAction, dest="says", metavar="TEXT",
                   help="words the model says, in its voice, through its text stream (may be "
                        "repeated; docs/say.md)")
    r.add_argument("--say-at", action=SayAction, dest="says", type=float, metavar="SECONDS",
                   help="when the --say before it arrives: the step ceil(SECONDS x 12.5) of the "
                        "input, 0 being the first frame after the persona (default 0)")
    r.add_argument("--realtime", action="store_true",
                   help="play the input through the live loop at the pace of a microphone "
                        "(drops and underruns as live; no sound device needed)")
    _add_backlog_arg(r)
    r.set_defaults(func=cmd_run)

    m = sub.add_parser("mic", help="talk with the model through the microphone and speaker "
                                   "(also: personaplex-edge --mic)")
    _add_conversation_args(m, model_default="models/personaplex-7b-v1")
    m.add_argument("--input-device", help="index or part of the name (see 'devices')")
    m.add_argument("--output-device", help="index or part of the name (see 'devices')")
    m.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    _add_backlog_arg(m)
    m.add_argument("--aec", choices=["on", "off"], default="on",
                   help="cancel the speaker's echo from the microphone (on, for open speakers; "
                        "off for a headset)")
    m.set_defaults(func=cmd_mic)

    from .runtime.assistant.entry import add_parser as add_assistant_parser

    add_assistant_parser(sub)

    a = sub.add_parser("aec", help="the live echo canceller, offline: a microphone recording "
                                   "minus the echo of what was played")
    a.add_argument("--mic", required=True, help="what the microphone heard (any rate)")
    a.add_argument("--ref", required=True, help="what the speaker played, starting together "
                                                "with --mic (any rate)")
    a.add_argument("--output", required=True, help="the cleaned microphone (the mic's rate "
                                                   "and length)")
    a.add_argument("--delay-ms", type=float, default=None,
                   help="the echo's delay, if known (default: measured from the recordings)")
    a.set_defaults(func=cmd_aec)

    t = sub.add_parser("batch", help="many recordings offline, unpaced and in lockstep: a "
                                     "Full-Duplex-Bench tree, a folder or a JSONL manifest")
    _add_conversation_args(t)
    t.add_argument("--input", required=True,
                   help="a Full-Duplex-Bench tree (*/input.wav), a folder of audio files, or "
                        "a .jsonl manifest (input, output, text_prompt, voice_prompt, seed)")
    t.add_argument("--output", help="where the answers go (default: beside each input in a "
                                    "Full-Duplex-Bench tree; needed for a folder)")
    t.add_argument("--shard", help="K/N: this machine's part of the sorted items (every N-th "
                                   "from the K-th), e.g. a job array's index")
    t.add_argument("--overwrite", action="store_true",
                   help="answer items again whose outputs are there (default: skip them)")
    t.add_argument("--codes", action="store_true",
                   help="also keep each answer's agent codes and text tokens (NAME.codes.npz: "
                        "personaplex-edge decode turns them into the same audio)")
    t.add_argument("--rows", type=int, default=None,
                   help="items stepped together (default: the model's --batch)")
    t.add_argument("--workers", type=int, default=None,
                   help="threads, each stepping its own rows (default: one per core for a "
                        "batch-1 model on the CPU, each session call on one thread; else 1)")
    t.set_defaults(func=cmd_batch)

    k = sub.add_parser("decode", help="a codes file of batch --codes -> its audio (code2wav)")
    k.add_argument("--model", required=True, help="the model directory that wrote the codes")
    k.add_argument("--codes", required=True, help="NAME.codes.npz")
    k.add_argument("--output", required=True, help="the audio (24 kHz wav)")
    _add_runtime_args(k)
    k.set_defaults(func=cmd_decode)

    o = sub.add_parser("stdio", help="one conversation over stdin/stdout: framed PCM16 in, "
                                     "PCM16 and text out (for apps in any language)")
    _add_conversation_args(o)
    o.add_argument("--max-backlog-frames", type=int, default=None,
                   help="live audio: drop the oldest input frames when more than this many "
                        "wait (default: lossless, the pipe holds the writer back)")
    o.set_defaults(func=cmd_stdio)

    b = sub.add_parser("bench", help="per-stage timings: p50/p90/p99/max, over-budget frames")
    _add_conversation_args(b)
    b.add_argument("--frames", type=int, default=200)
    b.add_argument("--warmup", type=int, default=10)
    b.add_argument("--streams", type=int, default=1,
                   help="conversations stepped together, as a server steps them (1)")
    b.add_argument("--position", type=int, default=None, metavar="N",
                   help="start each conversation N frames in (after its persona) without "
                        "stepping there; N >= the context (3000) times the steady state, the "
                        "KV ring full")
    b.add_argument("--json", help="write the summaries and every frame's stage times here")
    b.add_argument("--plot", help="draw frame time per stage over the run into this PNG "
                                  "(needs matplotlib)")
    b.add_argument("--aec", choices=("on", "off"), default="on",
                   help="the echo canceller in front of each stream, as --mic runs it (on); "
                        "off as serve runs (its clients cancel their own echo)")
    b.set_defaults(func=cmd_bench)

    v = sub.add_parser("serve", help="the moshi/PersonaPlex (/api/chat) and OpenAI Realtime "
                                     "(/v1/realtime) WebSocket protocols and a web page: several "
                                     "conversations on one model")
    _add_conversation_args(v, model_default="models/personaplex-7b-v1")
    v.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (127.0.0.1: this machine only; 0.0.0.0: all)")
    v.add_argument("--port", type=int, default=8998, help="port (8998, as moshi's; 0: any free)")
    v.add_argument("--max-sessions", type=int, default=4,
                   help="conversations at once; one more is refused as busy (README: choosing "
                        "it from bench)")
    v.add_argument("--ssl", metavar="DIR", help="serve https/wss with DIR/cert.pem and DIR/key.pem "
                                               "(a browser's microphone needs it beyond localhost)")
    v.add_argument("--auth-token", default=os.environ.get("PERSONAPLEX_AUTH_TOKEN"),
                   help="the WebSockets and WebRTC calls need this token (?token= or "
                        "Authorization: Bearer; a browser's call may present a client key made "
                        "with it); "
                        "default: $PERSONAPLEX_AUTH_TOKEN, which other users cannot see in ps")
    v.add_argument("--allowed-origins", metavar="ORIGINS",
                   default=os.environ.get("PERSONAPLEX_ALLOWED_ORIGINS"),
                   help="browser pages that may open the WebSockets besides the server's own, "
                        "comma-separated (http://localhost:3000,https://app.example.com; *: "
                        "any); clients that send no Origin (SDKs) are not affected")
    v.add_argument("--allowed-hosts", metavar="NAMES",
                   default=os.environ.get("PERSONAPLEX_ALLOWED_HOSTS"),
                   help="host names the page and the WebSockets answer to besides localhost, "
                        "--host and (bound beyond loopback) this machine's names and addresses, "
                        "comma-separated (voice.example.com; *: any, behind a balancer)")
    v.add_argument("--voice-dir", help="recordings clients may name as voice_prompt, besides the "
                                       "voice bank")
    v.add_argument("--ice-server", action="append", metavar="URL",
                   help="WebRTC calls (/v1/realtime/calls): a STUN or TURN server for clients "
                        "behind NAT (stun:HOST:PORT, turn:HOST:PORT; repeatable). Default: none "
                        "is contacted, the calls' candidates are the server's own addresses")
    v.add_argument("--turn-username", help="the TURN servers' username")
    v.add_argument("--turn-credential", default=os.environ.get("PERSONAPLEX_TURN_CREDENTIAL"),
                   help="the TURN servers' password (default: $PERSONAPLEX_TURN_CREDENTIAL)")
    _add_backlog_arg(v)
    v.set_defaults(func=cmd_serve)

    d = sub.add_parser("devices", help="list sound devices (for --input-device/--output-device)")
    d.set_defaults(func=cmd_devices)
    return p


def with_subcommand(argv: list[str]) -> list[str]:
    """`argv` with the reference's habit - `--mic` instead of a subcommand - spelled as the
    subcommand (`aec --mic FILE` is an option of aec)."""
    argv = list(argv)
    if "--mic" in argv and argv[0] != "aec":
        argv.remove("--mic")
        argv.insert(0, "mic")
    return argv


def parse_args(argv: list[str]) -> argparse.Namespace:
    """A command line as a user types it (SystemExit, with the usage, where it is wrong)."""
    return build_parser().parse_args(with_subcommand(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return args.func(args)
    except PersonaPlexError as e:
        print(f"personaplex-edge: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("personaplex-edge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
