"""The kinds of message of the moshi/PersonaPlex protocol: the first byte of every message, on
`serve`'s WebSocket (/api/chat) and on `stdio`'s framed pipe alike."""

from __future__ import annotations

import enum


class Kind(enum.IntEnum):
    HANDSHAKE = 0x00
    AUDIO = 0x01  # Ogg/Opus pages, 24 kHz mono
    TEXT = 0x02  # a UTF-8 text piece, word starts as a space
    CONTROL = 0x03  # start/endTurn/pause/restart in the web clients; not sent by them today
    METADATA = 0x04  # JSON
    ERROR = 0x05  # UTF-8 reason, sent before the server closes
    PING = 0x06
    COLORED_TEXT = 0x07  # moshi's server to its client only
    SAY = 0x08  # this project's: JSON, words for the model to say in, their events out
    # (say_message.py; not part of moshi's protocol, so only a client that sends one gets one)
    HEARD = 0x09  # this project's: JSON, what the user said, to a client that asks for it
    # (heard_message.py; a model exported with a transcriber)
