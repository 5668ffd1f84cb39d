"""For the framework clients that run in venvs of their own (pipecat_client.py,
livekit_client.py; standard library only): wait for a server's last answers."""

from __future__ import annotations

import asyncio
from typing import Callable


async def until_quiet(count: Callable[[], int], quiet_s: float = 0.5,
                      limit_s: float = 10.0) -> None:
    """Returns once `count()` (answers heard so far) has not changed for `quiet_s`, or after
    `limit_s` at most."""
    loop = asyncio.get_running_loop()
    heard, since, end = -1, loop.time(), loop.time() + limit_s
    while loop.time() - since < quiet_s and loop.time() < end:
        if count() != heard:
            heard, since = count(), loop.time()
        await asyncio.sleep(0.05)
