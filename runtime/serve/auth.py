"""Who may open a WebSocket of this server: the browser origin check and the `--auth-token`
check, on every WebSocket route.

Browsers apply no CORS to WebSockets: any page a user visits may open ws://127.0.0.1:8998 and
talk to the model, and only its `Origin` header says where it comes from. A request with an
Origin is admitted when that is the server's own (the page it serves, reached by whatever name
the Host header carries - one of the names the server answers to, which hosts.py checks first,
so a rebound name never gets this far; a TLS proxy in front changes the scheme, not the host)
or one listed in `--allowed-origins` (`*`: any); a request without one is a native client (an
SDK, moshi's client), which no page can pretend to be.

The token is `token=` in the query (what a browser's WebSocket can send) or `Authorization:
Bearer TOKEN` (what the OpenAI SDKs send), compared in constant time so the answer's timing
tells nothing about how much of a guess was right.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from aiohttp import web

from personaplex_edge.errors import PersonaPlexError

ANY_ORIGIN = "*"


def _normal(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def parse_allowed_origins(values) -> tuple[str, ...]:
    """`--allowed-origins` entries ("http://localhost:3000", "*") -> normalised; a value that is
    not an origin is an error naming the flag."""
    out = []
    for value in values:
        origin = _normal(value)
        if not origin:
            continue
        parts = urlsplit(origin)
        if origin != ANY_ORIGIN and (parts.scheme not in ("http", "https") or not parts.netloc
                                     or parts.path or parts.query):
            raise PersonaPlexError(f"--allowed-origins: {value!r} is not an origin; give "
                                   "scheme://host[:port] (e.g. http://localhost:3000) or *")
        out.append(origin)
    return tuple(out)


def origin_allowed(request: web.Request, allowed: tuple[str, ...]) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    origin = _normal(origin)
    if ANY_ORIGIN in allowed or origin in allowed:
        return True
    host = request.headers.get("Host", "").lower()
    return bool(host) and urlsplit(origin).netloc == host


def presented_tokens(request: web.Request) -> list[str]:
    tokens = request.query.getall("token", [])
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        tokens.append(value.strip())
    return tokens


def authorized(request: web.Request, token: str | None) -> bool:
    if token is None:
        return True  # no token set: whatever key a client presents (the SDKs always send one)
    expected = token.encode("utf-8")
    ok = False
    for candidate in presented_tokens(request):
        # every candidate is compared (no early exit), each in constant time
        ok |= hmac.compare_digest(candidate.encode("utf-8"), expected)
    return ok
