"""The assistant's sleep and wake on the demo model: LM steps while idle, wake latency, and what
the user's first words cost.

    python benchmarks/bench_assistant.py [--model DIR] [--trials N] [--vad webrtc|silero]
                                         [--json out.json]

The service's own step (runtime/assistant/idle.py, IdleGate) on a real conversation, fed 80 ms
frames of a signal whose speech onsets are known to the sample:
    idle        3 minutes of silence, sleep after 60 s: the LM's own tick count over the 2
                minutes asleep, per minute (target 0; awake it is 750)
    wake        espeak-ng phrases (the bundled speech sample without it) starting at random
                points of a silence the model fell asleep in: the latency from the speech's
                first sample to the end of the frame whose voice woke the model, when the LM
                steps (target <= 2 frames, 160 ms), and how much of the start of the speech
                lies before the pre-roll (never heard by the model)
    paced       the same through the live duplex loop in real time (audio_io/paced_file.py),
                with each LM step made to take longer, as a slower machine's: the input frames
                dropped while the wake steps the pre-roll (catching up costs pre-roll x step
                time; what exceeds the backlog allowance is dropped)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

RATE = 24000
FRAME = 1920


def _model(path: str | None):
    import personaplex_edge as pe

    return pe.load(path or "demo", device="cpu")


def _gate(model, sleep_after: float, vad: str, preroll_ms: int = 320, conv_wrapper=None):
    from personaplex_edge.runtime.assistant.idle import IdleGate, IdlePolicy

    conv = model.open_conversation()
    conv.prefill()
    events: list[dict] = []
    gate = IdleGate(conv_wrapper(conv) if conv_wrapper else conv, model.text,
                    IdlePolicy.from_seconds(sleep_after, preroll_ms, vad=vad), events.append)
    return gate, conv, events


def phrases() -> list[np.ndarray]:
    from bench_vad import PHRASES, VOICES, espeak

    out = [espeak(p, v) for p, v in zip(PHRASES, VOICES)]
    if any(x is None for x in out):
        from personaplex_edge.audio import read_audio
        from personaplex_edge.runtime.bench import bundled_speech

        return [read_audio(bundled_speech(), RATE)]
    return [0.5 * x / np.abs(x).max() for x in out]


def onset(x: np.ndarray) -> int:
    """The speech's first sample: the first above 1% of its peak."""
    return int(np.argmax(np.abs(x) > 0.01 * np.abs(x).max()))


def idle_steps(model, vad: str) -> dict:
    gate, conv, _ = _gate(model, sleep_after=60.0, vad=vad)
    silence = np.zeros(FRAME, np.float32)
    ticks = []
    for _ in range(3 * 750):
        gate(silence)
        ticks.append(conv.group.metrics.frames)
    slept = next(i for i in range(1, len(ticks)) if ticks[i] == ticks[i - 1])
    minutes = (len(ticks) - 1 - slept) / 750
    conv.close()
    return {"awake_steps_per_min": ticks[749], "slept_at_frame": slept,
            "asleep_minutes": round(minutes, 2),
            "asleep_steps_per_min": (ticks[-1] - ticks[slept]) / minutes}


