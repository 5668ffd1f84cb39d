"""`say` on every surface, each equal to `run --greedy --say TEXT --say-at S` on the same audio:
`stdio`'s SAY message between two audio messages, `/api/chat`'s SAY message, and `/v1/realtime`
through the official `openai` SDK (an assistant item, then response.create), with the events
each surface promises; and the example app in examples/ against a served demo model."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("sphn")
openai = pytest.importorskip("openai")

from bench_serve import (FRAME, opus_pages, opus_round_trip, reference_run,  # noqa: E402
                         speech, talk)
from pydantic import TypeAdapter  # noqa: E402
from test_stdio import _message, _messages, _stdio  # noqa: E402  (stdio's framing)

from personaplex_edge.audio import pcm16_bytes  # noqa: E402

AUDIO, TEXT, ERROR, SAY = 0x01, 0x02, 0x05, 0x08
WORDS = "hello there friend"
ROOT = Path(__file__).resolve().parents[1]


def _say(text: str) -> bytes:
    return json.dumps({"say": text}).encode()


def _word_order(said: list[dict], first_step: int) -> None:
    """queued, then started/done for each word in order, steps rising from `first_step` + 2
    (the forced PADs), every word's done after its start, the last one marked."""
    assert said[0] == {"event": "queued", "utterance": 1, "words": WORDS.split()}
    events = [(e["event"], e["word"]) for e in said[1:]]
    assert events == [(k, w) for w in WORDS.split() for k in ("started", "done")]
    steps = [e["step"] for e in said[1:]]
    assert steps == sorted(steps) and steps[0] >= first_step + 2
    assert [e["last"] for e in said[1:]] == [False] * 5 + [True]


def test_stdio_say_between_two_audio_messages_equals_run_say_at_that_frame(demo_model_dir,
                                                                          tmp_path):
    """AUDIO (10 frames), SAY, AUDIO (the rest): the answer and its text are `run --greedy
    --say TEXT --say-at 0.8`'s; SAY messages answer with the utterance and its word events,
    each after the answer frame that made it."""
    samples = np.frombuffer(pcm16_bytes(speech(3.0)), "<i2")
    k = 10
    data = samples.astype("<i2").tobytes()
    stdin = (_message(AUDIO, data[:k * FRAME * 2]) + _message(SAY, _say(WORDS))
             + _message(AUDIO, data[k * FRAME * 2:]))
    done = _stdio(demo_model_dir, stdin, "--greedy", "--no-persona")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    messages = _messages(done.stdout)
    text, expected = reference_run(demo_model_dir, samples, tmp_path, "--greedy",
                                   "--no-persona", "--say", WORDS, "--say-at", str(k * 0.08))
    answer = np.frombuffer(b"".join(p for kind, p in messages if kind == AUDIO), "<i2")
    np.testing.assert_array_equal(answer, expected)
    assert "".join(p.decode() for kind, p in messages if kind == TEXT) == text
    assert " hello there friend" in text
    said = [json.loads(p) for kind, p in messages if kind == SAY]
    _word_order(said, k)
    kinds = [kind for kind, _ in messages]
    assert kinds.index(SAY) > [i for i, kk in enumerate(kinds) if kk == AUDIO][k - 1]


@pytest.mark.parametrize("payload, reason", [(b"not json", "one JSON object"),
                                              (b'{"speak": "hi"}', '{"say": "text"}')])
def test_stdio_a_bad_say_is_an_error_and_exit_2(demo_model_dir, payload, reason):
    done = _stdio(demo_model_dir, _message(AUDIO, bytes(3840)) + _message(SAY, payload),
                  "--no-persona")
    assert done.returncode == 2 and b"Traceback" not in done.stderr
    errors = [p.decode() for kind, p in _messages(done.stdout) if kind == ERROR]
    assert len(errors) == 1 and reason in errors[0]


