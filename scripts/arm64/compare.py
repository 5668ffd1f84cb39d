"""Two machines' answers to the aarch64 lane's questions (answers.py), side by side: one row per
question, and exit 1 if any differs beyond what the platform may change.

    python scripts/arm64/compare.py X86_DIR ARM64_DIR [--json OUT]

What may differ: floating point summed in another order (NEON instead of AVX kernels,
another thread split) moves a sample by at most 1 LSB of PCM16; the text must be identical.
Opus encoded on each machine (/api/chat's answers, opus-encode) is the exception: libopus's
encoder makes choices (modes, bit allocation) from float arithmetic that differs in its last
bits between the machines, and two valid encodings of one signal differ far beyond 1 LSB
(~16 dB apart here, with each at ~6 dB from the signal: a lossy codec). Those are held to the
same length (and text) and MIN_OPUS_SNR_DB against each other, which a shifted, truncated or
garbled stream does not reach; decoding one stream (opus-decode) is held to 1 LSB like the rest.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

MAX_LSB = 1
MIN_OPUS_SNR_DB = 10.0
ENCODED_HERE = {"chat", "opus-encode"}  # Opus encoded on each machine


def snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - x) ** 2))
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(signal / noise) if signal else 0.0


def compare(a: Path, b: Path) -> list[dict]:
    rows = []
    for pcm_a in sorted(a.glob("*.pcm16")):
        name = pcm_a.stem
        row = {"question": name, "ok": False}
        rows.append(row)
        if not (b / pcm_a.name).is_file():
            row["why"] = "no answer"
            continue
        x = np.frombuffer(pcm_a.read_bytes(), "<i2").astype(np.int32)
        y = np.frombuffer((b / pcm_a.name).read_bytes(), "<i2").astype(np.int32)
        has_text = (a / f"{name}.txt").is_file()
        ta = (a / f"{name}.txt").read_text() if has_text else ""
        tb = (b / f"{name}.txt").read_text() if (b / f"{name}.txt").is_file() else None
        row.update(samples=int(x.shape[0]), text_chars=len(ta), text_same=ta == tb or
                   not has_text)
        if x.shape != y.shape:
            row["why"] = f"{x.shape[0]} samples against {y.shape[0]}"
            continue
        row["max_lsb"] = int(np.abs(x - y).max()) if x.size else 0
        row["snr_db"] = round(snr_db(x, y), 1)
        close = (row["snr_db"] >= MIN_OPUS_SNR_DB if name in ENCODED_HERE
                 else row["max_lsb"] <= MAX_LSB)
        said = bool(ta) or not has_text
        row["ok"] = bool(close and row["text_same"] and x.size > 0 and said)
        if not row["ok"]:
            row["why"] = ("text differs" if not row["text_same"] else
                          "empty" if not (x.size and said) else "samples differ")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("x86")
    ap.add_argument("arm64")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = compare(Path(args.x86), Path(args.arm64))
    print(f"{'question':<12} {'samples':>8} {'max LSB':>8} {'SNR dB':>7} {'text':>14}  verdict")
    for r in rows:
        text = (f"{'same' if r.get('text_same') else 'DIFFERS'} ({r.get('text_chars', 0)})"
                if r.get("text_chars") or not r.get("text_same", True) else "-")
        print(f"{r['question']:<12} {r.get('samples', '-'):>8} {r.get('max_lsb', '-'):>8} "
              f"{r.get('snr_db', '-'):>7} {text:>14}  {'ok' if r['ok'] else 'FAIL: ' + r['why']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
