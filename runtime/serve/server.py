"""Loading the model, serving until a signal, and stopping cleanly.

The server owns its aiohttp AppRunner. On SIGINT or SIGTERM it stops taking sessions, tells
every open session why it ends, each in its protocol ("the server is shutting down": /api/chat's
ERROR; /v1/realtime's response.done and the close frame), waits for their handlers to close
them (1001) and free their rows, and only then lets the tick thread, the prefill thread and
the model go. `personaplex-edge serve` then exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from aiohttp import WSCloseCode, web

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.runtime.persona import DEFAULT_VOICE, Persona
from personaplex_edge.runtime.sampling import SamplingParams

from .app import build_app
from .auth import parse_allowed_origins
from .hosts import HostRule, parse_allowed_hosts
from .opus import check_opus
from .params import MAX_TEXT_PROMPT_CHARS, Voices
from .session import MAX_AHEAD_S
from .state import ServerState
from .stats import ServerStats
from .ticker import Ticker
from .webrtc.call_stats import CallMetrics
from .webrtc.ice import IceOptions, host_addresses

log = logging.getLogger("personaplex_edge.serve")

DRAIN_SECONDS = 5.0  # how long a stop waits for the sessions' handlers to finish
MAX_REQUEST_LINE = 16 + 9 * MAX_TEXT_PROMPT_CHARS + 1024  # bytes: %XX%XX%XX per character


@dataclass
class ServeOptions:
    model_dir: Path
    model_name: str = ""  # what /api/health reports (default: the directory's name)
    host: str = "127.0.0.1"
    port: int = 8998
    max_sessions: int = 4
    ssl_dir: Path | None = None
    auth_token: str | None = None
    # browser origins admitted besides the server's own (auth.parse_allowed_origins)
    allowed_origins: tuple[str, ...] = ()
    # host names the page and the WebSockets answer to besides the defaults (hosts.HostRule)
    allowed_hosts: tuple[str, ...] = ()
    voice_dir: Path | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    persona: Persona = field(default_factory=Persona)
    max_backlog: int = 2  # input frames a session may have waiting before the oldest drop
    send_queue: int = 64  # messages waiting for a client (~2.5 s of answers) before it is cut
    # audio a client may send ahead of the clock (None: no limit; benchmarks and tests that
    # push audio as fast as they can)
    max_ahead_s: float | None = MAX_AHEAD_S
    device: str = "auto"
    threads: int | None = None
    persona_cache: object = None  # a runtime.persona_cache.PersonaCache (None: the model's default)
    # WebRTC calls (webrtc/ice.py): STUN/TURN servers (none: nothing is contacted) and TURN's login
    ice_servers: tuple[str, ...] = ()
    turn_username: str | None = None
    turn_credential: str | None = None


def ssl_context(ssl_dir: Path) -> ssl.SSLContext:
    cert, key = Path(ssl_dir) / "cert.pem", Path(ssl_dir) / "key.pem"
    missing = [p.name for p in (cert, key) if not p.is_file()]
    if missing:
        raise PersonaPlexError(
            f"--ssl {ssl_dir}: {' and '.join(missing)} missing. A self-signed pair: openssl req "
            f"-x509 -newkey rsa:2048 -nodes -days 365 -subj /CN=localhost -keyout {key} "
            f"-out {cert}")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as e:
        raise PersonaPlexError(f"--ssl {ssl_dir}: cannot use cert.pem/key.pem ({e})") from None
    return ctx


class Server:
    """One server on one loaded model; `start()` binds, `stop()` closes every session."""

    def __init__(self, options: ServeOptions, model=None,
                 progress: Callable[[str], None] = print):
        check_opus()
        self.options = options
        self.say = progress
        if options.max_sessions < 1:
            raise PersonaPlexError("--max-sessions must be at least 1")
        self._ssl = ssl_context(options.ssl_dir) if options.ssl_dir else None
        self._origins = parse_allowed_origins(options.allowed_origins)
        self._hosts = HostRule.for_server(options.host,
                                          parse_allowed_hosts(options.allowed_hosts))
        if options.voice_dir is not None and not Path(options.voice_dir).is_dir():
            raise PersonaPlexError(f"--voice-dir {options.voice_dir} is not a directory")
        if model is None:
            from personaplex_edge.runtime.api import Model

            model = Model.load(options.model_dir, device=options.device,
                               threads=options.threads, progress=progress,
                               persona_cache=options.persona_cache)
        self.model = model
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.everywhere = False
        self.state: ServerState | None = None

    def _check_defaults(self) -> None:
        """The defaults every session starts from are checked once, now, by opening one
        conversation with them: a bad flag fails the command, not each client (and the default
        persona's prefill lands in the persona cache, so the first client starts at once)."""
        o, model = self.options, self.model
        o.sampling.check(*model.top_k_max)
        model.text  # every session's prompt and text need it: a model without one stops here
        conv = model.open_conversation(o.sampling, o.persona)
        try:
            frames = conv.prefill()
            if frames:
                self.say(f"persona: {frames} prompt frames in {conv.prefill_seconds:.2f} s")
        finally:
            conv.close()

    async def start(self) -> None:
        o, model = self.options, self.model
        self._check_defaults()
        from personaplex_edge.runtime.conversation import step_many

        stats = ServerStats()
        stats.capacity.set(o.max_sessions)
        bank = tuple(model.voices())
        voice = o.persona.voice
        default_voice = (DEFAULT_VOICE if DEFAULT_VOICE in bank else None) if voice is None \
            else (voice if voice in bank else Path(voice).name)
        self.state = ServerState(
            model=model, model_name=o.model_name or Path(o.model_dir).name,
            sampling=o.sampling, persona=o.persona,
            voices=Voices(bank, Path(o.voice_dir) if o.voice_dir else None),
            top_k_max=model.top_k_max, ticker=Ticker(step_many, stats), stats=stats,
            prefill_pool=ThreadPoolExecutor(1, thread_name_prefix="personaplex-prefill"),
            max_sessions=o.max_sessions, max_backlog=o.max_backlog, send_queue=o.send_queue,
            auth_token=o.auth_token, allowed_origins=self._origins, default_voice=default_voice,
            max_ahead_s=o.max_ahead_s, hosts=self._hosts,
            ice=IceOptions(host_addresses(o.host), tuple(o.ice_servers), o.turn_username,
                           o.turn_credential),
            call_metrics=CallMetrics(stats.registry))
        self.state.ticker.start()
        # a request line long enough for the longest text_prompt, percent-encoded (aiohttp's
        # 8 KiB default would answer a bare 400 to a prompt of ~2700 characters)
        self.runner = web.AppRunner(build_app(self.state), access_log=None,
                                    handle_signals=False, shutdown_timeout=DRAIN_SECONDS,
                                    max_line_size=MAX_REQUEST_LINE)
        await self.runner.setup()
        site = web.TCPSite(self.runner, o.host, o.port, ssl_context=self._ssl)
        try:
            await site.start()
        except OSError as e:
            await self.runner.cleanup()
            self.state.ticker.stop()
            raise PersonaPlexError(f"cannot listen on {o.host}:{o.port} ({e.strerror}); "
                                   "choose another --port or stop what uses it") from None
        host, port = self.runner.addresses[0][:2]
        # every interface is not an address to open: this machine's loopback is
        self.everywhere = host in ("0.0.0.0", "::")
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if self._ssl else 'http'}://{shown}:{port}/"
        self.port = port

    async def stop(self) -> None:
        """Refuses new sessions, ends the open ones with a reason, waits for them, then
        releases everything."""
        state = self.state
        if state is None:
            return
        state.stopping = True
        for session in list(state.sessions):
            session.end("the server is shutting down", WSCloseCode.GOING_AWAY)
        deadline = asyncio.get_running_loop().time() + DRAIN_SECONDS
        while (state.sessions or state.slots_used) and \
                asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        if self.runner is not None:
            await self.runner.cleanup()
        # prefills still queued belong to clients that are gone: they never start; the one
        # running is waited for (a bounded while), then the tick thread ends; the event loop
        # stays free meanwhile, so a second Ctrl-C still works
        loop = asyncio.get_running_loop()
        state.prefill_pool.shutdown(wait=False, cancel_futures=True)
        try:
            await asyncio.wait_for(loop.run_in_executor(None, state.prefill_pool.shutdown),
                                   DRAIN_SECONDS)
        except asyncio.TimeoutError:
            log.info("a persona prefill is still running; not waiting for it")
        await loop.run_in_executor(None, state.ticker.stop)
        self.state = None

    async def run_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal() -> None:
            if stop.is_set():  # a second Ctrl-C while closing: stop waiting for anyone
                self.say("stopping now")
                os._exit(130)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        await self.start()
        self.say(serving_line(self.state.model_name, self.url, self.everywhere, self.options))
        try:
            await stop.wait()
        finally:
            n = len(self.state.sessions)
            self.say(f"stopping: closing {n} session{'s' if n != 1 else ''}")
            await self.stop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


def serving_line(model_name: str, url: str, everywhere: bool, o: ServeOptions) -> str:
    """What `serve` says once it listens: where, how many sessions, and what a client needs."""
    where = " (and on every interface of this machine)" if everywhere else ""
    needs = ("; its WebSockets and WebRTC calls need the --auth-token (a browser's call: a "
             "client key made with it)" if o.auth_token else "")
    return (f"serving {model_name} on {url}{where} (up to {o.max_sessions} "
            f"session{'s' if o.max_sessions != 1 else ''}{needs}); Ctrl-C to stop")


def serve(options: ServeOptions, progress: Callable[[str], None] = print, model=None) -> int:
    """`personaplex-edge serve`: serves until SIGINT/SIGTERM, then returns 0. `model`: one
    already loaded; else options.model_dir is loaded (after the cheap checks of the options),
    and closed at the end."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    server = Server(options, model=model, progress=progress)
    try:
        asyncio.run(server.run_until_signal())
    finally:
        if model is None:
            server.model.close()
        log.removeHandler(handler)
    progress("stopped")
    return 0
