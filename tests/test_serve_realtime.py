"""`/v1/realtime` (OpenAI Realtime over WebSocket) on the demo model, driven by clients nobody
here wrote: the official `openai` SDK's GA and beta clients (every event they receive checked
against the SDK's own event types), and vllm-omni's PersonaPlex acceptance re-implemented on the
`websockets` library it uses. Greedy answers - audio and transcript - equal `run --greedy` on
the same PCM16; bad events are answered and the session goes on; the Host, Origin and token
checks guard both WebSocket routes. (pipecat: test_serve_pipecat.py; Ctrl-C: test_serve_cli.py.)"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import time

import numpy as np
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
websockets = pytest.importorskip("websockets")

import aiohttp  # noqa: E402
from bench_serve import (FRAME, FRAME_S, ServerThread, realtime_url, reference_run,  # noqa: E402
                         speech, talk_realtime, wait_until)
from pydantic import TypeAdapter  # noqa: E402
from realtime_sdk import sdk_events  # noqa: E402

from personaplex_edge.runtime.persona import DEFAULT_TEXT_PROMPT  # noqa: E402
from personaplex_edge.runtime.serve import ServeOptions  # noqa: E402
from personaplex_edge.audio import pcm16_bytes as pcm16  # noqa: E402

FRAME_BYTES = 2 * FRAME  # PCM16
GA_ONLY = {"response.output_audio.delta", "response.output_audio_transcript.delta",
           "conversation.item.added"}
BETA_ONLY = {"response.audio.delta", "response.audio_transcript.delta",
             "conversation.item.created"}


@pytest.fixture(scope="module")
def samples():
    """4 s of the bundled speech as the PCM16 samples every client here sends."""
    return np.frombuffer(pcm16(speech(4.0)), "<i2")


def check_events(events: list[dict], adapter: TypeAdapter) -> None:
    """What every client may rely on: each event valid for the SDK's own types, each with its
    own event_id, session.created first."""
    for event in events:
        adapter.validate_python(event)
    ids = [e["event_id"] for e in events]
    assert all(ids) and len(set(ids)) == len(ids)
    assert events[0]["type"] == "session.created"


async def sdk_conversation(connect, data: bytes, session: dict, chunk: int, frames: int,
                           audio_delta: str) -> tuple[list[dict], bytes]:
    """Through an SDK connection: session.update, wait for session.updated, append `data` in
    `chunk`-byte events as fast as the SDK sends, read until `frames` answer frames came."""
    audio = bytearray()

    def enough(event) -> bool:
        if event.type == audio_delta:
            audio.extend(base64.b64decode(event.delta))
        return len(audio) >= frames * FRAME_BYTES

    events = await sdk_events(connect, session, data, chunk, enough)
    return events, bytes(audio)


def answers(events: list[dict], audio_delta: str, transcript_delta: str):
    deltas = [e for e in events if e["type"] == audio_delta]
    text = "".join(e["delta"] for e in events if e["type"] == transcript_delta)
    return deltas, text


# -- the official openai SDK ------------------------------------------------------------------
def test_the_sdk_ga_client_hears_what_run_greedy_says(greedy_server, demo_model_dir, samples,
                                                      tmp_path):
    """`AsyncOpenAI(base_url=.../v1).realtime.connect`: the session's instructions and voice
    are the persona; audio appended in odd-sized events (a byte of a sample carried over) is
    answered frame for frame; the audio and the transcript equal `run --greedy` with the same
    persona on the same PCM16, under one response id, in GA names only."""
    from openai.types.realtime import RealtimeServerEvent

    prompt = "You enjoy having a good conversation."
    n = samples.shape[0] // FRAME
    client = openai.AsyncOpenAI(api_key="any key", base_url=greedy_server.url + "v1")
    session = {"type": "realtime", "instructions": prompt, "model": "personaplex-7b-v1",
               "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}},
                         "output": {"voice": "NATM1"}}}
    events, audio = asyncio.run(asyncio.wait_for(sdk_conversation(
        client.realtime.connect(model="personaplex-7b-v1"), samples.tobytes(), session,
        chunk=5001, frames=n, audio_delta="response.output_audio.delta"), 60))
    text, expected = reference_run(demo_model_dir, samples, tmp_path, "--greedy",
                                   "--text-prompt", prompt, "--voice-prompt", "NATM1")

    check_events(events, TypeAdapter(RealtimeServerEvent))
    updated = next(e for e in events if e["type"] == "session.updated")["session"]
    assert updated["instructions"] == prompt and updated["audio"]["output"]["voice"] == "NATM1"
    assert not [e for e in events if e["type"] == "error"]
    assert not {e["type"] for e in events} & BETA_ONLY
    deltas, transcript = answers(events, "response.output_audio.delta",
                                 "response.output_audio_transcript.delta")
    assert {d["response_id"] for d in deltas} == {events[2]["response"]["id"]}
    assert [e["type"] for e in events[2:6]] == [
        "response.created", "conversation.item.added", "response.output_item.added",
        "response.content_part.added"]
    assert all(len(base64.b64decode(d["delta"])) == FRAME_BYTES for d in deltas)  # whole frames
    assert len(audio) == n * FRAME_BYTES
    np.testing.assert_array_equal(np.frombuffer(audio, "<i2"), expected)
    assert len(transcript) > 5 and transcript == text
    assert all(e["delta"] for e in events  # no empty deltas: padding is not sent
               if e["type"] == "response.output_audio_transcript.delta")


def test_the_sdk_beta_client_gets_the_beta_names(greedy_server, demo_model_dir, samples,
                                                 tmp_path):
    """`client.beta.realtime.connect` (websocket_base_url, `OpenAI-Beta: realtime=v1`): flat
    session fields, beta event names only, and the server's default persona when the update
    names none: `run --greedy`'s answer again."""
    from openai.types.beta.realtime import RealtimeServerEvent

    n = samples.shape[0] // FRAME
    client = openai.AsyncOpenAI(api_key="any key",
                                websocket_base_url=greedy_server.url.replace("http", "ws") + "v1")
    session = {"modalities": ["audio", "text"], "input_audio_format": "pcm16",
               "output_audio_format": "pcm16", "turn_detection": None}
    events, audio = asyncio.run(asyncio.wait_for(sdk_conversation(
        client.beta.realtime.connect(model="personaplex-7b-v1"), samples.tobytes(), session,
        chunk=3 * FRAME_BYTES, frames=n, audio_delta="response.audio.delta"), 60))
    text, expected = reference_run(demo_model_dir, samples, tmp_path, "--greedy")

    for e in events:  # the beta's types list OpenAI's model names, nothing else
        if e["type"].startswith("session."):
            e["session"]["model"] = "gpt-realtime"
    check_events(events, TypeAdapter(RealtimeServerEvent))
    updated = next(e for e in events if e["type"] == "session.updated")["session"]
    assert updated["voice"] == "NATF2" and updated["instructions"] == DEFAULT_TEXT_PROMPT
    assert updated["input_audio_format"] == "pcm16"
    kinds = {e["type"] for e in events}
    assert BETA_ONLY <= kinds and not kinds & GA_ONLY
    deltas, transcript = answers(events, "response.audio.delta",
                                 "response.audio_transcript.delta")
    assert len({d["response_id"] for d in deltas}) == 1
    np.testing.assert_array_equal(np.frombuffer(audio, "<i2"), expected)
    assert transcript == text and len(transcript) > 5


