"""The HEARD message (kind 0x09) of the moshi-protocol wires, `stdio` and `/api/chat`: what the
user said, as the model's transcriber heard it (runtime/words/heard.py). The payload is one JSON
object.

    client -> server   {"hear": true}     send what is heard from now on ({"hear": false} stops)
    server -> client   {"event": "piece", "text": "hel", "item": 1, "step": 11,
                        "start": 0.38, "end": 0.38}        what a piece adds to the turn's text
                       {"event": "word", "text": "hello", "item": 1, "step": 13,
                        "start": 0.38, "end": 0.54}        a finished word, its time in the audio
                       {"event": "turn", "text": "hello world", "item": 1, "step": 25,
                        "start": 0.38, "end": 0.86}        the user's turn is over

`step` is the frame whose answer the event follows, counted as SAY counts it (the client's
first audio frame is step 0); `start` and `end` are seconds into the client's audio; `item`
numbers the user's turns. Only a client that asks gets HEARD messages; asking a model without a
transcriber is refused with the protocol's ERROR (export --transcriber adds one).
"""

from __future__ import annotations

import json

from personaplex_edge import transcriber
from personaplex_edge.errors import PersonaPlexError

from .heard import Heard


class HeardMessageError(PersonaPlexError):
    """A HEARD request this side cannot take (the reason names the fix)."""


def parse_request(payload: bytes) -> bool:
    """A client's HEARD payload -> whether it wants the events."""
    try:
        data = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise HeardMessageError(f"a HEARD message holds one JSON object ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("hear"), bool):
        raise HeardMessageError('a HEARD message is {"hear": true} or {"hear": false}')
    return data["hear"]


def no_transcriber(model_dir=None) -> HeardMessageError:
    return HeardMessageError(f"HEARD: {transcriber.no_transcriber(model_dir)}")


def event_payload(event: Heard) -> bytes:
    return json.dumps(event.to_dict(), ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8")