def test_api_chat_say_message_equals_run_say_at_0(greedy_server, demo_model_dir, tmp_path):
    """SAY right after the handshake, then the audio as fast as it goes: the text equals `run
    --greedy --say TEXT` on the audio the server decoded; the word events come back as SAY."""
    pages = opus_pages(speech(3.0))
    n = len(opus_round_trip(pages)) // FRAME
    r = asyncio.run(talk(greedy_server.url, pages, pace=None, until_frames=n, tail_s=20,
                         first=(bytes([SAY]) + _say(WORDS),)))
    text, _ = reference_run(demo_model_dir, opus_round_trip(pages), tmp_path, "--greedy",
                            "--say", WORDS)
    assert not r.errors and r.text == text and " hello there friend" in text
    _word_order(r.said, 0)


def test_api_chat_a_bad_say_ends_only_its_session_with_the_reason(greedy_server):
    import aiohttp

    async def client():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(greedy_server.url.replace("http", "ws") + "api/chat") as ws:
                assert (await ws.receive(timeout=30)).data == b"\x00"
                await ws.send_bytes(bytes([SAY]) + b'{"cancel": "yes"}')
                return [m.data async for m in ws if m.type == aiohttp.WSMsgType.BINARY]

    got = asyncio.run(asyncio.wait_for(client(), 60))
    assert got[-1][:1] == bytes([ERROR]) and b'{"say": "text"} or {"cancel": true}' in got[-1]


def _connect(url: str):
    return openai.AsyncOpenAI(api_key="any key", base_url=url + "v1").realtime.connect(
        model="personaplex-7b-v1")


async def _ready_to_say(conn, events: list[dict]) -> None:
    """session.update, its session.updated, then an assistant item and response.create."""
    await conn.session.update(session={"type": "realtime"})
    async for event in conn:
        events.append(event.to_dict())
        if event.type == "session.updated":
            break
    await conn.conversation.item.create(item={
        "type": "message", "role": "assistant",
        "content": [{"type": "output_text", "text": WORDS}]})
    await conn.response.create()


async def _append(conn, data: bytes) -> None:
    for at in range(0, len(data), 4 * FRAME):
        await conn.input_audio_buffer.append(
            audio=base64.b64encode(data[at:at + 4 * FRAME]).decode())


async def _read(conn, events: list[dict], frames: int | None = None, quiet_s: float = 1.5):
    """Events until `frames` more answer frames came (None: until none for `quiet_s`)."""
    audio = 0
    while frames is None or audio < frames * FRAME:
        try:
            event = await asyncio.wait_for(conn.recv(), quiet_s if frames is None else 60)
        except asyncio.TimeoutError:
            return
        events.append(event.to_dict())
        if event.type == "response.output_audio.delta":
            audio += len(base64.b64decode(event.delta)) // 2


def _of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def _transcript(events: list[dict]) -> str:
    return "".join(e["delta"] for e in _of(events, "response.output_audio_transcript.delta"))


