"""`personaplex-edge stdio`: one conversation over the process's stdin and stdout, for apps in
any language that can spawn a process and frame bytes.

Every message, both ways, is `[u32 little-endian length][kind byte][payload]` (the length counts
the kind byte and the payload), with the kinds of the WebSocket protocol (message_kind.py):

    out  0x00 HANDSHAKE   once, when the persona is ready; empty payload
    in   0x01 AUDIO       PCM16 LE mono at 24 kHz, any number of samples per message
    out  0x01 AUDIO       one 1920-sample frame (3840 bytes) per input frame heard
    out  0x02 TEXT        a text piece the model said (UTF-8, a word start as a space)
    out  0x05 ERROR       why the process is about to exit non-zero (UTF-8)
    in   0x06 PING        answered by a PING with the same payload
    in   0x08 SAY         JSON {"say": "text"}: words the model says, in its voice, from the
                          next whole frame on; {"cancel": true} drops those not started
    out  0x08 SAY         JSON: "queued" at once, then each word's "started", "done" or
                          "cancelled" after the answer of the frame that made it
                          (say_message.py; docs/say.md)
    in   0x09 HEARD       JSON {"hear": true}: what the user says, from now on (a model
                          exported with a transcriber; without one: ERROR, exit 2)
    out  0x09 HEARD       JSON: each "piece", "word" and "turn" heard, after the answer of the
                          frame that made it (heard_message.py; docs/heard.md)

    stdin:  AUDIO AUDIO ... EOF                 stdout:  HANDSHAKE AUDIO [TEXT] AUDIO ... (exit 0)

At EOF the samples of a last partial frame are padded with silence and answered, so the answer
to N samples is ceil(N / 1920) frames whose first N samples are `run`'s answer to the same
audio; then, with a transcriber, the user's last words (those still inside its delay) and the
turn's end come as HEARD messages, as `run --user-text-out` hears them. Only messages go to
stdout; logs go to stderr.

Lossless by default: the process reads the next message only after answering the frames of the
last one, so a fast writer is held back by the pipe. With `max_backlog_frames` (live audio) a
reader thread takes stdin as it comes and, when more frames wait than that, the oldest are
dropped - counted on stderr, and not answered - so the answer stays close to real time.
"""

from __future__ import annotations

import struct
import sys
import threading
from typing import BinaryIO, Callable, Iterator

from personaplex_edge.audio import pcm16_bytes
from personaplex_edge.errors import PersonaPlexError

from .frame_backlog import FrameBacklog
from .words.message_kind import Kind
from .pcm_frames import PcmFrames
from .words.heard_message import event_payload as heard_payload
from .words.heard_message import no_transcriber, parse_request
from .words.say_message import event_payload, parse_command, queued_payload

MAX_MESSAGE_BYTES = 1 << 20  # kind byte + payload; 1 MiB of PCM16 is ~22 s of audio
_HEADER = struct.Struct("<I")
ACCEPTED = frozenset({Kind.AUDIO, Kind.PING, Kind.SAY, Kind.HEARD})


class StdioProtocolError(PersonaPlexError):
    """A stream on stdin that breaks the framing; the reason goes out as ERROR, exit 2."""


def read_message(stream: BinaryIO) -> tuple[Kind, bytes] | None:
    """The next message on `stream`, or None at a clean EOF (between two messages)."""
    header = _read_exactly(stream, _HEADER.size)
    if not header:
        return None
    if len(header) < _HEADER.size:
        raise StdioProtocolError(f"stdin ended inside a message's length ({len(header)} of 4 "
                                 "bytes)")
    (length,) = _HEADER.unpack(header)
    if length == 0:
        raise StdioProtocolError("a message of length 0 (it needs at least its kind byte)")
    if length > MAX_MESSAGE_BYTES:
        raise StdioProtocolError(f"a message of {length} bytes, over the limit of "
                                 f"{MAX_MESSAGE_BYTES} (1 MiB); send audio in smaller pieces")
    body = _read_exactly(stream, length)
    if len(body) < length:
        raise StdioProtocolError(f"stdin ended inside a message ({len(body)} of {length} "
                                 "bytes)")
    try:
        kind = Kind(body[0])
    except ValueError:
        raise StdioProtocolError(f"unknown message kind 0x{body[0]:02x}") from None
    if kind not in ACCEPTED:
        raise StdioProtocolError(f"message kind 0x{kind:02x} ({kind.name}) is not accepted on "
                                 "stdin; send AUDIO (0x01), PING (0x06), SAY (0x08) or HEARD "
                                 "(0x09)")
    return kind, body[1:]


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def write_message(stream: BinaryIO, kind: Kind, payload: bytes = b"") -> None:
    stream.write(_HEADER.pack(len(payload) + 1) + bytes([kind]) + payload)


Handler = Callable[[bytes], None]


class _Input:
    """What stdin held at its end: how many samples of silence its last frame was padded
    with (the transcriber's flush counts from it)."""

    padding = 0


def _frames_lossless(stdin: BinaryIO, framer: PcmFrames, pong: Handler, say: Handler,
                     hear: Handler = lambda payload: None,
                     ended: _Input | None = None) -> Iterator:
    """Frames in the order stdin brings them, read only when the last ones are answered."""
    while (message := read_message(stdin)) is not None:
        kind, payload = message
        if kind == Kind.PING:
            pong(payload)
        elif kind == Kind.SAY:
            say(payload)
        elif kind == Kind.HEARD:
            hear(payload)
        else:
            yield from framer.feed(payload)[0]
    waiting = framer.pending_samples
    last = framer.flush()
    if last is not None:
        if ended is not None:
            ended.padding = framer.frame_size - waiting
        yield last


