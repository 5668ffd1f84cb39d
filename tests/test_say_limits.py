"""What a client can make a server hold for it is bounded: one text limit and one validator for
every surface that takes words to say (SAY on `stdio` and `/api/chat`, `/v1/realtime`'s
assistant items, the assistant's socket, `run --say`, conv.say), a word split linear in the
text, a queue of words, the commands a session holds before its conversation is ready, and the
packet an Ogg reader joins across pages. Past each, the protocol's own error; the hostile
clients here are raw WebSocket clients that send what no well-behaved one would."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest

from personaplex_edge.cli import main
from personaplex_edge.runtime.words.say import (MAX_QUEUED_WORDS, MAX_SAY_CHARS, SayError,
                                                SayMachine, Word, check_say_text, script_words)

FULL = "a " * (MAX_SAY_CHARS // 2)  # the longest text taken: MAX_SAY_CHARS // 2 words
TOO_LONG = "b" * (MAX_SAY_CHARS + 1)


# -- the rules ------------------------------------------------------------------------------------
def test_one_validator_names_the_limit_and_the_fix():
    assert check_say_text(FULL) == FULL and len(FULL) == MAX_SAY_CHARS
    for text, said in ((TOO_LONG, f"over the limit of {MAX_SAY_CHARS}"), ("  \n", "empty"),
                       (None, "is a string, not NoneType"), (["hi"], "not list")):
        with pytest.raises(SayError, match=said):
            check_say_text(text, "--say")


def test_the_word_split_is_linear_in_the_text():
    """Four times the text costs about four times the CPU, not sixteen: each word is sliced once,
    not the rest of the text copied per word. The best of five timings of each size, taken in
    turns, so a loaded machine (the suite runs on both cores) slows both sides alike."""
    texts = [("supercalifragilistic " * (size // 20 + 1))[:size] for size in (256 << 10, 1 << 20)]
    best = [float("inf")] * 2
    for _ in range(5):
        for k, text in enumerate(texts):
            t = time.process_time()
            words = script_words(text, lambda w: [1], 12.5)
            best[k] = min(best[k], time.process_time() - t)
            assert len(words) == text.count(" ") + 1 and words[-1].index == len(words) - 1
    small, large = best
    assert large < 8 * small, f"{large:.3f} s for 1 MB vs {small:.3f} s for 256 KB"


def test_a_break_past_the_limit_is_refused():
    assert script_words('a <break time="60s"/> b', lambda w: [1], 12.5)[1].padding == 750
    for seconds in ("60.5", "9" * 400):  # the second is no float at all
        with pytest.raises(SayError, match="over the limit of 60 s"):
            script_words(f'a <break time="{seconds}s"/> b', lambda w: [1], 12.5)


def test_the_queue_of_words_is_capped_and_a_refusal_queues_nothing():
    machine = SayMachine()
    machine.add([Word(f"w{i}", (5,), 0, 1, i) for i in range(MAX_QUEUED_WORDS - 1)])
    with pytest.raises(SayError, match=f"limit of {MAX_QUEUED_WORDS}: wait for their events"):
        machine.add([Word("x", (5,), 0, 2, 0), Word("y", (5,), 0, 2, 1)])
    assert len(machine.words) == MAX_QUEUED_WORDS - 1
    machine.add([Word("x", (5,), 0, 2, 0)])  # exactly full is taken
    assert len(machine.words) == MAX_QUEUED_WORDS


# -- the surfaces ---------------------------------------------------------------------------------
def test_the_python_api_and_run_say_refuse_what_the_servers_refuse(demo_model_dir, tmp_path,
                                                                   capsys):
    import personaplex_edge as pe

    with pe.load(demo_model_dir, device="cpu") as model:
        conv = model.conversation(text_prompt=None)
        with pytest.raises(pe.PersonaPlexError, match=f"over the limit of {MAX_SAY_CHARS}"):
            conv.say(TOO_LONG)
        conv.say(FULL)
        with pytest.raises(pe.PersonaPlexError, match="still queued"):
            conv.say("one more")
        conv.cancel_say()
        assert conv.say("now it fits").words == ("now", "it", "fits")
        conv.close()
    wav = tmp_path / "in.wav"
    pe.write_audio(wav, np.zeros(24000, np.float32))
    assert main(["run", "--model", str(demo_model_dir), "--input", str(wav), "--output",
                 str(tmp_path / "out.wav"), "--say", TOO_LONG]) == 2
    err = capsys.readouterr().err
    assert f"--say has {MAX_SAY_CHARS + 1} characters, over the limit" in err
    assert not (tmp_path / "out.wav").exists()


def test_the_assistant_socket_refuses_with_the_same_words(demo_model_dir):
    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.assistant.commands import dispatch

    with Model.load(demo_model_dir, device="cpu") as model:
        with model.open_conversation() as conv:
            assistant = SimpleNamespace(gate=SimpleNamespace(say=conv.say))
            with pytest.raises(SayError, match=f"over the limit of {MAX_SAY_CHARS}"):
                dispatch(assistant, {"cmd": "say", "text": TOO_LONG})
            with pytest.raises(SayError, match='say\'s "text"'):
                dispatch(assistant, {"cmd": "say"})
            assert dispatch(assistant, {"cmd": "say", "text": "hi there"})["words"] == [
                "hi", "there"]


def test_stdio_past_the_queue_is_error_and_exit_2(demo_model_dir):
    from test_stdio import ERROR, _message, _messages, _stdio

    say = lambda text: _message(0x08, json.dumps({"say": text}).encode())  # noqa: E731
    done = _stdio(demo_model_dir, _message(0x01, bytes(3840)) + say(FULL) + say("more"),
                  "--no-persona")
    assert done.returncode == 2 and b"Traceback" not in done.stderr
    errors = [p.decode() for kind, p in _messages(done.stdout) if kind == ERROR]
    assert len(errors) == 1 and "still queued" in errors[0]


def test_a_session_holds_a_bounded_number_of_commands_before_its_conversation():
    from personaplex_edge.runtime.serve.session import MAX_WAITING_JOBS, ClientError, Session

    async def scene():
        session = Session(peer="test", max_backlog=4, send_queue=4, sample_rate=24000,
                          frame_size=1920, wake=lambda: None, call=lambda fn: Future(),
                          piece=str)
        for _ in range(MAX_WAITING_JOBS):
            session.with_conversation(lambda conv: None)
        with pytest.raises(ClientError, match="wait for the persona's prefill"):
            session.with_conversation(lambda conv: None)

    asyncio.run(scene())


def test_an_ogg_packet_continued_without_end_is_refused():
    """Pages whose one packet never ends (every lacing value 255, each page continuing the
    last): the reader stops at MAX_PACKET_BYTES instead of holding all of them."""
    from personaplex_edge.runtime.serve.ogg import MAX_PACKET_BYTES, OggError, PacketReader

    reader = PacketReader()
    pages = _endless_packet(MAX_PACKET_BYTES // (255 * 255) + 2)
    with pytest.raises(OggError, match=f"continued past {MAX_PACKET_BYTES} bytes"):
        for p in pages:
            assert reader.feed(p) == []
    assert len(reader._partial) <= MAX_PACKET_BYTES + 255 * 255


def _endless_packet(n: int) -> list[bytes]:
    """`n` Ogg pages (valid CRCs) of one packet that continues on the next page."""
    from personaplex_edge.runtime.serve.ogg import CAPTURE, CONTINUED, FIRST, HEADER, crc

    out = []
    for seq in range(n):
        flags = FIRST if seq == 0 else CONTINUED
        page = bytearray(HEADER.pack(CAPTURE, 0, flags, -1, 7, seq, 0, 255))
        page += b"\xff" * 255 + bytes(255 * 255)
        page[22:26] = crc(bytes(page)).to_bytes(4, "little")
        out.append(bytes(page))
    return out


# -- hostile clients of a server ------------------------------------------------------------------
aiohttp = pytest.importorskip("aiohttp")


async def _chat_client(url: str, messages: list[bytes]) -> tuple[list[bytes], int | None]:
    """Waits for the handshake, sends `messages`, reads until the server closes."""
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url.replace("http", "ws", 1) + "api/chat") as ws:
            assert (await ws.receive(timeout=30)).data == b"\x00"
            for m in messages:
                await ws.send_bytes(m)
            got = [m.data async for m in ws if m.type == aiohttp.WSMsgType.BINARY]
            return got, ws.close_code


def _chat_say(text: str) -> bytes:
    return b"\x08" + json.dumps({"say": text}).encode()


@pytest.mark.parametrize("case", ["queue", "endless packet"])
def test_api_chat_refuses_a_hostile_client_with_error(greedy_server, case):
    """A client that queues more words than a conversation holds (no audio: nothing is
    spoken meanwhile), or sends one Ogg packet that never ends: ERROR with the reason, close
    1008; the server goes on serving."""
    if case == "queue":
        messages, reason = [_chat_say(FULL), _chat_say("one more")], "still queued"
    else:
        messages, reason = [b"\x01" + p for p in _endless_packet(8)], "continued past"
    got, code = asyncio.run(asyncio.wait_for(_chat_client(greedy_server.url, messages), 60))
    errors = [m[1:].decode() for m in got if m[:1] == b"\x05"]
    assert len(errors) == 1 and reason in errors[0], got[-3:]
    assert code == 1008
    if case == "queue":
        queued = [json.loads(m[1:]) for m in got if m[:1] == b"\x08"]
        assert [q["event"] for q in queued] == ["queued"] and len(queued[0]["words"]) == len(
            FULL.split())
    assert asyncio.run(_handshake_and_say(greedy_server.url)) == ["hello"]  # still serving


async def _handshake_and_say(url: str) -> list[str]:
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url.replace("http", "ws", 1) + "api/chat") as ws:
            assert (await ws.receive(timeout=30)).data == b"\x00"
            await ws.send_bytes(_chat_say("hello"))
            while (msg := await ws.receive(timeout=30)).data[:1] != b"\x08":
                pass
            return json.loads(msg.data[1:])["words"]


def test_v1_realtime_refuses_text_past_the_limit_and_the_session_goes_on(greedy_server):
    """An assistant item over the limit, and one that would take the waiting text past it:
    an `error` event each, the item not taken; 1500 words said, then a full text that would
    pass the queue: `say_refused`; a short one after it is taken. The session then answers
    its audio."""
    from bench_serve import realtime_url, speech

    from personaplex_edge.audio import pcm16_bytes

    def item(text: str) -> dict:
        return {"type": "conversation.item.create",
                "item": {"type": "message", "role": "assistant",
                         "content": [{"type": "output_text", "text": text}]}}

    async def scene() -> list[dict]:
        events: list[dict] = []
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(realtime_url(greedy_server.url)) as ws:
                async def read():
                    async for msg in ws:
                        events.append(json.loads(msg.data))
                reading = asyncio.create_task(read())
                await ws.send_json({"type": "session.update", "session": {}})
                while not any(e["type"] == "session.updated" for e in events):
                    await asyncio.sleep(0.01)
                for event in (item(TOO_LONG), item("c " * 1500), item("d " * 1500),
                              {"type": "response.create"}, item(FULL),
                              {"type": "response.create"}, item("more"),
                              {"type": "response.create"}):
                    await ws.send_json(event)
                # the refusal comes from the tick thread: the audio goes after it
                deadline = time.monotonic() + 60
                while (not any(e["type"] == "error" and e["error"]["code"] == "say_refused"
                               for e in events) and time.monotonic() < deadline):
                    await asyncio.sleep(0.01)
                await ws.send_json({"type": "input_audio_buffer.append",
                                    "audio": base64.b64encode(pcm16_bytes(speech(1.0))).decode()})
                deadline = time.monotonic() + 30
                while (sum(e["type"] == "response.output_audio.delta" for e in events) < 12
                       and time.monotonic() < deadline):
                    await asyncio.sleep(0.05)
                await ws.close()
                await reading
        return events

    events = asyncio.run(scene())
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert [(e["code"], e["param"]) for e in errors] == [
        ("invalid_value", "item.content"), ("invalid_value", "item.content"),
        ("say_refused", "item.content")], errors
    assert f"over the limit of {MAX_SAY_CHARS}" in errors[0]["message"]
    assert "waiting for response.create" in errors[1]["message"]
    assert "still queued" in errors[2]["message"]
    added = [part["text"] for e in events if e["type"] == "conversation.item.added"
             for part in e["item"]["content"] if "text" in part]  # not the responses' items
    assert [len(t) for t in added] == [len("c " * 1500), len(FULL), len("more")]
    assert sum(e["type"] == "response.output_audio.delta" for e in events) >= 12
