"""examples/agent.py, the agent loop, against a served model with a transcriber and a fake
OpenAI-compatible chat endpoint that calls a tool: the user's finished turn goes to the chat as
the user's message, the tool call is run and its result sent back, and the answer is said by
the model (its words in the model's own transcript). The same loop over the assistant's control
socket: a turn_end event in, a say command out."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("openai")

from aiohttp import web  # noqa: E402
from bench_serve import ServerThread  # noqa: E402
from conftest_stt import FRAMES, serve_options, stt_bundle, stt_model_dir  # noqa: E402

from personaplex_edge.audio import write_audio  # noqa: E402

AGENT = Path(__file__).resolve().parent.parent / "examples" / "agent.py"
ANSWER = "six times seven is forty two"


class FakeChat:
    """POST /v1/chat/completions: the first call of a turn asks for calculate(6 * 7), the
    next answers in words. Every request is kept."""

    def __init__(self):
        self.requests: list[dict] = []

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if body["messages"][-1]["role"] == "user":
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{len(self.requests)}", "type": "function",
                "function": {"name": "calculate", "arguments": '{"expression": "6 * 7"}'}}]}
            reason = "tool_calls"
        else:
            message, reason = {"role": "assistant", "content": ANSWER}, "stop"
        return web.json_response({"id": "chatcmpl-1", "object": "chat.completion",
                                  "created": 0, "model": body["model"], "choices": [
                                      {"index": 0, "message": message,
                                       "finish_reason": reason}]})

    def __enter__(self) -> "FakeChat":
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.completions)
        ready = threading.Event()

        async def run():
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"
            self.stop = asyncio.Event()
            ready.set()
            await self.stop.wait()
            await runner.cleanup()

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(run(),),
                                       daemon=True)
        self.thread.start()
        ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)


def _first_turn() -> str:
    import personaplex_edge as pe

    b = stt_bundle()
    model = pe.load(stt_model_dir(), device="cpu")
    try:
        with model.conversation(persona=False, greedy=True) as conv:
            for i in range(FRAMES):
                conv.step(b.pcm[i * 1920:(i + 1) * 1920])
            return next(e.text for e in conv.heard_events() if e.kind == "turn")
    finally:
        model.close()


def _check_chat(chat: FakeChat, heard: str) -> None:
    first, second = chat.requests[:2]
    assert first["messages"][-1] == {"role": "user", "content": heard}
    assert {t["function"]["name"] for t in first["tools"]} >= {"calculate"}
    tool = second["messages"][-1]
    assert tool["role"] == "tool" and tool["content"] == "42"
    assert tool["tool_call_id"] == "call_1"


def test_the_agent_hears_a_turn_calls_a_tool_and_says_the_answer(tmp_path):
    b = stt_bundle()
    write_audio(tmp_path / "in.wav", b.pcm)
    heard = _first_turn()
    with FakeChat() as chat, ServerThread(serve_options(stt_model_dir())) as srv:
        done = subprocess.run(
            [sys.executable, str(AGENT), "--llm", chat.url, "--url", srv.url, "--input",
             str(tmp_path / "in.wav"), "--seconds", "10", "--save", str(tmp_path / "out.wav")],
            capture_output=True, timeout=120)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert f"[user: {heard}]" in out
    assert "[tool calculate(" in out and "= 42]" in out
    _check_chat(chat, heard)
    assert f"[agent: {ANSWER}]" in out
    assert f" {ANSWER}" in out.split(f"[agent: {ANSWER}]", 1)[1], out  # the model said it


def test_the_agent_over_the_assistants_control_socket(tmp_path):
    """The socket protocol of runtime/assistant/control.py, served by a stand-in: the agent
    answers a turn_end event with a say command."""
    path = tmp_path / "control.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    with FakeChat() as chat:
        agent = subprocess.Popen([sys.executable, str(AGENT), "--llm", chat.url, "--socket",
                                  str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            server.settimeout(30)
            conn, _ = server.accept()
            conn.sendall(json.dumps({"event": "turn_end", "heard": "turn", "text": "what is six "
                                     "times seven", "item": 1, "step": 20, "start": 0.4,
                                     "end": 1.2}).encode() + b"\n")
            conn.settimeout(30)
            line = conn.makefile().readline()
            assert json.loads(line) == {"cmd": "say", "text": ANSWER}
            _check_chat(chat, "what is six times seven")
            conn.close()
            agent.wait(30)
        finally:
            agent.kill()
            server.close()
    assert agent.returncode == 0, agent.stderr.read().decode()[-2000:]
