"""The aarch64 lane's questions, asked of the installed package on whichever machine runs this;
each answer is written as NAME.pcm16 (the answer's samples, little-endian int16) and NAME.txt
(what the model said). compare.py sets two such directories side by side.

    python scripts/arm64/answers.py local OUT [OGG]  run (greedy, seeded), stdio, the Python API,
                                                     the server's Opus (OGG: a stream to decode),
                                                     the assistant's voice detectors
    python scripts/arm64/answers.py serve URL OUT  /api/chat and /v1/realtime against a server

`local` needs only the board's install (no torch, no test tools) and the built-in demo model
in the per-user cache. `serve` runs on the x86 host with its dev extra (sphn is moshi's Opus,
as its client sends it).
"""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
HELLO = REPO / "personaplex_edge" / "data" / "hello.wav"
FRAME = 1920
CLI = Path(sys.executable).with_name("personaplex-edge")  # the console script of this venv


def save(out: Path, name: str, pcm16: bytes, text: str | None = None) -> None:
    (out / f"{name}.pcm16").write_bytes(pcm16)
    if text is not None:
        (out / f"{name}.txt").write_text(text)


def said(records: list[str]) -> str:
    return "".join(r for r in records if r not in ("PAD", "EPAD"))


def ask_run(out: Path, name: str, *flags: str) -> None:
    """`personaplex-edge run` on the bundled speech: its wav and its per-frame records."""
    import soundfile as sf

    with tempfile.TemporaryDirectory() as tmp:
        wav, records = Path(tmp) / "a.wav", Path(tmp) / "a.json"
        subprocess.run([str(CLI), "run", "--model", "demo", "--input", str(HELLO), "--output",
                        str(wav), "--text-out", str(records), *flags], check=True,
                       stdout=subprocess.DEVNULL)
        pcm, _ = sf.read(str(wav), dtype="int16")
        save(out, name, pcm.astype("<i2").tobytes(), said(json.loads(records.read_text())))


def ask_stdio(out: Path) -> None:
    """`personaplex-edge stdio`: the bundled speech as one framed PCM16 message, then EOF."""
    from personaplex_edge.audio import pcm16_bytes, read_audio

    pcm = pcm16_bytes(read_audio(HELLO, 24000))
    message = struct.pack("<I", len(pcm) + 1) + b"\x01" + pcm
    done = subprocess.run([str(CLI), "stdio", "--model", "demo", "--greedy"], input=message,
                          capture_output=True, check=True)
    audio, text, data, at = bytearray(), "", done.stdout, 0
    while at < len(data):
        (length,) = struct.unpack_from("<I", data, at)
        kind, payload = data[at + 4], data[at + 5:at + 4 + length]
        at += 4 + length
        if kind == 0x01:
            audio += payload
        elif kind == 0x02:
            text += payload.decode()
    save(out, "stdio", bytes(audio), text)


def ask_api(out: Path) -> None:
    """The Python API: another voice, sampled with a seed, the speech given whole."""
    import personaplex_edge as pe
    from personaplex_edge.audio import pcm16_bytes, read_audio

    with pe.load("demo", device="cpu", progress=lambda s: None) as model:
        with model.conversation(voice="NATM1", seed=3) as conv:
            answer = conv.respond(read_audio(HELLO, model.sample_rate))
    save(out, "api", pcm16_bytes(answer.pcm), answer.text)


def ask_opus(out: Path, stream: Path | None) -> None:
    """The server's codec alone: the bundled speech encoded as /api/chat's answers are, then
    decoded here (opus-encode; the stream kept as opus-encode.ogg), and `stream` - another
    machine's opus-encode.ogg, or this one's - decoded as /api/chat's questions are
    (opus-decode)."""
    from personaplex_edge.audio import pcm16_bytes, read_audio
    from personaplex_edge.runtime.serve.opus import OpusDecoder, OpusEncoder

    pcm = read_audio(HELLO, 24000)
    encoder = OpusEncoder(24000)
    data = b"".join(encoder.encode(pcm[i:i + FRAME]) for i in range(0, pcm.shape[0], FRAME))
    (out / "opus-encode.ogg").write_bytes(data)
    for name, ogg in (("opus-encode", data), ("opus-decode", (stream or out / "opus-encode.ogg")
                                                               .read_bytes())):
        save(out, name, pcm16_bytes(np.concatenate(OpusDecoder(24000, FRAME).feed(ogg))))


def ask_vad(out: Path) -> None:
    """The assistant's voice detectors on the bundled speech, then music (bench_vad's piano and
    drum): each frame's call as text ("1" a voice, "0" none); the samples each judged (webrtc:
    the frame as its int16 blocks; silero: the frame taken to 16 kHz by the runtime's filter)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_vad import _piano

    from personaplex_edge.audio import pcm16_bytes, read_audio
    from personaplex_edge.runtime.assistant.silero import ThirdsDown
    from personaplex_edge.runtime.assistant.vad import voice_detector

    signal = np.concatenate([read_audio(HELLO, 24000), _piano(6.0, np.random.default_rng(0))])
    frames = [signal[i:i + FRAME] for i in range(0, signal.shape[0] - FRAME + 1, FRAME)]
    for engine in ("webrtc", "silero"):
        vad = voice_detector(engine)
        calls = "".join("1" if vad.speech(f) else "0" for f in frames)
        if engine == "silero":
            down = ThirdsDown(FRAME)
            heard = np.concatenate([down(f).copy() for f in frames])
        else:
            heard = signal[:len(frames) * FRAME]
        save(out, f"vad-{engine}", pcm16_bytes(heard), calls)


def ask_serve(url: str, out: Path) -> None:
    """One client of each protocol, at the pace of real time, until every answer frame came."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_serve import opus_pages, opus_round_trip, speech, talk, talk_realtime

    pcm = speech(4.0)
    pages = opus_pages(pcm)
    frames = len(opus_round_trip(pages)) // FRAME  # what the server decodes, frame for frame
    chat = asyncio.run(talk(url, pages, until_frames=frames, tail_s=600, keep=True,
                            handshake_timeout=600))
    realtime = asyncio.run(talk_realtime(url, pcm, session={}, until_frames=pcm.shape[0] // FRAME,
                                         tail_s=600, keep=True, ready_timeout=600))
    for name, res in (("chat", chat), ("realtime", realtime)):
        if res.errors:
            raise SystemExit(f"{name}: the server said {res.errors}")
        save(out, name, res.audio, res.text)


def main(argv: list[str]) -> None:
    if argv[:1] == ["local"] and len(argv) in (2, 3):
        out = Path(argv[1])
        out.mkdir(parents=True, exist_ok=True)
        ask_run(out, "run-greedy", "--greedy")
        ask_run(out, "run-seeded", "--seed", "7")
        ask_stdio(out)
        ask_api(out)
        ask_opus(out, Path(argv[2]) if len(argv) == 3 else None)
        ask_vad(out)
    elif argv[:1] == ["serve"] and len(argv) == 3:
        out = Path(argv[2])
        out.mkdir(parents=True, exist_ok=True)
        ask_serve(argv[1], out)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