def wake_trials(model, trials: int, vad: str, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    speech = phrases()
    gate, conv, events = _gate(model, sleep_after=1.0, vad=vad)
    frames_fed = 0
    out = []

    def feed(x: np.ndarray) -> None:
        nonlocal frames_fed
        for i in range(x.size // FRAME):
            gate(x[i * FRAME:(i + 1) * FRAME])
            frames_fed += 1

    for k in range(trials):
        x = speech[k % len(speech)]
        # silence until asleep, then a random part of a frame more: the onset falls anywhere
        lead = np.zeros(int(1.6 * RATE) + int(rng.integers(0, FRAME)), np.float32)
        signal = np.concatenate([lead, x, np.zeros(int(1.6 * RATE), np.float32)])
        signal = np.pad(signal, (0, -signal.size % FRAME))
        start, seen = frames_fed, len(events)
        assert gate.asleep or k == 0
        feed(signal)
        wakes = [e for e in events[seen:] if e["event"] == "wake"]
        if not wakes:
            out.append({"trial": k, "woke": False})
            continue
        w = wakes[0]["frame"] - 1 - start  # the waking frame, in the signal's frames
        s = lead.size + onset(x)  # the speech's first sample, in the signal
        heard_from = (w - wakes[0]["preroll_frames"] + 1) * FRAME
        out.append({"trial": k, "woke": True,
                    "latency_ms": round(((w + 1) * FRAME - s) / RATE * 1000, 1),
                    "latency_frames": round(((w + 1) * FRAME - s) / FRAME, 2),
                    "first_words_cut_ms": round(max(0, heard_from - s) / RATE * 1000, 1),
                    "vad_onset_to_wake_frames": wakes[0]["latency_frames"]})
        if not gate.asleep:  # the tail's silence put it to sleep, or the next lead will
            feed(np.zeros(int(1.2 * RATE) // FRAME * FRAME, np.float32))
    conv.close()
    return out


class _Slower:
    """A conversation whose steps take `ms` in all, as on a slower machine."""

    def __init__(self, conv, ms: float):
        self._conv, self._ms = conv, ms

    def step(self, frame):
        t0 = time.perf_counter()
        result = self._conv.step(frame)
        left = self._ms / 1000 - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)
        return result

    def __getattr__(self, name):
        return getattr(self._conv, name)


def paced(model, step_ms: float, vad: str) -> dict:
    from personaplex_edge.runtime.audio_io.paced_file import run_paced

    x = phrases()[0]
    gate, conv, events = _gate(model, sleep_after=1.0, vad=vad,
                               conv_wrapper=lambda c: _Slower(c, step_ms))
    signal = np.concatenate([np.zeros(int(2.0 * RATE), np.float32), x,
                             np.zeros(int(0.5 * RATE), np.float32)])
    _, loop = run_paced(gate, signal)
    conv.close()
    wakes = [e for e in events if e["event"] == "wake"]
    return {"step_ms": step_ms, "woke": bool(wakes), "dropped_frames": loop.stats.dropped_frames,
            "preroll_frames": wakes[0]["preroll_frames"] if wakes else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="model directory (default: the built-in demo)")
    p.add_argument("--trials", type=int, default=24)
    from personaplex_edge.runtime.assistant.vad import ENGINES

    p.add_argument("--vad", choices=ENGINES, default="webrtc",
                   help="the voice detector (the assistant's idle.vad)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    model = _model(args.model)
    print(f"voice detector: {args.vad}")
    idle = idle_steps(model, args.vad)
    print(f"idle: {idle['awake_steps_per_min']} LM steps in the awake minute, "
          f"{idle['asleep_steps_per_min']:g} per minute over {idle['asleep_minutes']:g} minutes "
          f"asleep (fell asleep at frame {idle['slept_at_frame']})")
    trials = wake_trials(model, args.trials, args.vad)
    woke = [t for t in trials if t["woke"]]
    lat = np.array([t["latency_frames"] for t in woke])
    cut = np.array([t["first_words_cut_ms"] for t in woke])
    print(f"wake: {len(woke)}/{len(trials)} onsets woke the model; latency speech onset -> "
          f"first LM step: median {np.median(lat):.2f} frames ({np.median(lat) * 80:.0f} ms), "
          f"max {lat.max():.2f} frames ({lat.max() * 80:.0f} ms); first words before the "
          f"pre-roll: median {np.median(cut):.0f} ms, max {cut.max():.0f} ms")
    rows = [paced(model, ms, args.vad) for ms in (5, 40, 70)]
    for r in rows:
        print(f"paced, {r['step_ms']:g} ms per LM step: woke {r['woke']}, "
              f"{r['dropped_frames']} input frame(s) dropped while the "
              f"{r['preroll_frames']}-frame pre-roll was stepped")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": str(model.model_dir), "vad": args.vad,
                                               "idle": idle,
                                               "wake": trials, "paced": rows}, indent=1))
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
