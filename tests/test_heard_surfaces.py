"""What the user said, on every wire: `/v1/realtime` (the openai SDK's GA and beta clients, their
own types validating every event; over WebRTC, an aiortc call), `/api/chat` and `stdio` (the
HEARD message), on the model exported with a transcriber (tests/conftest_stt.py). What each
wire carries is what the Python API hears from the same audio (or, where the audio goes through
a codec or a real-time clock, from the frames the model stepped); a model without a transcriber
refuses the request with the protocol's own error."""

from __future__ import annotations

import asyncio
import functools
import json
import struct
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("aiohttp")
openai = pytest.importorskip("openai")

from bench_serve import ServerThread  # noqa: E402
from conftest_stt import (FRAMES, builtin_demo_dir, heard_of, plain_model_dir,  # noqa: E402
                          serve_options, stt_bundle, stt_model_dir)
from pydantic import TypeAdapter  # noqa: E402
from realtime_sdk import sdk_events  # noqa: E402

from personaplex_edge.audio import pcm16_bytes  # noqa: E402


@pytest.fixture(scope="module")
def heard():
    return api_heard()


@functools.lru_cache(maxsize=None)
def api_heard():
    """What the Python API hears of the bundle's audio: (events, the PCM16 sent on wires)."""
    pcm16 = pcm16_bytes(stt_bundle().pcm)
    events = heard_of(np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768)
    turns = [e for e in events if e.kind == "turn"]
    assert turns, "the bundle's audio must end a turn (its VAD head passes 0.6)"
    return events, pcm16


@pytest.fixture(scope="module")
def server():
    with ServerThread(serve_options(stt_model_dir())) as srv:
        yield srv


async def _realtime(connect, session: dict, pcm16: bytes, until: str,
                    commit_first: bool = False) -> list[dict]:
    """An SDK connection: the update, then the audio, then events until one of type `until`."""
    stop = None if until == "session.updated" else (lambda event: event.type == until)
    return await sdk_events(connect, session, pcm16, 3840, stop, commit_first)


def _first_turn(events):
    first = [e for e in events if e.item == 1]
    pieces = "".join(e.text for e in first if e.kind == "piece")
    turn = next(e for e in first if e.kind == "turn")
    return pieces, turn


def _transcripts(events) -> dict[str, tuple[str, str]]:
    """Per user item of a session's events: (its deltas joined, its completed transcript)."""
    out: dict[str, list[str]] = {}
    for e in events:
        if e["type"] == "conversation.item.input_audio_transcription.delta":
            out.setdefault(e["item_id"], ["", ""])[0] += e["delta"]
        elif e["type"] == "conversation.item.input_audio_transcription.completed":
            out.setdefault(e["item_id"], ["", ""])[1] = e["transcript"]
    return {k: tuple(v) for k, v in out.items()}


