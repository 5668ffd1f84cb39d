"""An agent: PersonaPlex keeps the conversation going; this app hears each of the user's turns
(the model's transcriber), asks an LLM with tools what to answer, runs the tools it calls, and
has the model say the answer in the persona's voice.

    personaplex-edge serve --model DIR                      # exported with --transcriber
    llama-server -m qwen2.5-7b-instruct.gguf --jinja        # any OpenAI-compatible chat:
    python examples/agent.py --llm http://127.0.0.1:8080/v1 #   llama.cpp, Ollama, vLLM

    user turn (transcription .completed) -> chat/completions with the tools -> each tool call
    run, its result sent back -> ... -> the answer -> said (an assistant item + response.create)

It speaks OpenAI Realtime to `serve` (pip install "openai[realtime]"): transcription turned on
in its session.update, the microphone streamed (or --input a wav, or --silence), the model's
audio to the speaker (or --save a wav). With --socket it listens to the assistant's control
socket instead (`personaplex-edge assistant`: its "turn_end" events in, "say" commands out; the
assistant owns the sound devices). The tools below are examples: add your own to TOOLS.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import base64
import datetime
import json
import operator
import sys

import numpy as np
from announcer import (FRAME, RATE, Announcer, Microphone, Silence, Speaker,  # its audio ends
                       WavFile, stream_audio)

SYSTEM = ("You answer a person in a spoken conversation. Reply in one or two short sentences "
          "that read well aloud; write numbers as words. Use the tools for facts you lack.")
MAX_TOOL_ROUNDS = 4  # chat calls per turn: an LLM that keeps calling tools is cut off


# ---- the tools ------------------------------------------------------------------------------
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.Pow: operator.pow, ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """Arithmetic on numbers (+ - * / **), nothing else evaluated."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")
    result = value(ast.parse(expression, mode="eval").body)
    return str(int(result) if float(result).is_integer() else round(result, 6))


def current_time() -> str:
    return datetime.datetime.now().strftime("%H:%M on %A %d %B %Y")


TOOLS = {
    "calculate": (calculate, "Evaluate an arithmetic expression", {
        "expression": {"type": "string", "description": "e.g. 17 * 23"}}),
    "current_time": (current_time, "The local time and date", {}),
}


def tool_specs() -> list[dict]:
    return [{"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": params, "required": list(params)}}}
        for name, (_, description, params) in TOOLS.items()]


def run_tool(name: str, arguments: str) -> str:
    if name not in TOOLS:
        return f"error: no tool {name}"
    try:
        return TOOLS[name][0](**json.loads(arguments or "{}"))
    except Exception as e:  # the LLM reads the error and may try again
        return f"error: {e}"


class Brain:
    """The LLM side: the conversation so far as chat messages, one answer per user turn."""

    def __init__(self, llm_url: str, model: str, api_key: str):
        from openai import AsyncOpenAI

        self.client = AsyncOpenAI(base_url=llm_url, api_key=api_key)
        self.model = model
        self.messages: list[dict] = [{"role": "system", "content": SYSTEM}]

    async def answer(self, heard: str) -> str:
        self.messages.append({"role": "user", "content": heard})
        for _ in range(MAX_TOOL_ROUNDS):
            reply = (await self.client.chat.completions.create(
                model=self.model, messages=self.messages, tools=tool_specs())).choices[0].message
            self.messages.append(reply.model_dump(exclude_none=True))
            if not reply.tool_calls:
                return (reply.content or "").strip()
            for call in reply.tool_calls:
                result = run_tool(call.function.name, call.function.arguments)
                print(f"[tool {call.function.name}({call.function.arguments}) = {result}]",
                      flush=True)
                self.messages.append({"role": "tool", "tool_call_id": call.id,
                                      "content": result})
        return ""


