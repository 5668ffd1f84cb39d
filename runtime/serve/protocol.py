"""The messages of the moshi/PersonaPlex WebSocket protocol.

Every WebSocket message is binary; its first byte says what the rest is. The server sends the
handshake once the persona prefill is done, then an audio message per answer frame (Ogg/Opus
pages) and a text message per non-padding text piece; clients send audio. Metadata (JSON) goes
only to a client that asked for it (`stats=1`); an error message explains why the server is
about to close the session. SAY (this project's, JSON both ways; runtime/words/say_message.py):
words a client has the model say, and their events, sent only to a client that sends SAY. HEARD
(this project's, JSON; runtime/words/heard_message.py): what the user said, sent only to a
client that asks with HEARD {"hear": true}.
"""

from __future__ import annotations

import json

from ..words.message_kind import Kind

MAX_MESSAGE_BYTES = 1 << 20  # a larger message ends its session (1 s of Opus is ~4 KiB)


# Kinds a client may send that carry nothing this server acts on: the web clients define them
# (a control message, a ping), so they are read and let go rather than ending the session.
IGNORED_FROM_CLIENT = frozenset({Kind.HANDSHAKE, Kind.CONTROL, Kind.METADATA, Kind.PING})


class ProtocolError(Exception):
    """A message this server does not take; the reason is sent to the client as ERROR."""


HANDSHAKE = bytes([Kind.HANDSHAKE])  # as the Python servers send it: the kind byte alone


def audio(pages: bytes) -> bytes:
    return bytes([Kind.AUDIO]) + pages


def text(piece: str) -> bytes:
    return bytes([Kind.TEXT]) + piece.encode("utf-8")


def error(reason: str) -> bytes:
    return bytes([Kind.ERROR]) + reason.encode("utf-8")


def metadata(data: dict) -> bytes:
    return bytes([Kind.METADATA]) + json.dumps(data, separators=(",", ":")).encode("utf-8")


def say(payload: bytes) -> bytes:
    return bytes([Kind.SAY]) + payload


def heard(payload: bytes) -> bytes:
    return bytes([Kind.HEARD]) + payload


def parse(data: bytes) -> tuple[Kind, bytes]:
    """A client's binary message -> (kind, payload); ProtocolError for what a client cannot
    send: an empty or oversized message, an unknown kind, or a kind only servers send."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes is over the limit of "
                            f"{MAX_MESSAGE_BYTES}")
    if not data:
        raise ProtocolError("empty message (the first byte is the message kind)")
    try:
        kind = Kind(data[0])
    except ValueError:
        raise ProtocolError(f"unknown message kind {data[0]}") from None
    if kind not in (Kind.AUDIO, Kind.SAY, Kind.HEARD) and kind not in IGNORED_FROM_CLIENT:
        raise ProtocolError(f"message kind {kind.value} ({kind.name.lower()}) is sent by "
                            "servers, not clients")
    return kind, bytes(data[1:])