# -- vllm-omni's acceptance, re-implemented -------------------------------------------------------
class Probe:
    """A raw-event client as vllm-omni's PersonaPlex acceptance drives its duplex endpoint
    (the `websockets` library, every event collected as it arrives)."""

    def __init__(self, url: str):
        self.url = url
        self.events: list[dict] = []
        self.sent = 0  # frames streamed

    async def __aenter__(self) -> "Probe":
        self.ws = await websockets.connect(self.url, max_size=64 << 20)
        self.reading = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                self.events.append(json.loads(raw))
        except websockets.ConnectionClosed:
            pass

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()
        await self.reading

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]

    async def wait_for(self, condition, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, [e["type"] for e in self.events[-5:]]
            await asyncio.sleep(0.02)

    def answers(self) -> int:
        return len(self.of("response.output_audio.delta"))

    def audio(self) -> list[bytes]:
        return [base64.b64decode(e["delta"]) for e in self.of("response.output_audio.delta")]

    async def open(self, persona: str, voice: str, expect_error: bool = False) -> dict:
        try:
            await self.ws.send(json.dumps({"type": "session.update", "session": {
                "model": "personaplex", "modalities": ["audio", "text"],
                "input_audio_format": "pcm_f32le", "output_audio_format": "pcm16",
                "voice": voice, "instructions": persona, "turn_detection": None,
                "extra_body": {"auto_response": True}}}))
        except websockets.ConnectionClosed:  # refused: the server may have closed already
            pass
        kind = "error" if expect_error else "session.created"
        await self.wait_for(lambda: self.of(kind))
        return self.of(kind)[0]

    async def stream(self, pcm: np.ndarray) -> int:
        """Float32 frames, one append every 80 ms, as the acceptance paces them."""
        frames = pcm.shape[0] // FRAME
        t0 = time.perf_counter()
        for i in range(frames):
            self.sent += 1
            frame = np.ascontiguousarray(pcm[i * FRAME:(i + 1) * FRAME], "<f4")
            await self.ws.send(json.dumps({
                "type": "input_audio_buffer.append", "format": "pcm_f32le",
                "audio": base64.b64encode(frame.tobytes()).decode(),
                "sample_rate_hz": 24000, "duration_ms": 80, "audio_end_ms": (i + 1) * 80}))
            await asyncio.sleep(max(0.0, t0 + (i + 1) * FRAME_S - time.perf_counter()))
        return frames


async def all_answered(srv, *probes: Probe, timeout: float = 60.0) -> None:
    """Until the server's own account says every frame these probes (its only sessions) sent
    is in, answered or dropped, and each probe holds every answer its session gave: not a quiet
    spell, which a busy machine's late answer outlasts."""
    def done() -> bool:
        sessions = list(srv.state.sessions)
        return (len(sessions) == len(probes)
                and sum(s.backlog.pushed for s in sessions) == sum(p.sent for p in probes)
                and all(s.frames_answered + s.backlog.dropped == s.backlog.pushed
                        for s in sessions)
                and sorted(p.answers() for p in probes)
                == sorted(s.frames_answered for s in sessions))

    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, (
            [p.answers() for p in probes],
            [(s.backlog.pushed, s.frames_answered, s.backlog.dropped)
             for s in list(srv.state.sessions)])
        await asyncio.sleep(0.02)


def test_vllm_omni_acceptance(demo_model, demo_model_dir, monkeypatch):
    """Two sessions at --max-sessions 2 with their own personas, a third refused with
    `resource_exhausted` (no session.created, close 1013), paced float32 appends answered in
    whole 80 ms PCM16 frames, one response id per session and none shared, every frame
    accounted for (answered, or dropped while its persona was prefilled); a closed session's
    slot is taken at once by a replacement on /v1/duplex while the other streams on, its
    response id unchanged. (This server has no `session.close`, which OpenAI's protocol lacks:
    a client ends its session by closing the WebSocket.)"""
    from personaplex_edge.runtime.serve import lifecycle

    # the server's own timers for a peer that does not close (CLOSE_TIMEOUT, LINGER_SECONDS)
    # outlast the wait for the closed session's slot: freed within it, it was freed by the
    # close itself
    monkeypatch.setattr(lifecycle, "CLOSE_TIMEOUT", 300.0)
    monkeypatch.setattr(lifecycle, "LINGER_SECONDS", 300.0)
    pcm = speech(2.0)
    # an unbounded backlog: a busy test machine's late frames wait instead of dropping, so
    # only what came before a persona was ready can be missing
    with ServerThread(ServeOptions(demo_model_dir, port=0, max_sessions=2, max_backlog=100_000),
                      model=demo_model) as srv:
        base = srv.url.replace("http", "ws")
        url = base + "v1/realtime?duplex=1&model=personaplex&autostart=0"

        async def scene():
            async with Probe(url) as first, Probe(url) as second:
                created = [await first.open("You are a calm librarian.", "NATF2"),
                           await second.open("You are a cheerful cook.", "NATM1")]
                async with Probe(url) as third:
                    refused = await third.open("One too many.", "NATF0", expect_error=True)
                    await third.wait_for(lambda: third.ws.close_code is not None)
                sent = await asyncio.gather(first.stream(pcm), second.stream(pcm))
                await all_answered(srv, first, second)
                ids = [{e["response_id"] for e in p.of("response.output_audio.delta")}
                       for p in (first, second)]
                await first.ws.close()
                # its slot is freed by the close (not a queue, nor the timers above), the
                # other session streaming on; then a replacement takes it
                await first.wait_for(lambda: srv.state.slots_used == 1)
                async with Probe(base + "v1/duplex") as replacement:
                    created.append(await replacement.open("You are new here.", "VARF1"))
                    more = await asyncio.gather(second.stream(pcm[:10 * FRAME]),
                                                replacement.stream(pcm[:10 * FRAME]))
                    await all_answered(srv, second, replacement)
                    ids_after = [{e["response_id"] for e in p.of("response.output_audio.delta")}
                                 for p in (second, replacement)]
                return (created, refused, third, sent, more, ids, ids_after,
                        (first, second, replacement))

        created, refused, third, sent, more, ids, ids_after, probes = asyncio.run(scene())
        assert wait_until(lambda: len(srv.history()) == 3)
        history = srv.history()
        text = srv.state.stats.text().decode()
    sessions = [c["session"]["id"] for c in created]
    assert all(sessions) and len(set(sessions)) == 3
    assert refused["error"]["code"] == "resource_exhausted"
    assert refused["error"]["type"] == "rate_limit_error"
    assert not third.of("session.created") and third.ws.close_code == 1013
    for probe in probes:
        assert not probe.of("error")
        assert all(len(chunk) == FRAME_BYTES for chunk in probe.audio())  # whole frames
        pcm_out = np.frombuffer(b"".join(probe.audio()), "<i2")
        assert pcm_out.size and np.sqrt(np.mean((pcm_out / 32768.0) ** 2)) > 1e-5
    assert all(len(i) == 1 for i in ids) and not ids[0] & ids[1]
    assert ids_after[0] == ids[1]  # the survivor's response went on through the recycle
    assert len(ids_after[1]) == 1 and not ids_after[1] & (ids[0] | ids[1])
    # every frame sent was answered, or dropped before its session's persona was ready
    assert sorted(s["received"] for s in history) == sorted([sent[0], sent[1] + more[0],
                                                              more[1]])
    for s in history:
        assert s["frames"] + s["dropped"] == s["received"] and s["dropped"] <= 12
    heard = sorted(len(p.audio()) for p in probes)
    assert heard == sorted(s["frames"] for s in history)
    assert 'personaplex_sessions_refused_total{reason="busy"} 1.0' in text


# -- what the client sends ------------------------------------------------------------------------
def deltas_came(n: int):
    """For raw_session's `until`: `n` answer frames have come."""
    return lambda events: sum(e["type"] == "response.output_audio.delta" for e in events) >= n


async def raw_session(url: str, messages: list, until, pcm: np.ndarray | None = None,
                      timeout: float = 60.0) -> list[dict]:
    """A client that sends `messages` (dicts as JSON, bytes as binary frames, str as they
    are), then an empty session.update, and once session.updated came streams `pcm` (if any)
    and keeps reading until `until(events)` holds (or `timeout` s: the test's assertions then
    say what was missing)."""
    events: list[dict] = []

    async def waiting(condition) -> None:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(realtime_url(url), max_msg_size=0) as ws:
            async def read():
                async for msg in ws:
                    events.append(json.loads(msg.data))
            reading = asyncio.create_task(read())
            for m in messages:
                if isinstance(m, bytes):
                    await ws.send_bytes(m)
                else:
                    await ws.send_str(m if isinstance(m, str) else json.dumps(m))
            await ws.send_str(json.dumps({"type": "session.update", "session": {}}))
            await waiting(lambda: any(e["type"] == "session.updated" for e in events))
            if pcm is not None:
                await ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(pcm16(pcm)).decode()}))
            await waiting(lambda: until(events))
            await ws.close()
            await reading
    return events


