"""`personaplex-edge serve`: moshi's and OpenAI Realtime's protocols and a web page, several
conversations on one model (runtime/serve)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import PersonaPlexError
from ..model_ref import resolve_model
from .common import add_backlog_arg, add_conversation_args, note, persona_cache, sampling


def add_parser(sub) -> None:
    v = sub.add_parser("serve", help="the moshi/PersonaPlex (/api/chat) and OpenAI Realtime "
                                     "(/v1/realtime) WebSocket protocols and a web page: several "
                                     "conversations on one model")
    add_conversation_args(v, model_default="models/personaplex-7b-v1")
    v.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (127.0.0.1: this machine only; 0.0.0.0: all)")
    v.add_argument("--port", type=int, default=8998, help="port (8998, as moshi's; 0: any free)")
    v.add_argument("--max-sessions", type=int, default=4,
                   help="conversations at once; one more is refused as busy (README: choosing "
                        "it from bench)")
    v.add_argument("--ssl", metavar="DIR", help="serve https/wss with DIR/cert.pem and DIR/key.pem "
                                               "(a browser's microphone needs it beyond localhost)")
    v.add_argument("--auth-token", default=os.environ.get("PERSONAPLEX_AUTH_TOKEN"),
                   help="the WebSockets and WebRTC calls need this token (?token= or "
                        "Authorization: Bearer; a browser's call may present a client key made "
                        "with it); "
                        "default: $PERSONAPLEX_AUTH_TOKEN, which other users cannot see in ps")
    v.add_argument("--allowed-origins", metavar="ORIGINS",
                   default=os.environ.get("PERSONAPLEX_ALLOWED_ORIGINS"),
                   help="browser pages that may open the WebSockets besides the server's own, "
                        "comma-separated (http://localhost:3000,https://app.example.com; *: "
                        "any); clients that send no Origin (SDKs) are not affected")
    v.add_argument("--allowed-hosts", metavar="NAMES",
                   default=os.environ.get("PERSONAPLEX_ALLOWED_HOSTS"),
                   help="host names the page and the WebSockets answer to besides localhost, "
                        "--host and (bound beyond loopback) this machine's names and addresses, "
                        "comma-separated (voice.example.com; *: any, behind a balancer)")
    v.add_argument("--voice-dir", help="recordings clients may name as voice_prompt, besides the "
                                       "voice bank")
    v.add_argument("--ice-server", action="append", metavar="URL",
                   help="WebRTC calls (/v1/realtime/calls): a STUN or TURN server for clients "
                        "behind NAT (stun:HOST:PORT, turn:HOST:PORT; repeatable). Default: none "
                        "is contacted, the calls' candidates are the server's own addresses")
    v.add_argument("--turn-username", help="the TURN servers' username")
    v.add_argument("--turn-credential", default=os.environ.get("PERSONAPLEX_TURN_CREDENTIAL"),
                   help="the TURN servers' password (default: $PERSONAPLEX_TURN_CREDENTIAL)")
    add_backlog_arg(v)
    v.set_defaults(func=run)


def need_serve_extra() -> None:
    # checked before the server's modules are imported: they import these at their top
    for module in ("aiohttp", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            raise PersonaPlexError(
                f"serve needs the serve extra ({module} is missing): pip install "
                '"personaplex-edge[serve]"') from None
    from ..runtime.serve.opus import check_opus  # Opus is the system's libopus

    check_opus()


def run(args) -> int:
    """The moshi/PersonaPlex and OpenAI Realtime WebSocket protocols and a web page, until
    Ctrl-C (runtime/serve)."""
    need_serve_extra()
    from ..runtime.persona import Persona
    from ..runtime.serve import ServeOptions, serve

    model_dir = resolve_model(args.model, note)
    return serve(ServeOptions(
        model_dir=model_dir, model_name=args.model if not Path(args.model).is_dir()
        else model_dir.name, host=args.host, port=args.port, max_sessions=args.max_sessions,
        ssl_dir=Path(args.ssl) if args.ssl else None, auth_token=args.auth_token,
        allowed_origins=listed(args.allowed_origins), allowed_hosts=listed(args.allowed_hosts),
        voice_dir=Path(args.voice_dir) if args.voice_dir else None, sampling=sampling(args),
        persona=Persona(text_prompt=args.text_prompt, voice=args.voice_prompt,
                        enabled=not args.no_persona),
        max_backlog=args.max_backlog_frames, device=args.device, threads=args.threads,
        persona_cache=persona_cache(args, note), ice_servers=tuple(args.ice_server or ()),
        turn_username=args.turn_username, turn_credential=args.turn_credential),
        progress=note)


def listed(value: str | None) -> tuple[str, ...]:
    """A comma-separated flag's entries."""
    return tuple(value.split(",")) if value else ()
