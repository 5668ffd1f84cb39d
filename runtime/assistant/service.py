"""`personaplex-edge assistant`: the --mic loop as a service that runs unattended.

    config -> model loaded once -> a conversation, its persona run -> IdleGate (idle.py)
      -> devices opened (READY=1) -> the duplex loop, echo cancelled, until SIGTERM
           device lost -> "waiting for a device": no frames, no steps, no backlog;
                          looked for every audio.retry_seconds, reopened -> the same
                          conversation goes on, the figures keep counting
      SIGHUP -> the config read again: persona and sampling apply at the next conversation,
                idle.sleep_after and idle.wake_frames at once, the rest at a restart
      control socket (control.py, commands.py): events out, commands in

The main thread ticks every 0.25 s: watchdog, reload, status. Log lines go to stdout one per
event (journald takes them as they are); only a terminal gets a redrawn status line.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping

from personaplex_edge.errors import AudioDeviceError, ConfigError

from .checks import check_before_loading, check_with_model
from .commands import dispatch
from .config import AssistantConfig, load_config
from .idle import IdleGate, IdlePolicy
from .notify import Notifier, Watchdog, watchdog_interval

TICK_SECONDS = 0.25
STARTUP_SECONDS = 5.0  # a reopened device that gives no sample for this long is lost again
# keys a reload applies at once (idle) or at the next conversation (persona, sampling)
LIVE_KEYS = ("idle.sleep_after", "idle.wake_frames")
NEXT_CONVERSATION_PREFIXES = ("persona.text_prompt", "persona.voice", "sampling.")


def _policy(cfg: AssistantConfig) -> IdlePolicy:
    return IdlePolicy.from_seconds(cfg["idle.sleep_after"], cfg["idle.preroll_ms"],
                                   wake_frames=cfg["idle.wake_frames"],
                                   aggressiveness=cfg["idle.vad_aggressiveness"],
                                   voiced_subframes=cfg["idle.voiced_subframes"],
                                   vad=cfg["idle.vad"], vad_threshold=cfg["idle.vad_threshold"],
                                   silero_model=cfg["idle.silero_model"])


class Assistant:
    def __init__(self, config_path: str | Path | None,
                 overrides: Mapping[str, tuple[str, object]] | None = None):
        self.config_path = config_path
        self.overrides = dict(overrides or {})
        self.config = load_config(config_path, self.overrides)  # a bad value: before loading
        check_before_loading(self.config)  # a missing file or package too
        self.tty = sys.stdout.isatty()
        self.notifier = Notifier()
        self.watchdog = Watchdog(self.notifier, watchdog_interval())
        self._stop = threading.Event()
        self._reload = False
        self._status = ""
        self.started = time.monotonic()
        self.model = self.conv = self.gate = self.control = None
        self.loop = None  # the duplex loop of the devices now open
        self._counted = None  # the last loop whose counts went into the totals
        self.devices_open = False
        self.device_losses = 0
        self.model_loads = 0
        self.ready = False
        self._waiting_since: float | None = None
        self._totals = {"frames": 0, "dropped_frames": 0, "underruns": 0}

    # -- output -----------------------------------------------------------------------------------
    def log(self, line: str) -> None:
        if self.tty:
            line = time.strftime("%H:%M:%S ") + line
            print("\r\033[K" + line, flush=True)
        else:
            print(line, flush=True)

    def emit(self, event: dict) -> None:
        """An event for the socket's clients and, for the rare ones, the log (any thread)."""
        if self.control is not None:
            self.control.publish(event)
        kind = event["event"]
        if kind == "sleep":
            self.log(f"asleep ({event['reason']}): the model stops; the voice detector listens")
        elif kind == "wake":
            latency = event["latency_frames"]
            self.log(f"awake ({event['reason']}"
                     + ("" if latency is None else f", {latency} frame(s) after the voice began")
                     + f"): the model heard {event['preroll_frames']} frame(s) of pre-roll")
        elif kind == "conversation":
            self.log(f"conversation {event['number']} ready: {event['prompt_frames']} prompt "
                     f"frames in {event['seconds']:.2f} s"
                     + (" (from the persona cache)" if event["persona_cached"] else ""))
        elif kind in ("muted", "unmuted"):
            self.log(kind)
        elif kind == "reload_refused":
            self.log(f"reload refused, the running config stays: {event['reason']}")
        elif kind == "persona_refused":
            self.log(f"the new persona cannot run, the last one stays: {event['reason']}")

    # -- lifecycle --------------------------------------------------------------------------------
    def run(self) -> int:
        self._signals()
        cfg = self.config
        self.log(f"config: {cfg.source}")
        if cfg.socket_path is not None:  # bound first: a path in use fails before the load
            from .control import ControlServer

            self.control = ControlServer(cfg.socket_path, lambda req: dispatch(self, req),
                                         self.log)
        try:
            self._load(cfg)
            if self.control is not None:
                self.control.start()
                self.log(f"control socket: {cfg.socket_path}")
            self._devices()
        finally:
            if not self._stop.is_set():
                self.notifier.stopping()
            self._shutdown()
        return 0

    def _signals(self) -> None:
        def stop(signum, frame):
            if not self._stop.is_set():
                self.notifier.stopping()  # at once: systemd knows before the loop winds down
            self._stop.set()

        def reload(signum, frame):
            self._reload = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, reload)

    def _load(self, cfg: AssistantConfig) -> None:
        from personaplex_edge.model_ref import resolve_model

        from ..api import load

        self.status_to("loading the model")
        t0 = time.perf_counter()
        self.model = load(resolve_model(cfg["model"], self.log), device=cfg["device"],
                          threads=cfg["threads"], progress=self.log,
                          persona_cache_dir=cfg["persona.cache_dir"])
        self.model_loads += 1
        self.model.text  # prompts and answers need it: refused now, with the fix
        check_with_model(cfg, self.model)  # named by its config key, not a flag
        self.conv = self.model.open_conversation(cfg.sampling, cfg.persona)
        frames = self.conv.prefill()
        self.log(f"model {self.model.model_dir} loaded in {time.perf_counter() - t0:.1f} s on "
                 f"{', '.join(self.model.runs_on)}; persona: {frames} prompt frames"
                 + (" (from the persona cache)" if self.conv.persona_cached else ""))
        self.gate = IdleGate(self.conv, self.model.text, _policy(cfg), self.emit,
                             self.model.frame_size, self.model.sample_rate)

    def _shutdown(self) -> None:
        if self.control is not None:
            self.control.close()
        s = self.gate.stats if self.gate is not None else None  # None: the load failed
        if s is not None:
            t = self._figures()
            self.log(f"stopped: {t['frames']} frames, {s.lm_frames} stepped by the model, "
                     f"{s.asleep_frames} asleep, {s.sleeps} sleeps, {s.wakes} wakes, "
                     f"{t['dropped_frames']} dropped, {t['underruns']} underruns, "
                     f"{self.device_losses} device losses")
        if self.conv is not None:
            self.conv.close()
        if self.model is not None:
            self.model.close()
        self.notifier.close()

    # -- the devices ------------------------------------------------------------------------------
    def _devices(self) -> None:
        from ..audio_io.devices import refresh_devices, run_on_devices

        cfg = self.config
        while not self._stop.is_set():
            self.loop = None
            try:
                loop = run_on_devices(
                    self.gate, cfg["audio.input_device"], cfg["audio.output_device"],
                    model_rate=self.model.sample_rate, frame_size=self.model.frame_size,
                    on_tick=self._tick, tick_seconds=TICK_SECONDS,
                    max_backlog_frames=cfg["audio.max_backlog_frames"], aec=cfg["audio.aec"],
                    step_metrics=self.conv.metrics, progress=self.log, stop=self._stop,
                    on_open=self._opened, startup_seconds=STARTUP_SECONDS)
                self._close_loop(loop)
            except AudioDeviceError as e:
                self._close_loop(self.loop)
                if self._stop.is_set():
                    break
                self._lost(str(e))
                self._sleep_ticking(cfg["audio.retry_seconds"])
                if not self._stop.is_set():
                    refresh_devices()

    def _opened(self, loop) -> None:
        self.loop = loop  # "open" once its first frame is stepped (_tick)

    def _close_loop(self, loop) -> None:
        """Adds a finished loop's counts to the totals (they survive a device's loss)."""
        if loop is not None and loop is not self._counted:
            self._counted = loop
            for key in self._totals:
                self._totals[key] += getattr(loop.stats, key)
        self.loop = None
        self.devices_open = False

    def _lost(self, reason: str) -> None:
        if self._waiting_since is None:
            self._waiting_since = time.monotonic()
            self.device_losses += self.ready  # a device absent at start is no loss
            self.log(f"device lost: {reason}; waiting for it (looked for every "
                     f"{self.config['audio.retry_seconds']:g} s)")
            self.emit({"event": "device_lost", "reason": reason})
        self.status_to("waiting for a device")

    def _sleep_ticking(self, seconds: float) -> None:
        """Waits for the next retry; the watchdog goes on (waiting is the loop's work now)."""
        end = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < end:
            self.watchdog.beat()
            self._tick(None)
            self._stop.wait(min(TICK_SECONDS, max(0.0, end - time.monotonic())))

    # -- the main thread's tick ---------------------------------------------------------------
    def _tick(self, loop) -> None:
        if loop is not None:
            self.watchdog.beat(self.gate.heartbeat)
            if not self.devices_open and loop.stats.frames > 0:
                self._devices_back()
        self.watchdog.tick()
        if self._reload:
            self._reload = False
            self._reload_config()
        if self.devices_open:
            self.status_to(self.gate.state + (", muted" if self.gate.muted else ""))
        if self.tty and loop is not None:
            t = self._figures()
            print(f"\r\033[K{self._status}: frames {t['frames']}, model "
                  f"{self.gate.stats.lm_frames}, asleep {self.gate.stats.asleep_frames}, "
                  f"dropped {t['dropped_frames']}", end="", flush=True)

    def _devices_back(self) -> None:
        self.devices_open = True
        if self._waiting_since is not None:
            gone = time.monotonic() - self._waiting_since
            self._waiting_since = None
            if self.ready:
                self.log(f"device back after {gone:.1f} s: the conversation goes on")
                self.emit({"event": "device_back", "seconds": round(gone, 2)})
        if not self.ready:
            self.ready = True
            self.log("listening: devices open" + (f", control socket {self.control.path}"
                                                  if self.control else ""))
            self.notifier.ready(self.gate.state)
            self._status = self.gate.state

    def status_to(self, status: str) -> None:
        if status != self._status:
            self._status = status
            self.notifier.status(status)

    # -- reload -----------------------------------------------------------------------------------
    def _reload_config(self) -> None:
        self.notifier.reloading()
        try:
            new = load_config(self.config_path, self.overrides)
            check_with_model(new, self.model)  # what the worker would fail on, refused now
        except ConfigError as e:
            self.emit({"event": "reload_refused", "reason": str(e)})
            self.notifier.ready(self._status)
            return
        changed = new.differs(self.config)
        later = [k for k in changed if k.startswith(NEXT_CONVERSATION_PREFIXES)]
        now = [k for k in changed if k in LIVE_KEYS]
        restart = [k for k in changed if k not in later and k not in now]
        if later:
            self.gate.set_persona(new.persona, new.sampling)
        if now:
            fresh = _policy(new)
            self.gate.policy = replace(self.gate.policy,
                                       sleep_after_frames=fresh.sleep_after_frames,
                                       wake_frames=fresh.wake_frames)
        self.config = AssistantConfig({**new.values, **{k: self.config[k] for k in restart}},
                                      new.source, new.origins)
        self.log(f"reloaded {new.source}: " + ("nothing changed" if not changed else "; ".join(
            part for part in (
                later and "at the next conversation: " + ", ".join(later),
                now and "now: " + ", ".join(now),
                restart and "after a restart (the model stays loaded): " + ", ".join(restart))
            if part)))
        self.emit({"event": "reloaded", "next_conversation": later, "now": now,
                   "restart": restart})
        self.notifier.ready(self._status)

    # -- figures ----------------------------------------------------------------------------------
    def _figures(self) -> dict:
        t = dict(self._totals)
        if self.loop is not None and self.loop is not self._counted:
            for key in t:
                t[key] += getattr(self.loop.stats, key)
        return t

    def status(self) -> dict:
        persona = self.conv.persona
        return {"status": self._status, "devices_open": self.devices_open,
                "device_losses": self.device_losses, "model_loads": self.model_loads,
                "pid": os.getpid(), "uptime_s": round(time.monotonic() - self.started, 1),
                "model": str(self.model.model_dir), "lm_ticks": self.conv.group.metrics.frames,
                "persona": {"text_prompt": persona.text_prompt, "voice": persona.voice},
                "watchdog_pings": self.watchdog.pings, **self._figures(),
                **self.gate.snapshot()}
