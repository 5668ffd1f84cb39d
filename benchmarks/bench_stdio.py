"""What the stdio protocol costs over the Python API: the same frames through `conv.stream` in
this process, and through `personaplex-edge stdio` in a child process (framed PCM16 on its
stdin, answers read from its stdout as fast as it writes them), on the same model.

    python benchmarks/bench_stdio.py [--model demo] [--frames 1000] [--repeats 3]

Both sides run the demo model greedy without a persona, on the bundled speech looped; the
stdio clock starts when the handshake arrives (the model is loaded and the persona ready) and
stops at the last answer frame. Reports frames per second of each (the median of the repeats)
and their ratio.
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import threading
import time

import numpy as np


def _api_fps(model_dir, pcm: np.ndarray, threads: int) -> float:
    import personaplex_edge as pe

    with pe.load(model_dir, device="cpu", threads=threads) as model:
        with model.conversation(persona=False, greedy=True) as conv:
            for _ in conv.stream(pcm[:20 * 1920]):  # warm-up, as the child's handshake is
                pass
            t0 = time.perf_counter()
            frames = sum(1 for _ in conv.stream(pcm))
            return frames / (time.perf_counter() - t0)


def _read_exactly(stream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError("stdio closed early")
        data += chunk
    return data


def _stdio_fps(model_dir, pcm: np.ndarray, threads: int) -> float:
    from personaplex_edge.audio import pcm16_bytes

    child = subprocess.Popen(
        [sys.executable, "-m", "personaplex_edge.cli", "stdio", "--model", str(model_dir),
         "--device", "cpu", "--threads", str(threads), "--no-persona", "--greedy"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    data = pcm16_bytes(pcm)
    warm = data[:20 * 3840]

    def message(payload: bytes) -> bytes:
        return struct.pack("<I", len(payload) + 1) + b"\x01" + payload

    def read_message() -> tuple[int, bytes]:
        (length,) = struct.unpack("<I", _read_exactly(child.stdout, 4))
        body = _read_exactly(child.stdout, length)
        return body[0], body[1:]

    assert read_message()[0] == 0x00  # handshake: loaded, persona ready
    child.stdin.write(message(warm))
    child.stdin.flush()
    for _ in range(20):
        while read_message()[0] != 0x01:
            pass

    def write_all() -> None:  # 0.5 s of audio per message, as a file streams
        for i in range(0, len(data), 24000):
            child.stdin.write(message(data[i:i + 24000]))
        child.stdin.close()

    t0 = time.perf_counter()
    threading.Thread(target=write_all, daemon=True).start()
    frames = 0
    total = -(-pcm.shape[0] // 1920)
    while frames < total:
        kind, _ = read_message()
        frames += kind == 0x01
    seconds = time.perf_counter() - t0
    child.wait(timeout=60)
    return frames / seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--frames", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    from personaplex_edge.audio import read_audio
    from personaplex_edge.model_ref import resolve_model
    from personaplex_edge.runtime.bench import bundled_speech

    model_dir = resolve_model(args.model)
    speech = read_audio(bundled_speech())
    pcm = np.tile(speech, -(-args.frames * 1920 // speech.shape[0]))[:args.frames * 1920]
    runs = {"api": [], "stdio": []}
    for _ in range(args.repeats):  # alternately, so both see the same machine
        runs["api"].append(_api_fps(model_dir, pcm, args.threads))
        runs["stdio"].append(_stdio_fps(model_dir, pcm, args.threads))
    api, stdio = (float(np.median(runs[k])) for k in ("api", "stdio"))
    print(f"{model_dir}: {args.frames} frames, median of {args.repeats}")
    print(f"  conv.stream (Python API)   {api:7.1f} frames/s")
    print(f"  personaplex-edge stdio     {stdio:7.1f} frames/s")
    print(f"  stdio / API                {stdio / api:7.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"frames": args.frames, "runs": runs, "api_fps": api,
                       "stdio_fps": stdio}, f, indent=2)


if __name__ == "__main__":
    main()