def test_bad_events_get_one_error_each_and_the_session_goes_on(greedy_server):
    """Bad JSON, bad base64, an unknown type (named, with the client's event_id), a binary
    message, an event over 15 MiB, a voice that is a path, a format this server lacks: one
    `invalid_request_error` each, in order; a refused update fixes nothing (the next one is
    the persona); the session then answers its audio."""
    bad = [
        ("not json{", "invalid_json", None),
        ({"type": "input_audio_buffer.append", "audio": "@@not base64@@"}, None, "audio"),
        ({"type": "session.close", "event_id": "evt_42"}, "invalid_event_type", "type"),
        (b"\x00\x01binary", "invalid_event", None),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (15 << 20)}),
         "event_too_large", None),
        ({"type": "session.update", "session": {"audio": {"output": {"voice": "../x/NATF2"}}}},
         None, "session.audio.output.voice"),
        ({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}},
         "unsupported_audio_format", "session.input_audio_format"),
        ([1, 2], "invalid_event", "type"),
    ]
    # every event is answered in order, the audio's after the rest: the session is read until
    # the 12 answers of its 1 s of audio came
    events = asyncio.run(raw_session(greedy_server.url, [m for m, _, _ in bad], deltas_came(12),
                                     pcm=speech(1.0)))
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert len(errors) == len(bad), errors
    for error, (_, code, param) in zip(errors, bad):
        assert error["type"] == "invalid_request_error" and error["message"]
        assert code is None or error["code"] == code, error
        assert param is None or error["param"] == param, error
    assert "'session.close'" in errors[2]["message"] and errors[2]["event_id"] == "evt_42"
    assert "not a voice name" in errors[5]["message"]
    updated = [e["session"] for e in events if e["type"] == "session.updated"]
    assert len(updated) == 1 and updated[0]["audio"]["output"]["voice"] == "NATF2"
    assert updated[0]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    heard = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert len(heard) == 12  # 1 s of audio, answered after all that