def test_the_sdk_ga_client_gets_the_users_words(server, heard):
    from openai.types.realtime import RealtimeServerEvent

    events_api, pcm16 = heard
    client = openai.AsyncOpenAI(api_key="k", base_url=server.url + "v1")
    session = {"type": "realtime", "audio": {"input": {"transcription": {"model": "any"}}}}
    events = asyncio.run(asyncio.wait_for(_realtime(
        client.realtime.connect(model="personaplex"), session, pcm16,
        "conversation.item.input_audio_transcription.completed"), 120))
    adapter = TypeAdapter(RealtimeServerEvent)
    for event in events:
        adapter.validate_python(event)
    updated = next(e for e in events if e["type"] == "session.updated")["session"]
    assert updated["audio"]["input"]["transcription"]["model"]
    user_items = [e for e in events if e["type"] == "conversation.item.added"
                  and e["item"]["role"] == "user"]
    assert len(user_items) == 1
    item_id = user_items[0]["item"]["id"]
    deltas = [e for e in events
              if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert deltas and {d["item_id"] for d in deltas} == {item_id}
    assert all(d["content_index"] == 0 for d in deltas)
    done = events[-1]
    pieces, turn = _first_turn(events_api)
    assert "".join(d["delta"] for d in deltas) == pieces
    assert done["item_id"] == item_id and done["transcript"] == turn.text
    # the deltas joined are the transcript, with no space before it
    assert _transcripts(events)[item_id] == (turn.text, turn.text)
    # the codes the transcriber read from the frame the speech began in (the turn's start,
    # its 0.5 s delay before the first piece) to the frame that ended it, 32 a frame
    assert done["usage"]["type"] == "tokens"
    began = int(turn.start * 12.5 + 1e-6)
    assert done["usage"]["input_tokens"] == (turn.frame - began + 1) * 32
    assert done["usage"]["output_tokens"] == len(deltas)


def test_end_turn_before_the_words_are_written_ends_the_turn_once_they_are(heard):
    """The Python API: end_turn() before the first frame, when nothing can be written yet
    (the transcriber runs 0.5 s behind). The turn is due 8 frames on (the 0.5 s in 7 frames,
    and one) and ends at the first frame from there that does not go on with a word, holding
    every piece written before it; without the call it runs on to the VAD's end."""
    events_api, pcm16 = heard
    events = heard_of(np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768, end_turn_at=0)
    piece_at = {e.frame: e.text for e in events_api if e.kind == "piece"}  # the same tokens
    end = 7
    while end in piece_at and not piece_at[end].startswith(" "):  # inside a word: it waits
        end += 1
    first = next(e for e in events if e.kind == "turn")
    assert (first.frame, first.item) == (end, 1)
    assert first.text == "".join(piece_at[f] for f in sorted(piece_at) if f < end).strip()
    assert first.frame < next(e for e in events_api if e.kind == "turn").frame


def test_a_commit_before_the_users_words_are_written_ends_their_turn(server, heard):
    """Push-to-talk over the openai SDK: input_audio_buffer.commit before the text of the
    audio committed is written (the transcriber runs 0.5 s behind; here it comes before any
    audio, the one moment this random model writes no piece). Its turn ends once that text
    has had time to arrive - at the first word's end after 8 frames, as the Python API's
    end_turn() ends it - instead of running on into the next words; each item's deltas joined
    are its transcript."""
    events_api, pcm16 = heard
    pcm = np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768
    committed = [e for e in heard_of(pcm, end_turn_at=0) if e.kind == "turn"]
    uncommitted = [e for e in events_api if e.kind == "turn"]
    assert committed[0].text != uncommitted[0].text  # the commit is what the test sees
    client = openai.AsyncOpenAI(api_key="k", base_url=server.url + "v1")
    session = {"type": "realtime", "audio": {"input": {"transcription": {"model": "any"}}}}
    completed = 0

    def second_done(event) -> bool:
        nonlocal completed
        completed += event.type == "conversation.item.input_audio_transcription.completed"
        return completed == 2

    events = asyncio.run(asyncio.wait_for(sdk_events(
        client.realtime.connect(model="personaplex"), session, pcm16, 3840, second_done,
        commit_first=True), 120))
    transcripts = list(_transcripts(events).values())
    assert [t for _, t in transcripts] == [t.text for t in committed[:2]]
    assert all(deltas == transcript for deltas, transcript in transcripts)


def test_the_sdk_beta_client_gets_the_beta_names(server, heard):
    from openai.types.beta.realtime import RealtimeServerEvent

    _, pcm16 = heard
    client = openai.AsyncOpenAI(api_key="k", base_url=server.url + "v1",
                                websocket_base_url=server.url.replace("http", "ws", 1) + "v1")
    events = asyncio.run(asyncio.wait_for(_realtime(
        client.beta.realtime.connect(model="personaplex"),
        {"input_audio_transcription": {"model": "whisper-1"}}, pcm16,
        "conversation.item.input_audio_transcription.completed"), 120))
    adapter = TypeAdapter(RealtimeServerEvent)
    for event in events:
        if event["type"].startswith("session."):  # the beta's types list OpenAI's models only
            event["session"]["model"] = "gpt-realtime"
        adapter.validate_python(event)
    assert any(e["type"] == "conversation.item.created" and e["item"]["role"] == "user"
               for e in events)
    assert not any(e["type"] == "conversation.item.added" for e in events)
    assert next(e for e in events if e["type"] == "session.updated")["session"][
        "input_audio_transcription"]


def test_transcription_asked_of_a_model_without_one_is_an_error_naming_the_field():
    from openai.types.realtime import RealtimeServerEvent

    with ServerThread(serve_options(plain_model_dir())) as srv:
        client = openai.AsyncOpenAI(api_key="k", base_url=srv.url + "v1")
        session = {"type": "realtime", "instructions": "Be brief.",
                   "audio": {"input": {"transcription": {"model": "x"}}}}
        events = asyncio.run(asyncio.wait_for(_realtime(
            client.realtime.connect(model="personaplex"), session, b"", "session.updated"),
            60))
    adapter = TypeAdapter(RealtimeServerEvent)
    for event in events:
        adapter.validate_python(event)
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert len(errors) == 1 and errors[0]["param"] == "session.audio.input.transcription"
    assert "transcriber" in errors[0]["message"]
    # the rest of the update applies: its instructions, no transcription
    updated = events[-1]["session"]
    assert updated["instructions"] == "Be brief."
    assert updated["audio"]["input"]["transcription"] is None


def test_a_webrtc_call_carries_the_users_words(server):
    """`/v1/realtime` over WebRTC (an aiortc client, benchmarks/bench_webrtc.py) with the
    transcription turned on in the call's session: the user's words come on the data channel,
    the openai SDK's types accept every event, and they are what the Python API hears of the
    very frames the model stepped (after Opus and the jitter buffer, recorded by
    tests/call_tap.py): the deltas its pieces, each completed transcript its turn."""
    pytest.importorskip("aiortc", reason="the webrtc extra (scripts/install.sh installs it)")
    from bench_serve import wait_until
    from bench_webrtc import call
    from call_tap import ModelInput
    from openai.types.realtime import RealtimeServerEvent

    session = {"type": "realtime", "audio": {"input": {"transcription": {"model": "any"}}}}
    tap = ModelInput(server)
    try:
        res = asyncio.run(asyncio.wait_for(call(server.url, stt_bundle().pcm, session=session,
                                                tail_s=2.0), 120))
        assert wait_until(lambda: server.state.slots_used == 0, 10)
        stepped = tap.only()
    finally:
        tap.close()
    assert res.status == 201, res.error
    adapter = TypeAdapter(RealtimeServerEvent)
    for event in res.events:
        adapter.validate_python(event)
    assert res.events[0]["session"]["audio"]["input"]["transcription"]["model"]
    deltas = "".join(e["delta"] for e in res.events
                     if e["type"] == "conversation.item.input_audio_transcription.delta")
    completed = [e["transcript"] for e in res.events
                 if e["type"] == "conversation.item.input_audio_transcription.completed"]

    api = heard_of(stepped)
    pieces = "".join(e.text for e in api if e.kind == "piece")
    turns = [e.text for e in api if e.kind == "turn"]
    assert completed and deltas, res.events  # a turn heard and ended within the call
    # the call's events end where the call did; the API heard every stepped frame
    assert pieces.startswith(deltas) and completed == turns[:len(completed)]


# ---- the moshi-protocol wires: the HEARD message ---------------------------------------------------
def test_api_chat_sends_heard_messages_to_a_client_that_asks(server, heard):
    import aiohttp

    from personaplex_edge.runtime.serve.opus import OpusEncoder

    events_api, pcm16 = heard
    pcm = np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768

    async def scene():
        got = []
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(server.url.replace("http", "ws", 1) + "api/chat") as ws:
                assert (await ws.receive()).data == b"\x00"
                await ws.send_bytes(b"\x09" + json.dumps({"hear": True}).encode())
                encoder = OpusEncoder(24000)
                for i in range(FRAMES):
                    pages = encoder.encode(pcm[i * 1920:(i + 1) * 1920])
                    if pages:
                        await ws.send_bytes(b"\x01" + pages)
                answers = 0
                while answers < FRAMES - 2:  # the answers to the frames sent (Opus delays)
                    msg = await asyncio.wait_for(ws.receive(), 60)
                    if msg.data[0] == 0x09:
                        got.append(json.loads(msg.data[1:]))
                    answers += msg.data[0] == 0x01
                return got

    got = asyncio.run(asyncio.wait_for(scene(), 120))
    # Opus is lossy: the words are those of its audio, not the API's; their form is checked
    pieces = [g for g in got if g["event"] == "piece"]
    words = [g for g in got if g["event"] == "word"]
    assert len(pieces) > 10 and words
    assert [g["step"] for g in got] == sorted(g["step"] for g in got)
    assert "".join(w["text"] for w in words) in "".join(p["text"] for p in pieces).replace(
        " ", "")
    assert all(0 <= w["start"] <= w["end"] for w in words)


def test_api_chat_heard_request_without_a_transcriber_is_an_error():
    import aiohttp

    model_dir = plain_model_dir()

    async def scene():
        async with aiohttp.ClientSession() as http:
            with ServerThread(serve_options(model_dir)) as srv:
                async with http.ws_connect(srv.url.replace("http", "ws", 1)
                                           + "api/chat") as ws:
                    assert (await ws.receive()).data == b"\x00"
                    await ws.send_bytes(b"\x09" + b'{"hear": true}')
                    msg = await asyncio.wait_for(ws.receive(), 30)
                    closed = await asyncio.wait_for(ws.receive(), 30)
                    return msg.data, closed.type

    data, closed = asyncio.run(scene())
    # the fix, and not where the server keeps its files
    assert data[0] == 0x05 and b"add one with personaplex-edge export --transcriber" in data
    assert str(model_dir).encode() not in data
    assert closed in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                      aiohttp.WSMsgType.CLOSING)


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack("<I", len(payload) + 1) + bytes([kind]) + payload