class _LiveReader:
    """stdin read as it comes, on a thread, into a FrameBacklog (the oldest dropped beyond
    `max_backlog` frames); frames() gives them to the conversation as they are ready."""

    def __init__(self, stdin: BinaryIO, framer: PcmFrames, max_backlog: int, pong: Handler,
                 say: Handler, hear: Handler, ended: _Input):
        self._ready = threading.Condition()
        self.backlog = FrameBacklog(max_backlog, self._notify)
        self._stdin, self._framer, self._pong, self._say = stdin, framer, pong, say
        self._hear, self._ended = hear, ended
        self._done = False
        self.error: BaseException | None = None
        threading.Thread(target=self._read, name="personaplex-stdio-reader", daemon=True).start()

    def _notify(self) -> None:
        with self._ready:
            self._ready.notify()

    def _read(self) -> None:
        try:
            for frame in _frames_lossless(self._stdin, self._framer, self._pong, self._say,
                                          self._hear, self._ended):
                self.backlog.push(frame)
        except BaseException as e:  # noqa: BLE001 - handed to the conversation's thread
            self.error = e
        finally:
            with self._ready:
                self._done = True
                self._ready.notify()

    def frames(self) -> Iterator:
        while True:
            with self._ready:
                while not len(self.backlog) and not self._done:
                    self._ready.wait()
            item = self.backlog.take()
            if item is not None:
                yield item[0]
            elif self._done:
                if self.error is not None:
                    raise self.error
                return


def run_stdio(conv, stdin: BinaryIO, stdout: BinaryIO, max_backlog_frames: int | None = None,
              progress: Callable[[str], None] = lambda line: None) -> int:
    """Answers the audio on `stdin` on `stdout` (the module docstring's protocol) with `conv`,
    a runtime/api.py Conversation whose persona is ready; returns the frames answered.
    StdioProtocolError for a malformed stream (after answering what came before it)."""
    lock = threading.Lock()  # the reader thread's PING answers and the frames' messages

    def send(kind: Kind, payload: bytes = b"") -> None:
        with lock:
            write_message(stdout, kind, payload)
            stdout.flush()

    def say(payload: bytes) -> None:
        command = parse_command(payload)
        if command.cancel:
            conv.cancel_say()
        else:
            send(Kind.SAY, queued_payload(conv.say(command.text)))

    hearing = threading.Event()  # the client asked for HEARD messages

    def hear(payload: bytes) -> None:
        wanted = parse_request(payload)
        if wanted and not conv.transcribing:
            raise no_transcriber(conv.model.model_dir)
        (hearing.set if wanted else hearing.clear)()

    def word_events() -> None:  # under the lock
        for event in conv.say_events():
            write_message(stdout, Kind.SAY, event_payload(event, conv.prompt_frames))
        if conv.transcribing:
            for heard in conv.heard_events():  # taken either way: only what follows a request
                if hearing.is_set():
                    write_message(stdout, Kind.HEARD, heard_payload(heard))

    framer = PcmFrames(conv.frame_size)
    pong = lambda payload: send(Kind.PING, payload)  # noqa: E731
    send(Kind.HANDSHAKE)
    reader, ended = None, _Input()
    if max_backlog_frames is None:
        frames = _frames_lossless(stdin, framer, pong, say, hear, ended)
    else:
        reader = _LiveReader(stdin, framer, max_backlog_frames, pong, say, hear, ended)
        frames = reader.frames()
    answered = 0
    for pcm_out, text in conv.stream(frames):
        with lock:
            write_message(stdout, Kind.AUDIO, pcm16_bytes(pcm_out))
            if text:
                write_message(stdout, Kind.TEXT, text.encode("utf-8"))
            word_events()
            stdout.flush()
        answered += 1
    if conv.transcribing:  # the input is over: the user's last words, and the turn's end
        conv.flush_heard(ended.padding)
    with lock:  # and a cancel after the last frame
        word_events()
        stdout.flush()
    if reader is not None and reader.backlog.dropped:
        progress(f"stdio: {reader.backlog.dropped} of {reader.backlog.pushed} input frames "
                 f"dropped (more than {max_backlog_frames} waited)")
    return answered


def serve_stdio(open_conversation: Callable[[], object], max_backlog_frames: int | None = None,
                progress: Callable[[str], None] | None = None) -> int:
    """The `stdio` command around run_stdio: the protocol on the process's own stdin and
    stdout, anything else printed sent to stderr instead, and every failure an ERROR message
    and an exit status (2 for what the user can fix, 1 for a reader that went away)."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the stream
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        try:
            with open_conversation() as conv:
                frames = run_stdio(conv, sys.stdin.buffer, out, max_backlog_frames, say)
        except PersonaPlexError as e:
            say(f"personaplex-edge: error: {e}")
            write_message(out, Kind.ERROR, str(e).encode("utf-8"))
            out.flush()
            return e.exit_code
        say(f"stdio: {frames} frames answered")
        return 0
    except BrokenPipeError:
        say("personaplex-edge: stdout was closed by its reader; stopping")
        return 1