def test_updates_before_the_persona_merge_and_openai_voices_get_the_default(greedy_server,
                                                                            caplog):
    """session.update events sent before any audio merge into one persona (a voice in one,
    instructions in the next, as LiveKit's AgentSession sends them); a voice the bank lacks is
    an error, unless it is one of OpenAI's (a framework's default): the bank's default voice
    then speaks, one warning says so and session.updated names it."""
    caplog.set_level(logging.INFO, logger="personaplex_edge.serve")

    def update(**session):
        return {"type": "session.update", "session": session}

    # each session read until its audio's first answer: the updates' answers come before it
    merged = asyncio.run(raw_session(greedy_server.url, [
        update(audio={"output": {"voice": "NATM1"}}), update(voice="NATF9"),
        update(instructions="Be brief.")], deltas_came(1), pcm=speech(0.5)))
    openai_voice = asyncio.run(raw_session(greedy_server.url, [
        update(instructions="Be brief.", audio={"output": {"voice": "Marin"}})],
        deltas_came(1), pcm=speech(0.5)))
    # raw_session ends its updates with an empty one; each valid update is answered
    for events, voice, valid, errors in ((merged, "NATM1", 3, 1), (openai_voice, "NATF2", 2, 0)):
        updated = [e["session"] for e in events if e["type"] == "session.updated"]
        assert len(updated) == valid and {
            (u["audio"]["output"]["voice"], u["instructions"]) for u in updated} == {
            (voice, "Be brief.")}
        assert any(e["type"] == "response.output_audio.delta" for e in events)
        assert len([e for e in events if e["type"] == "error"]) == errors
    error = next(e["error"] for e in merged if e["type"] == "error")
    assert error["param"] == "session.voice" and "no voice 'NATF9'" in error["message"]
    opened = [r.getMessage() for r in caplog.records if ": open, persona " in r.getMessage()]
    assert "persona NATM1 " in opened[-2] and "persona default " in opened[-1]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING
                and "voice 'Marin' is OpenAI's" in r.getMessage()]) == 1


