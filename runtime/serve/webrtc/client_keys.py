"""Ephemeral client keys: what a browser app holds instead of the server's token.

    the app's backend, with the token  ->  POST /v1/realtime/client_secrets  ->  {"value":
    "ek_...", "expires_at": ..., "session": ...}  ->  the page posts its call's offer with
    `Authorization: Bearer ek_...`  ->  the key is spent: one call each

OpenAI's GA browser flow, as its SDKs expect it (`@openai/agents-realtime` refuses a key without
the `ek_` prefix in a browser unless told it is insecure). A key lives `DEFAULT_SECONDS` unless
`expires_after.seconds` asks otherwise (10 s to 2 hours, OpenAI's bounds; a key of the beta's
`/v1/realtime/sessions`, one minute, as OpenAI's were). The session it was made with is the
call's starting session, checked when the key is made (starting.py). A call spends its
key; a call refused for its offer or its session, or by a fault of the server, gives it back.
An expired, spent or unknown `ek_` key is refused (401) whatever the server's token.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

PREFIX = "ek_"
DEFAULT_SECONDS = 600
MIN_SECONDS, MAX_SECONDS = 10, 7200
MAX_KEYS = 10_000  # unspent keys held at once; past it the oldest go first


class KeyRequestError(ValueError):
    """A client_secrets request this server cannot honour: answered 400 with the message."""


@dataclass(frozen=True)
class ClientKey:
    value: str
    expires_at: float  # seconds since the epoch
    session: dict = field(default_factory=dict)  # the call's starting session (client's shape)


class ClientKeys:
    """The unspent keys of one server."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        self._keys: dict[str, ClientKey] = {}  # insertion order: oldest first

    def issue(self, session: dict, expires_after=None,
              default_seconds: int = DEFAULT_SECONDS) -> ClientKey:
        """A new key for a call whose starting session is `session` (checked by the caller),
        living `expires_after.seconds` (`{"anchor": "created_at", "seconds": N}`) or
        `default_seconds`; KeyRequestError naming what is wrong."""
        seconds = _seconds(expires_after, default_seconds)
        if not isinstance(session, dict):
            raise KeyRequestError("session must be an object (the call's session)")
        now = self._clock()
        self._forget_expired(now)
        while len(self._keys) >= MAX_KEYS:
            del self._keys[next(iter(self._keys))]
        key = ClientKey(PREFIX + secrets.token_urlsafe(24), now + seconds, session)
        self._keys[key.value] = key
        return key

    def valid(self, value: str) -> bool:
        """Whether the key would be taken now (it is not spent by asking)."""
        key = self._keys.get(value)
        return key is not None and key.expires_at > self._clock()

    def redeem(self, value: str) -> ClientKey | None:
        """The key, spent now (a concurrent call with it is refused); None when it is unknown,
        spent or expired."""
        key = self._keys.pop(value, None)
        if key is None or key.expires_at <= self._clock():
            return None
        return key

    def restore(self, key: ClientKey) -> None:
        """A key whose call was refused (its offer, its session, a fault of the server): good
        again for the call the client makes instead, until it expires."""
        if key.expires_at > self._clock():
            self._keys[key.value] = key

    def _forget_expired(self, now: float) -> None:
        for value in [v for v, k in self._keys.items() if k.expires_at <= now]:
            del self._keys[value]

    def __len__(self) -> int:
        return len(self._keys)


def _seconds(expires_after, default: int) -> int:
    if expires_after is None:
        return default
    if not isinstance(expires_after, dict):
        raise KeyRequestError("expires_after must be an object: {\"anchor\": \"created_at\", "
                              "\"seconds\": 600}")
    if expires_after.get("anchor", "created_at") != "created_at":
        raise KeyRequestError("expires_after.anchor: only created_at is known")
    seconds = expires_after.get("seconds", default)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or \
            not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise KeyRequestError(f"expires_after.seconds: {seconds!r} is not a whole number of "
                              f"seconds from {MIN_SECONDS} to {MAX_SECONDS}")
    return seconds


def is_client_key(token: str) -> bool:
    return token.startswith(PREFIX)
