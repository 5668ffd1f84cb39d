"""The assistant's voice detectors (runtime/assistant/vad.py: webrtcvad, and silero through
onnxruntime) on the sounds of a room: speech, silence, music and the model's own echo.

    python benchmarks/bench_vad.py [--engine webrtc|silero|both] [--json out.json]

Signals (24 kHz, 80 ms frames, as the service hears them):
    speech   espeak-ng phrases in four voices (Debian's espeak-ng; skipped where absent) and the
             bundled speech sample; its frames with a voice are those whose energy is within
             35 dB of the phrase's loudest frame
    silence  digital silence, white noise at -60 and -45 dBFS, 50 Hz hum
    music    sox's synth (a plucked chord progression and a sine pad with tremolo) and a
             numpy piano-like melody with a noise-burst drum
    echo     the model's answer as an open speaker's microphone hears it (bench_aec's synthetic
             room), raw and after the runtime's echo canceller
Figures per configuration (webrtc: aggressiveness / voiced 20 ms blocks per frame; silero:
the threshold a 32 ms chunk's score must reach):
    speech recall   voiced frames of speech called speech
    onset frames    frames from each phrase's first voiced frame to the first frame called speech
    false wakes/min on non-speech, after 2 s of listening: frames called speech after one that
                    was not (each would wake a sleeping model with idle.wake_frames = 1)
    called speech % the share of those frames called speech (for the echo: how much of the
                    model's own voice the detector takes for a user)
    start wakes     whether its first second, after a second of silence, has a frame called
                    speech: a sudden start (music's first attack) waking a sleeping model
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

RATE = 24000
FRAME = 1920
PHRASES = ["Hey, what is the weather like tomorrow?",
           "Could you turn the lights off in the kitchen please.",
           "I think we should leave at seven.",
           "Tell me a story about a dragon."]
VOICES = ["en", "en-us", "en+f3", "en-us+m3"]
WARMUP_FRAMES = 25  # 2 s


def _sox_to_array(args: list[str]) -> np.ndarray | None:
    """sox writing a 24 kHz mono wav, read back; None without sox."""
    if shutil.which("sox") is None:
        return None
    import soundfile as sf

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "x.wav"
        # sox's effects come after the output file: the first "synth" starts them
        first = args.index("synth")
        subprocess.run([*args[:first], "-r", str(RATE), "-c", "1", "-b", "16", str(out),
                        *args[first:]], check=True, capture_output=True)
        x, _ = sf.read(str(out), dtype="float32")
    return x


def espeak(text: str, voice: str = "en") -> np.ndarray | None:
    """`text` spoken by espeak-ng at 24 kHz [T] f32, leading and trailing silence kept as
    espeak makes it; None without espeak-ng."""
    if shutil.which("espeak-ng") is None:
        return None
    import soundfile as sf

    from personaplex_edge.audio import resample

    with tempfile.TemporaryDirectory() as d:
        wav = Path(d) / "s.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(wav), text], check=True,
                       capture_output=True)
        x, rate = sf.read(str(wav), dtype="float32")
    return resample(x, rate, RATE).astype(np.float32)


def voiced_frames(x: np.ndarray, floor_db: float = -35.0) -> np.ndarray:
    """[frames] bool: frames whose energy is within `floor_db` of the loudest frame's."""
    n = x.size // FRAME
    e = (x[:n * FRAME].reshape(n, FRAME) ** 2).mean(1) + 1e-20
    return 10 * np.log10(e / e.max()) > floor_db


def speech_signals() -> dict[str, np.ndarray]:
    from personaplex_edge.audio import read_audio
    from personaplex_edge.runtime.bench import bundled_speech

    out = {"bundled speech sample": read_audio(bundled_speech(), RATE)}
    for i, (phrase, voice) in enumerate(zip(PHRASES, VOICES)):
        x = espeak(phrase, voice)
        if x is not None:
            out[f"espeak {voice}: {phrase[:24]}..."] = 0.5 * x / np.abs(x).max()
    return out


def _piano(seconds: float, rng) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    x = np.zeros_like(t)
    notes = [261.6, 329.6, 392.0, 523.3, 392.0, 329.6, 293.7, 349.2]
    step = 0.5
    for k, f in enumerate(notes * int(np.ceil(seconds / (step * len(notes))))):
        a = int(k * step * RATE)
        if a >= t.size:
            break
        tt = t[: t.size - a]
        env = np.exp(-tt * 3.0)
        x[a:] += env * sum(np.sin(2 * np.pi * f * h * tt) / h ** 1.5 for h in range(1, 6))
        if k % 2 == 0:  # a drum: a burst of noise
            burst = rng.standard_normal(min(2400, t.size - a)) * np.exp(-np.arange(
                min(2400, t.size - a)) / 300.0)
            x[a:a + burst.size] += 0.8 * burst
    return (0.4 * x / np.abs(x).max()).astype(np.float32)