def test_turn_events_are_taken_and_cancel_ends_the_response(greedy_server):
    """commit, clear, conversation.item.*, output_audio_buffer.clear and response.create while
    a response is open change nothing and raise no error; response.cancel ends the response
    with its done events (status cancelled, the item incomplete, usage counting its frames and
    text pieces); the model's next word opens a new response; a session.update once the
    conversation runs is echoed with the session unchanged."""
    pcm = speech(4.0)

    async def scene():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(realtime_url(greedy_server.url), max_msg_size=0) as ws:
                events: list[dict] = []

                async def read():
                    async for msg in ws:
                        events.append(json.loads(msg.data))
                reading = asyncio.create_task(read())

                async def send(event):
                    await ws.send_str(json.dumps(event))

                async def append(first, end):  # frames [first, end)
                    part = pcm[first * FRAME:end * FRAME]
                    await send({"type": "input_audio_buffer.append",
                                "audio": base64.b64encode(pcm16(part)).decode()})

                async def until(condition, timeout: float = 60.0):
                    deadline = time.monotonic() + timeout
                    while not condition():
                        assert time.monotonic() < deadline, [e["type"] for e in events[-5:]]
                        await asyncio.sleep(0.01)

                def deltas():
                    return [e for e in events if e["type"] == "response.output_audio.delta"]

                await send({"type": "session.update", "session": {"instructions": "Be brief."}})
                await until(lambda: any(e["type"] == "session.updated" for e in events))
                await append(0, 12)
                await until(lambda: len(deltas()) == 12)
                for event in ({"type": "input_audio_buffer.commit"},
                              {"type": "input_audio_buffer.clear"},
                              {"type": "conversation.item.create", "item": {
                                  "type": "message", "role": "user",
                                  "content": [{"type": "input_text", "text": "hi"}]}},
                              {"type": "conversation.item.truncate", "item_id": "x",
                               "content_index": 0, "audio_end_ms": 10},
                              {"type": "output_audio_buffer.clear"},
                              {"type": "response.create"},
                              {"type": "session.update", "session": {
                                  "instructions": "Be long.", "voice": "VARM2"}}):
                    await send(event)
                await append(12, 24)
                await until(lambda: len(deltas()) == 24)
                await send({"type": "response.cancel"})
                await until(lambda: any(e["type"] == "response.done" for e in events))
                await append(24, 50)
                await until(lambda: all(s.frames_answered == 50
                                        for s in greedy_server.state.sessions))
                # the last answers are on their way before the reply to a clear sent now (the
                # tick thread has handed them to the event loop, and one WebSocket keeps its
                # messages' order): once that reply is here, so are they
                await asyncio.wrap_future(greedy_server.state.ticker.call(lambda: None))
                await send({"type": "input_audio_buffer.clear"})
                await until(lambda: sum(e["type"] == "input_audio_buffer.cleared"
                                        for e in events) == 2)
                await ws.close()
                await reading
                return events

    events = asyncio.run(scene())
    kinds = [e["type"] for e in events]
    assert "error" not in kinds
    assert kinds.count("input_audio_buffer.cleared") == 2  # the second: the test's own, last
    assert kinds.count("session.updated") == 2
    late = [e for e in events if e["type"] == "session.updated"][1]["session"]
    assert late["instructions"] == "Be brief." and late["audio"]["output"]["voice"] == "NATF2"
    created = [e["response"]["id"] for e in events if e["type"] == "response.created"]
    deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
    first = [d for d in deltas if d["response_id"] == created[0]]
    assert len(first) == 24  # one response over the turn events, response.create included
    done_at = kinds.index("response.done")
    assert kinds[done_at - 5:done_at + 1] == [
        "response.output_audio.done", "response.output_audio_transcript.done",
        "response.content_part.done", "response.output_item.done", "conversation.item.done",
        "response.done"]
    done = events[done_at]["response"]
    assert done["id"] == created[0] and done["status"] == "cancelled"
    assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert done["output"][0]["status"] == "incomplete"
    pieces = [e["delta"] for e in events
              if e["type"] == "response.output_audio_transcript.delta"
              and e["response_id"] == created[0]]
    assert done["output"][0]["content"][0]["transcript"] == "".join(pieces)
    # usage: what this response heard and said, in the model's tokens (8 Mimi codes a frame
    # each way), in the SDK's own type
    from openai.types.realtime import RealtimeResponseUsage

    usage = RealtimeResponseUsage.model_validate(done["usage"])
    assert usage.input_token_details.audio_tokens == 24 * 8 == usage.input_tokens
    assert usage.output_token_details.audio_tokens == 24 * 8
    assert usage.output_token_details.text_tokens == len(pieces) > 0
    assert usage.output_tokens == 24 * 8 + len(pieces)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    # after the cancel: quiet until a frame with a word, which opens the second response
    assert len(created) == 2 and created[1] != created[0]
    after = [e for e in events[done_at:] if e.get("response_id") == created[1]]
    assert after[0]["type"] == "response.output_item.added"
    first_audio = next(e for e in after if e["type"] == "response.output_audio.delta")
    word = next(e for e in after if e["type"] == "response.output_audio_transcript.delta")
    assert events.index(word) < events.index(first_audio)  # it starts with a word
    assert len([d for d in deltas if d["response_id"] == created[1]]) < 26