def test_realtime_an_assistant_item_is_said_in_a_response_of_its_own(greedy_server,
                                                                      demo_model_dir,
                                                                      tmp_path):
    """`conversation.item.create` (assistant, output_text) + `response.create` from the
    unmodified openai SDK: the item is echoed; the audio and transcript equal `run --greedy
    --say TEXT`; the words' response is done (completed) once they are said, its transcript
    holding them, and the model goes on in the next response. Every event is valid for the
    SDK's own types."""
    from openai.types.realtime import RealtimeServerEvent

    samples = np.frombuffer(pcm16_bytes(speech(4.0)), "<i2")
    events: list[dict] = []

    async def client():
        async with _connect(greedy_server.url) as conn:
            await _ready_to_say(conn, events)
            await _append(conn, samples.tobytes())
            await _read(conn, events, samples.shape[0] // FRAME)

    asyncio.run(asyncio.wait_for(client(), 90))
    text, expected = reference_run(demo_model_dir, samples, tmp_path, "--greedy",
                                   "--say", WORDS)
    adapter = TypeAdapter(RealtimeServerEvent)
    for e in events:
        adapter.validate_python(e)
    assert not [e for e in events if e["type"] == "error"]
    added = _of(events, "conversation.item.added")
    assert added[0]["item"]["role"] == "assistant"
    assert added[0]["item"]["content"] == [{"type": "output_text", "text": WORDS}]
    audio = b"".join(base64.b64decode(e["delta"]) for e in _of(events,
                                                               "response.output_audio.delta"))
    np.testing.assert_array_equal(np.frombuffer(audio, "<i2"), expected)
    assert _transcript(events) == text
    done = [e["response"] for e in _of(events, "response.done")]
    assert done[0]["status"] == "completed"
    said = done[0]["output"][0]["content"][0]["transcript"]
    assert said.strip().endswith("hello there friend") and len(done) == 1
    opened = [e["response"]["id"] for e in _of(events, "response.created")]
    assert len(opened) == 2 and opened[0] == done[0]["id"]  # the model goes on in a new one


def test_realtime_response_cancel_drops_the_words_not_started(greedy_server, demo_model):
    """response.cancel once the first word is heard (after 10 frames, the server idle): its
    response ends `cancelled`; the words not started are never said; the whole transcript is
    the API's for the same audio with cancel_say() before step 10."""
    samples = np.frombuffer(pcm16_bytes(speech(3.0)), "<i2")
    data, k = samples.tobytes(), 10
    events: list[dict] = []

    async def client():
        async with _connect(greedy_server.url) as conn:
            await _ready_to_say(conn, events)
            await _append(conn, data[:k * FRAME * 2])
            await _read(conn, events, k)
            await conn.response.cancel()
            await _append(conn, data[k * FRAME * 2:])
            await _read(conn, events)

    asyncio.run(asyncio.wait_for(client(), 90))
    assert " hello" in _transcript(events[:next(i for i, e in enumerate(events)
                                                 if e["type"] == "response.done")])
    done = [e["response"] for e in _of(events, "response.done")]
    assert done[0]["status"] == "cancelled"
    assert done[0]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    pcm = samples.astype(np.float32) / 32768
    with demo_model.conversation(greedy=True) as conv:
        conv.say(WORDS)
        pieces = []
        for i in range(samples.shape[0] // FRAME):
            if i == k:
                conv.cancel_say()
            pieces.append(conv.step(pcm[i * FRAME:(i + 1) * FRAME])[1])
        kinds = [(e.kind, e.word) for e in conv.say_events()]
    started = [w for kind, w in kinds if kind == "started"]
    assert started and ("cancelled", "friend") in kinds  # cut between its first and last word
    assert sorted(w for kind, w in kinds if kind == "done") == sorted(started)
    assert _transcript(events) == "".join(pieces) and "friend" not in "".join(pieces)
    assert not _of(events, "error")


@pytest.mark.parametrize("mode", ["after", "lines"])
def test_the_announcer_example_speaks_through_a_running_serve(greedy_server, tmp_path, mode):
    """examples/announcer.py against a served demo model, silence in, a wav out: a timed
    announcement, and the tool/LLM pattern (each line of stdin said as it comes), each heard
    in the model's transcript while the conversation goes on."""
    import soundfile as sf

    seconds = 5.0 if mode == "after" else 7.0
    args = [sys.executable, str(ROOT / "examples" / "announcer.py"), "--url", greedy_server.url,
            "--silence", "--seconds", str(seconds), "--save", str(tmp_path / "out.wav")]
    lines = ["your tea is ready"] + (["the door is open"] if mode == "lines" else [])
    if mode == "after":
        args += ["--after", "0.5", lines[0]]
    else:
        args += ["--lines"]
    done = subprocess.run(args, input="".join(f"{line}\n" for line in lines).encode(),
                          capture_output=True, timeout=90)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    out = done.stdout.decode()
    for line in lines:
        assert f"[to say: {line}]" in out and f" {line}" in out, out
    audio, rate = sf.read(tmp_path / "out.wav")
    assert rate == 24000 and audio.shape[0] == round(seconds * 12.5) * FRAME
