"""The openai SDK's Realtime client driven as the tests drive it: its session update first,
then the user's audio as fast as the SDK sends it, then events until the test has what it
needs."""

from __future__ import annotations

import base64
from typing import Callable


async def sdk_events(connect, session: dict, data: bytes = b"", chunk: int = 3840,
                     stop: Callable | None = None, commit_first: bool = False) -> list[dict]:
    """Through an SDK connection (`client.realtime.connect(...)` or the beta's): session.update
    and its session.updated; then, unless `stop` is None, (with `commit_first`, an
    input_audio_buffer.commit, and) `data` appended in `chunk`-byte events and every event
    read until `stop(event)` says enough. Every event received, as dicts."""
    events = []
    async with connect as conn:
        await conn.session.update(session=session)
        async for event in conn:
            events.append(event.to_dict())
            if event.type == "session.updated":
                break
        if stop is None:
            return events
        if commit_first:
            await conn.input_audio_buffer.commit()
        for at in range(0, len(data), chunk):
            await conn.input_audio_buffer.append(
                audio=base64.b64encode(data[at:at + chunk]).decode())
        async for event in conn:
            events.append(event.to_dict())
            if stop(event):
                break
    return events