def test_audio_before_the_persona_is_ready_is_dropped_but_its_last_frame(
        demo_model, demo_model_dir, monkeypatch):
    """A client that streams without a session.update: after GRACE_S the server's defaults
    are the persona, and what came while it was prefilled (here until 18 frames had come) is
    dropped, counted, but for the newest frame; every frame is answered or dropped, no error,
    no session.updated (none was asked for)."""
    from personaplex_edge.runtime.serve import lifecycle
    from personaplex_edge.runtime.serve.realtime import RealtimeWire

    opened = lifecycle._open_conversation

    def slow_open(state, params):  # a prefill that lasts until 18 frames came meanwhile
        wait_until(lambda: any(s.backlog.pushed >= 18 for s in list(state.sessions)), 60)
        return opened(state, params)

    at_ready = []  # (frames received, frames dropped) as the conversation is ready
    ready = RealtimeWire.ready

    def counted(self, session):
        at_ready.append((session.backlog.pushed, session.backlog.dropped))
        ready(self, session)

    monkeypatch.setattr(lifecycle, "_open_conversation", slow_open)
    monkeypatch.setattr(RealtimeWire, "ready", counted)
    # no frame dropped for lagging behind a busy machine's ticks: the drops are the prefill's
    with ServerThread(ServeOptions(demo_model_dir, port=0, max_backlog=100_000),
                      model=demo_model) as srv:
        def all_in(res) -> bool:  # every frame in, answered or dropped, every answer here
            sessions = list(srv.state.sessions)
            return len(sessions) == 1 and sessions[0].backlog.pushed == 37 and \
                sessions[0].frames_answered + sessions[0].backlog.dropped == 37 and \
                res.answer_samples == sessions[0].frames_answered * FRAME

        r = asyncio.run(talk_realtime(srv.url, speech(3.0), session=None, tail_s=60,
                                      until=all_in))
        assert wait_until(lambda: len(srv.history()) == 1, timeout=60)
        s = srv.history()[0]
    assert not r.errors and r.handshake_s is None
    # the frames that came before the conversation (the grace, then the prefill) are dropped
    # but the newest, none after it
    (before, dropped), = at_ready
    assert before >= 18 and dropped == before - 1 == s["dropped"] and s["received"] == 37
    assert s["frames"] + s["dropped"] == s["received"] and r.answer_samples == s["frames"] * FRAME