# ---- the user's audio (the microphone, silence, the speaker and a wav: announcer.py's) ----------
class WavSource(Silence):
    """A wav file at the microphone's pace, then silence."""

    def __init__(self, path: str):
        import soundfile as sf

        super().__init__()
        pcm, rate = sf.read(path, dtype="float32", always_2d=True)
        if rate != RATE:
            raise SystemExit(f"{path}: {rate} Hz; the model takes {RATE} Hz")
        self.pcm, self.at = pcm.mean(axis=1), 0

    async def frame(self) -> np.ndarray:
        out = await super().frame()  # silence, when its time comes
        part = self.pcm[self.at:self.at + FRAME]
        out[:part.shape[0]] = part
        self.at += FRAME
        return out


# ---- over /v1/realtime (a running serve) ----------------------------------------------------------
async def over_realtime(args, brain: Brain) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=args.token or "none", base_url=args.url.rstrip("/") + "/v1")
    output = WavFile(args.save) if args.save else Speaker()
    async with client.realtime.connect(model="personaplex") as conn:
        await conn.session.update(session={"type": "realtime", "audio": {
            "input": {"transcription": {"model": "the model's transcriber"}}}})
        ready, turns = asyncio.Event(), asyncio.Queue()

        async def listen():
            async for event in conn:
                if event.type == "session.updated":  # the persona is ready
                    ready.set()
                elif event.type == "response.output_audio.delta":
                    output.play(base64.b64decode(event.delta))
                elif event.type == "response.output_audio_transcript.delta":
                    print(event.delta, end="", flush=True)
                elif event.type == "conversation.item.input_audio_transcription.completed":
                    print(f"\n[user: {event.transcript}]", flush=True)
                    turns.put_nowait(event.transcript)
                elif event.type == "error":
                    print(f"\n[error: {event.error.message}]", file=sys.stderr, flush=True)

        async def think():
            while True:
                heard = await turns.get()
                answer = await brain.answer(heard)
                if answer:
                    print(f"\n[agent: {answer}]", flush=True)
                    await Announcer(conn).say(answer)

        tasks = [asyncio.create_task(listen()), asyncio.create_task(think())]
        try:
            await ready.wait()
            # the user's side: one frame every 80 ms
            await stream_audio(conn, WavSource(args.input) if args.input else Silence()
                               if args.silence else Microphone(), args.seconds)
            await asyncio.sleep(0.5)  # the last answers
        finally:
            for task in tasks:
                task.cancel()
            output.close()
    print()


# ---- over the assistant's control socket ----------------------------------------------------------
async def over_socket(args, brain: Brain) -> None:
    reader, writer = await asyncio.open_unix_connection(args.socket)
    print(f"[listening to {args.socket}]", flush=True)
    while line := await reader.readline():
        event = json.loads(line)
        if event.get("event") == "text":
            print(event["text"], end="", flush=True)
        elif event.get("event") == "turn_end":
            print(f"\n[user: {event['text']}]", flush=True)
            answer = await brain.answer(event["text"])
            if answer:
                print(f"[agent: {answer}]", flush=True)
                writer.write(json.dumps({"cmd": "say", "text": answer}).encode() + b"\n")
                await writer.drain()
        elif event.get("ok") is False:
            print(f"[error: {event.get('error')}]", file=sys.stderr, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llm", required=True, help="an OpenAI-compatible API, e.g. "
                   "http://127.0.0.1:8080/v1 (llama.cpp) or http://127.0.0.1:11434/v1 (Ollama)")
    p.add_argument("--llm-model", default="local", help="the chat model's name (Ollama's tag)")
    p.add_argument("--llm-key", default="none", help="its API key, if it needs one")
    p.add_argument("--url", default="http://127.0.0.1:8998", help="the running serve")
    p.add_argument("--token", help="serve's --auth-token, if it has one")
    p.add_argument("--socket", help="the assistant's control socket, instead of --url")
    p.add_argument("--input", metavar="WAV", help="the user's audio from a file (24 kHz)")
    p.add_argument("--silence", action="store_true", help="send silence, not the microphone")
    p.add_argument("--save", metavar="WAV", help="write the model's audio here")
    p.add_argument("--seconds", type=float, help="stop after this long (default: Ctrl-C)")
    args = p.parse_args()
    brain = Brain(args.llm, args.llm_model, args.llm_key)
    try:
        asyncio.run(over_socket(args, brain) if args.socket else over_realtime(args, brain))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
