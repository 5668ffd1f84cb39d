"""The `--auth-token` check of `/api/chat`: the token as `token=` in the query (what a browser's
WebSocket can send) or as `Authorization: Bearer TOKEN`, compared in constant time so the
answer's timing tells nothing about how much of a guess was right."""

from __future__ import annotations

import hmac

from aiohttp import web


def presented_tokens(request: web.Request) -> list[str]:
    tokens = request.query.getall("token", [])
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        tokens.append(value.strip())
    return tokens


def authorized(request: web.Request, token: str | None) -> bool:
    if token is None:
        return True
    expected = token.encode("utf-8")
    ok = False
    for candidate in presented_tokens(request):
        # every candidate is compared (no early exit), each in constant time
        ok |= hmac.compare_digest(candidate.encode("utf-8"), expected)
    return ok
