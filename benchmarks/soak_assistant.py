"""Soak of `personaplex-edge assistant`: speech and silence in turn for --minutes, the sound
server killed and started again twice (a device unplugged), the service's RSS sampled.

    python benchmarks/soak_assistant.py [--minutes 60] [--unplugs 2] [--model DIR] [--json out.json]

Runs the service as systemd would (tests/assistant_service.py: a private PulseAudio, a listener
on NOTIFY_SOCKET, a control client), on the demo model by default. Every cycle plays a phrase
into the microphone and then leaves silence long enough for the model to fall asleep (idle
after 3 s). At a third and at two thirds of the run (--unplugs N: N times, evenly spread) the
sound server dies for 5 s. Reports the wakes, sleeps, device losses, the process id at the
start and the end (no restart), watchdog pings, and RSS: the first sample after a minute's
warm-up, the last, the largest and the slope of a straight-line fit (MB per hour). Exit 1 when
the service restarted, died or did not count every loss.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--model", default="demo", help="model (default: the built-in demo)")
    p.add_argument("--unplugs", type=int, default=2,
                   help="times the sound server dies for 5 s, evenly spread (2)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    from assistant_service import HELLO, AssistantService

    from personaplex_edge.model_ref import resolve_model

    import soundfile as sf

    model_dir = resolve_model(args.model, print)
    period = sf.info(str(HELLO)).duration + 3.0 + 3.0  # the phrase, 3 s to sleep, 3 s asleep
    total = args.minutes * 60
    unplug_at = [total * (k + 1) / (args.unplugs + 1) for k in range(args.unplugs)]
    samples: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        s = AssistantService(Path(tmp), model_dir, sleep_after=3.0, watchdog_usec=10_000_000)
        try:
            pid = s.proc.pid
            t0 = time.monotonic()
            next_play = next_sample = t0
            plays = 0
            while time.monotonic() - t0 < total and s.proc.poll() is None:
                now = time.monotonic() - t0
                if unplug_at and now >= unplug_at[0]:
                    unplug_at.pop(0)
                    s.kill_sound_server()
                    time.sleep(5.0)
                    s.start_sound_server()
                    next_play = time.monotonic() + 3.0
                if time.monotonic() >= next_play:
                    s.play(HELLO)
                    plays += 1
                    next_play = time.monotonic() + period
                if time.monotonic() >= next_sample:
                    samples.append((time.monotonic() - t0, rss_mb(pid)))
                    next_sample += 5.0
                time.sleep(0.2)
            alive = s.proc.poll() is None
            status = s.client.command("status") if alive else {}
        finally:
            s.close()
        pings = sum(1 for _, n in s.notify.items if n == "WATCHDOG=1")
    t = np.array([x for x, _ in samples])
    r = np.array([y for _, y in samples])
    warm = t >= min(60.0, total / 4)
    slope = float(np.polyfit(t[warm] / 3600, r[warm], 1)[0]) if warm.sum() >= 3 else float("nan")
    result = {"minutes": args.minutes, "alive": alive, "pid_same": status.get("pid") == pid,
              "phrases_played": plays, "wakes": status.get("wakes"),
              "sleeps": status.get("sleeps"), "device_losses": status.get("device_losses"),
              "frames": status.get("frames"), "lm_frames": status.get("lm_frames"),
              "asleep_frames": status.get("asleep_frames"),
              "dropped_frames": status.get("dropped_frames"), "watchdog_pings": pings,
              "rss_mb_after_warmup": round(float(r[warm][0]), 1) if warm.any() else None,
              "rss_mb_last": round(float(r[-1]), 1), "rss_mb_max": round(float(r.max()), 1),
              "rss_slope_mb_per_hour": round(slope, 2)}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "rss": samples}, indent=1))
    ok = alive and result["pid_same"] and result["device_losses"] == args.unplugs
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