def non_speech_signals(seconds: float = 10.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    n = int(RATE * seconds)
    t = np.arange(n) / RATE
    out = {"digital silence": np.zeros(n, np.float32),
           "white noise -60 dBFS": (rng.standard_normal(n) * 10 ** (-60 / 20)).astype(np.float32),
           "white noise -45 dBFS": (rng.standard_normal(n) * 10 ** (-45 / 20)).astype(np.float32),
           "50 Hz hum": (0.3 * np.sin(2 * np.pi * 50 * t)).astype(np.float32),
           "music: piano and drum (numpy)": _piano(seconds, rng)}
    pluck = _sox_to_array(["sox", "-n", "synth", "2", "pluck", "C3", "pluck", "E3", "pluck", "G3",
                           ":", "synth", "2", "pluck", "A2", "pluck", "C3", "pluck", "E3", ":",
                           "synth", "2", "pluck", "F2", "pluck", "A2", "pluck", "C3", ":",
                           "synth", "2", "pluck", "G2", "pluck", "B2", "pluck", "D3"])
    if pluck is not None:
        out["music: plucked chords (sox)"] = np.tile(pluck, 2)[:n] if pluck.size else pluck
        pad = _sox_to_array(["sox", "-n", "synth", str(seconds), "sine", "220", "sine", "277",
                             "sine", "330", "tremolo", "5", "60", "gain", "-6"])
        out["music: sine pad with tremolo (sox)"] = pad
    return out


def echo_signals() -> dict[str, np.ndarray]:
    """The model's answer (speech) as the microphone hears it through a room, and the same
    after the runtime's canceller (far-only span: nobody else speaks)."""
    from bench_aec import make_scene, run_canceller

    from personaplex_edge.runtime.audio_io import speexdsp
    from personaplex_edge.runtime.audio_io.echo import EchoCanceller

    out = {}
    for seed, rt60, delay in ((0, 0.3, 60), (1, 0.5, 120)):
        s = make_scene(seed=seed, rt60=rt60, delay_ms=delay, far_kind="speech")
        a, b = s["far_only"]
        out[f"echo, room RT60 {rt60} s (raw)"] = s["mic"][a:b]
        if speexdsp.load() is not None:
            cleaned, _ = run_canceller(EchoCanceller(), s["mic"], s["far"])
            out[f"echo, room RT60 {rt60} s (after the canceller)"] = cleaned[a:b]
    return out


def calls(x: np.ndarray, config: dict) -> np.ndarray:
    """[frames] bool: a new detector of `config` (the assistant's idle.* keys) over `x`."""
    from personaplex_edge.runtime.assistant.vad import voice_detector

    vad = voice_detector(**config)
    n = x.size // FRAME
    return np.array([vad.speech(x[i * FRAME:(i + 1) * FRAME]) for i in range(n)], bool)


def figures(config: dict, speech: dict, other: dict) -> dict:
    recall, onsets = [], []
    for x in speech.values():
        said, truth = calls(x, config), voiced_frames(x)
        recall.append(float(said[truth].mean()))
        first_true = int(np.argmax(truth))
        hits = np.nonzero(said[first_true:])[0]
        onsets.append(int(hits[0]) if hits.size else None)
    wakes, share, starts = {}, {}, {}
    silence = np.zeros(RATE, np.float32)
    for name, x in other.items():
        # its first second after a second of silence: does the start alone wake a sleeper?
        starts[name] = bool(calls(np.concatenate([silence, x[:RATE]]), config)[
            RATE // FRAME:].any())
        # a detector that has listened for a while (the service's always has): the first
        # WARMUP_FRAMES, in which webrtcvad learns the noise floor, are not counted
        said = calls(x, config)
        judged = said[WARMUP_FRAMES - 1:]
        rises = int(np.sum(judged[1:] & ~judged[:-1]))
        wakes[name] = round(60.0 * rises / ((judged.size - 1) * FRAME / RATE), 1)
        share[name] = round(100.0 * float(judged[1:].mean()), 1)
    return {**config, "speech_recall": round(float(np.mean(recall)), 3),
            "onset_frames": onsets, "false_wakes_per_min": wakes, "called_speech_pct": share,
            "start_wakes": starts}


def label(row: dict) -> str:
    """A configuration's name in the tables: webrtc MODE/VOICED, or silero THRESHOLD."""
    if row["engine"] == "webrtc":
        return f"webrtc {row['aggressiveness']}/{row['voiced_subframes']}"
    return f"silero {row['threshold']:g}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--engine", choices=("webrtc", "silero", "both"), default="both",
                   help="which detector (silero needs `pip install --no-deps silero-vad`)")
    args = p.parse_args(argv)
    speech = speech_signals()
    other = {**non_speech_signals(), **echo_signals()}
    if len(speech) == 1:
        print("(espeak-ng is not installed: the bundled sample alone is the speech)")
    configs = []
    if args.engine in ("webrtc", "both"):
        configs += [{"engine": "webrtc", "aggressiveness": a, "voiced_subframes": v}
                    for a in (1, 2, 3) for v in (1, 2, 3)]
    if args.engine in ("silero", "both"):
        configs += [{"engine": "silero", "threshold": t} for t in (0.5, 0.7, 0.8)]
    rows = [figures(c, speech, other) for c in configs]
    names = list(other)
    print(f"{len(speech)} speech signals, {len(other)} others\n")
    print(f"{'detector':>16} {'recall':>7} {'onset (frames)':>16}  false wakes per "
          "minute (% of frames called speech)")
    print(" " * 42 + " | ".join(f"{i}" for i in range(len(names))))
    for r in rows:
        onset = [o for o in r["onset_frames"] if o is not None]
        print(f"{label(r):>16} {r['speech_recall']:>7.2f} "
              f"{'max ' + str(max(onset)) if onset else '-':>16}  "
              + " | ".join(f"{r['false_wakes_per_min'][n]:g} ({r['called_speech_pct'][n]:g}%)"
                           for n in names))
    print("\nits start out of a second of silence called speech (a sleeping model woken):")
    for r in rows:
        print(f"{label(r):>16} " + " | ".join("yes" if r["start_wakes"][n] else "no"
                                               for n in names))
    for i, n in enumerate(names):
        print(f"  {i}: {n}")
    if args.json:
        Path(args.json).write_text(json.dumps({"signals": {"speech": list(speech),
                                                           "other": names}, "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