# -- who may connect -------------------------------------------------------------------------------
def test_origins_and_the_token_on_both_websocket_routes(demo_model, demo_model_dir, caplog):
    """A foreign page's Origin is refused with 403 and one log line on /api/chat, /v1/realtime
    and /v1/duplex, even with the token; the server's own origin, a listed one and none at all
    are admitted; the token is still needed (401), as the SDK sends it (Bearer); `*` admits
    any origin."""
    caplog.set_level(logging.INFO, logger="personaplex_edge.serve")
    token = {"Authorization": "Bearer s3cret"}
    with ServerThread(ServeOptions(demo_model_dir, port=0, auth_token="s3cret",
                                   allowed_origins=("http://app.example:3000",)),
                      model=demo_model) as srv:
        own = srv.url.rstrip("/")

        async def status(path, headers):
            async with aiohttp.ClientSession() as http:
                try:
                    ws = await http.ws_connect(srv.url + path, headers=headers)
                except aiohttp.WSServerHandshakeError as e:
                    return e.status
                await ws.close()
                return 101

        async def scene():
            out = {}
            for path in ("api/chat", "v1/realtime", "v1/duplex"):
                out[path] = [await status(path, h) for h in (
                    {"Origin": "http://evil.example", **token}, {"Origin": own, **token},
                    token, {"Origin": "http://APP.example:3000/", **token},
                    {"Origin": "http://app.example:3000"},
                    {"Origin": "http://app.example:3000", "Authorization": "Bearer guess"})]
            good = openai.AsyncOpenAI(api_key="s3cret", base_url=srv.url + "v1")
            async with good.realtime.connect(model="m") as conn:
                first = await conn.recv()
            wrong = openai.AsyncOpenAI(api_key="guess", base_url=srv.url + "v1")
            with pytest.raises(Exception, match="401"):
                async with wrong.realtime.connect(model="m") as conn:
                    await conn.recv()
            return out, first.type

        statuses, sdk_first = asyncio.run(scene())
        metrics = srv.state.stats.text().decode()
    for path, got in statuses.items():
        assert got == [403, 101, 101, 101, 401, 401], path
    assert sdk_first == "session.created"
    refusals = [r.getMessage() for r in caplog.records
                if "origin http://evil.example is not allowed" in r.getMessage()]
    assert len(refusals) == 3 and {m.split()[2] for m in refusals} == {
        "/api/chat:", "/v1/realtime:", "/v1/duplex:"}
    assert 'personaplex_sessions_refused_total{reason="origin"} 3.0' in metrics

    with ServerThread(ServeOptions(demo_model_dir, port=0, allowed_origins=("*",)),
                      model=demo_model) as srv:
        r = asyncio.run(talk_realtime(srv.url, speech(0.4), session={}, tail_s=60,
                                      until_frames=1,
                                      headers={"Origin": "http://anywhere.example"}))
    assert r.status is None and r.handshake_s is not None and r.answer_samples > 0


