"""What a call's data channel may hold of a client's messages: the size its answer advertises,
enforced as the message arrives, not after.

aiortc answers with `a=max-message-size:262144` (MAX_MESSAGE_BYTES) but takes whatever comes:
it reassembles a message whole before handing it on, so a 15 MB message would be held, then
parsed with one json.loads on the event loop every call shares. A client that sends more than
it was told it may breaks the protocol (no browser does: they refuse to send it), and a
stream's fragments cannot be dropped without losing its order, so the call ends, as libwebrtc
aborts the association for a message its reassembly cannot take.

    an SCTP DATA chunk  ->  aiortc's reassembly  ->  the bytes waiting there on the chunk's
    stream over MAX_MESSAGE_BYTES: dropped at once, `over(bytes)` (the call ends)
"""

from __future__ import annotations

from typing import Callable

MAX_MESSAGE_BYTES = 262144  # aiortc's a=max-message-size, what the answer says


def cap_messages(sctp, limit: int, over: Callable[[int], None]) -> None:
    """Holds each stream of `sctp` (aiortc's RTCSctpTransport) to `limit` bytes waiting for
    reassembly (a message longer than that, or messages that long behind a lost one): past it
    they are dropped and `over(bytes)` called. Relies on aiortc 1.16's transport
    (`_receive_data_chunk`, `_inbound_streams`, `_advertised_rwnd`);
    tests/test_serve_webrtc.py fails if a new aiortc changes them."""
    original = sctp._receive_data_chunk

    async def receive(chunk) -> None:
        await original(chunk)  # reassembled: what is whole has been handed on
        stream = sctp._inbound_streams.get(chunk.stream_id)
        if stream is None or not stream.reassembly:
            return
        waiting = sum(len(c.user_data) for c in stream.reassembly)
        if waiting > limit:
            stream.reassembly.clear()
            sctp._advertised_rwnd += waiting  # as if they had been handed on
            over(waiting)

    sctp._receive_data_chunk = receive