def _messages(data: bytes):
    at = 0
    while at < len(data):
        (n,) = struct.unpack_from("<I", data, at)
        yield data[at + 4], data[at + 5:at + 4 + n]
        at += 4 + n


def test_stdio_sends_heard_messages_equal_to_the_apis(heard):
    """What stdio sends of the user's words is what the API hears of the same audio - to the
    end: at EOF the words still inside the transcriber's delay, and the last turn's end (as
    flush_heard gives them)."""
    _, pcm16 = heard
    events_api = heard_of(np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768, flush=True)
    assert events_api[-1].kind == "turn" and events_api[-1].frame >= FRAMES
    stdin = _frame(0x09, b'{"hear": true}') + _frame(0x01, pcm16)
    done = subprocess.run([sys.executable, "-m", "personaplex_edge.cli", "stdio", "--model",
                           str(stt_model_dir()), "--no-persona", "--device", "cpu"],
                          input=stdin, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    got = [json.loads(p) for k, p in _messages(done.stdout) if k == 0x09]
    want = [{"event": e.kind, "text": e.text, "item": e.item, "step": e.frame}
            for e in events_api]
    assert [{k: g[k] for k in ("event", "text", "item", "step")} for g in got] == want


def test_stdio_heard_request_without_a_transcriber_exits_2():
    model_dir = plain_model_dir()
    done = subprocess.run([sys.executable, "-m", "personaplex_edge.cli", "stdio", "--model",
                           str(model_dir), "--no-persona", "--device", "cpu"],
                          input=_frame(0x09, b'{"hear": true}'), capture_output=True,
                          timeout=120)
    assert done.returncode == 2
    errors = [p for k, p in _messages(done.stdout) if k == 0x05]
    assert errors and (f"HEARD: the model {model_dir} has no transcriber".encode()
                       in errors[0]) and f"--out {model_dir}".encode() in errors[0]


def test_the_assistants_socket_events_carry_the_users_words(heard):
    """The assistant's step (its IdleGate, what the control socket publishes): the same pieces
    and words as `heard`, and the turn's end."""
    import personaplex_edge as pe
    from personaplex_edge.runtime.assistant.idle import IdleGate, IdlePolicy
    from personaplex_edge.runtime.persona import Persona

    events_api, pcm16 = heard
    pcm = np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768
    model = pe.load(stt_model_dir(), device="cpu")
    published = []
    try:
        conv = model.open_conversation(persona=Persona(enabled=False))
        conv.prefill()
        gate = IdleGate(conv, model.text, IdlePolicy(sleep_after_frames=0), published.append)
        for i in range(FRAMES):
            gate(pcm[i * 1920:(i + 1) * 1920])
        conv.close()
    finally:
        model.close()
    got = [e for e in published if e["event"] in ("heard", "turn_end")]
    assert [(e["event"], e["heard"], e["text"], e["step"]) for e in got] == [
        ("turn_end" if e.kind == "turn" else "heard", e.kind, e.text, e.frame)
        for e in events_api]


# ---- the built-in demo ---------------------------------------------------------------------------
def test_the_builtin_demo_hears_the_user_on_every_surface(tmp_path, capsys):
    """`--model demo` has a transcriber of random weights (export/synthetic.py), so the user's
    words work on it out of the box: `run --user-text-out` (a record of every frame, the
    silence after included, and the heard line), stdio's HEARD (pieces, words, the turn's
    end at EOF), and /v1/realtime with transcription on through the openai SDK - deltas and a
    completed transcript, their join, and no error event. Its babble is random; what each
    surface carries is checked against the Python API on the same audio."""
    from bench_serve import HELLO

    import personaplex_edge as pe
    from personaplex_edge.audio import write_audio
    from personaplex_edge.cli import main

    demo = builtin_demo_dir()
    model = pe.load(demo, device="cpu")
    pcm = pe.read_audio(HELLO, model.sample_rate)
    write_audio(tmp_path / "in.wav", pcm[:pcm.shape[0] // 1920 * 1920])
    pcm = pe.read_audio(tmp_path / "in.wav")  # what run reads
    try:
        assert model.loaded.transcriber is not None
        with model.conversation(persona=False, greedy=True) as conv:
            response = conv.respond(pcm)
        with model.conversation(persona=False, greedy=True) as conv:
            for at in range(0, pcm.shape[0], 1920):
                conv.step(pcm[at:at + 1920])
            live = conv.heard_events()
    finally:
        model.close()
    frames = pcm.shape[0] // 1920
    assert len(response.heard_records) == frames + 18 and response.heard

    capsys.readouterr()
    assert main(["run", "--model", "demo", "--input", str(tmp_path / "in.wav"), "--output",
                 str(tmp_path / "o.wav"), "--user-text-out", str(tmp_path / "u.json"),
                 "--greedy", "--no-persona"]) == 0
    assert f"heard: {response.heard}" in capsys.readouterr().out.splitlines()
    assert len(json.loads((tmp_path / "u.json").read_text())) == len(response.heard_records)

    pcm16 = pcm16_bytes(pcm)
    done = subprocess.run([sys.executable, "-m", "personaplex_edge.cli", "stdio", "--model",
                           str(demo), "--no-persona", "--device", "cpu"],
                          input=_frame(0x09, b'{"hear": true}') + _frame(0x01, pcm16),
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    got = [json.loads(p) for k, p in _messages(done.stdout) if k == 0x09]
    assert {g["event"] for g in got} == {"piece", "word", "turn"}

    turns = [e for e in live if e.kind == "turn"]
    assert turns, "the demo's random VAD heads end a turn within the audio"
    with ServerThread(serve_options(demo)) as srv:
        client = openai.AsyncOpenAI(api_key="k", base_url=srv.url + "v1")
        session = {"type": "realtime", "audio": {"input": {"transcription": {"model": "x"}}}}
        events = asyncio.run(asyncio.wait_for(_realtime(
            client.realtime.connect(model="personaplex"), session, pcm16,
            "conversation.item.input_audio_transcription.completed"), 120))
    assert not [e for e in events if e["type"] == "error"]
    [(deltas, transcript)] = _transcripts(events).values()
    assert deltas == transcript == turns[0].text