def test_dns_rebinding_is_refused_on_the_page_and_both_websocket_routes(demo_model,
                                                                        demo_model_dir, caplog):
    """A page on a name re-pointed at 127.0.0.1 sends its own name as Host and a matching
    Origin, which the own-origin rule alone would admit: the page, the voices and every
    WebSocket route answer 403 with one log line each and a count in /metrics, the token
    notwithstanding; the probes still answer. A balancer's name given in allowed_hosts (or
    `*`) is admitted, Origin and all."""
    caplog.set_level(logging.INFO, logger="personaplex_edge.serve")
    token = {"Authorization": "Bearer s3cret"}
    rebound = {"Host": "evil.example:8998", "Origin": "http://evil.example:8998", **token}
    balancer = {"Host": "voice.example", "Origin": "https://voice.example", **token}
    routes = ("", "static/app.js", "api/voices", "api/chat", "v1/realtime", "v1/duplex")

    async def status(url, path, headers):
        async with aiohttp.ClientSession() as http:
            if path in ("api/chat", "v1/realtime", "v1/duplex"):
                try:
                    ws = await http.ws_connect(url + path, headers=headers)
                except aiohttp.WSServerHandshakeError as e:
                    return e.status
                await ws.close()
                return 101
            async with http.get(url + path, headers=headers) as r:
                return r.status

    async def statuses(url, headers):
        return [await status(url, path, headers) for path in routes + ("api/health",
                                                                        "metrics")]

    with ServerThread(ServeOptions(demo_model_dir, port=0, auth_token="s3cret",
                                   allowed_hosts=("voice.example",)), model=demo_model) as srv:
        refused = asyncio.run(statuses(srv.url, rebound))
        admitted = asyncio.run(statuses(srv.url, balancer))
        own = asyncio.run(statuses(srv.url, {"Origin": srv.url.rstrip("/"), **token}))
        metrics = srv.state.stats.text().decode()
    assert refused == [403] * len(routes) + [200, 200]
    assert admitted == own == [200, 200, 200, 101, 101, 101, 200, 200]
    logged = [r.getMessage().split()[2] for r in caplog.records
              if "host evil.example is not allowed" in r.getMessage()]
    assert sorted(logged) == sorted(f"/{p}:" for p in routes)
    assert f'personaplex_sessions_refused_total{{reason="host"}} {len(routes)}.0' in metrics

    with ServerThread(ServeOptions(demo_model_dir, port=0, allowed_hosts=("*",)),
                      model=demo_model) as srv:
        r = asyncio.run(talk_realtime(srv.url, speech(0.4), session={}, tail_s=60,
                                      until_frames=1, headers={"Host": "anything.example",
                                               "Origin": "http://anything.example"}))
    assert r.status is None and r.handshake_s is not None and r.answer_samples > 0


def test_metrics_and_history_count_a_realtime_session_as_a_chat_one(greedy_server):
    """One core: a realtime session's frames reach /metrics and the history as chat's do."""
    def frames_total() -> float:
        text = greedy_server.state.stats.text().decode()
        return float(re.search(r"^personaplex_frames_total (\S+)$", text, re.M).group(1))

    # the sessions of the tests before it closed and counted first (one that read only its
    # first answer may still be ending): the next summary is the one this test opens
    assert wait_until(lambda: greedy_server.state.slots_used == 0)
    before, counted = len(greedy_server.history()), frames_total()
    r = asyncio.run(talk_realtime(greedy_server.url, speech(1.0), session={}, pace=None,
                                  until_frames=12, tail_s=60))
    assert not r.errors and r.answer_samples == 12 * FRAME
    assert wait_until(lambda: len(greedy_server.history()) == before + 1)
    s = greedy_server.history()[-1]
    assert s["protocol"] == "realtime" and s["frames"] == 12 and s["dropped"] == 0
    assert frames_total() - counted == 12
