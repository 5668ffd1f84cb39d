"""The assistant's configuration: one TOML file, flags on top, every value checked once.

    $XDG_CONFIG_HOME/personaplex-edge/assistant.toml   (else ~/.config/...), or --config FILE

A key is `section.name` (the top-level keys have no section); KEYS below is the whole schema:
each key's type check, default and flag. A file that does not parse, an unknown key (a typo
that would silently do nothing) or a bad value is one ConfigError naming the key and the file
(exit 2). The same table checks flags, so a flag's error names the flag.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from personaplex_edge.contract import DEVICES
from personaplex_edge.errors import ConfigError

from ..audio_io.devices import device_spec
from ..persona import DEFAULT_TEXT_PROMPT, Persona
from ..sampling import SamplingParams
from .vad import ENGINES


def _toml():
    """The TOML parser: the standard library's from 3.11, the `tomli` package it came from on
    3.10 (JetPack 6); imported only when a file is read, so the CLI starts without it."""
    if sys.version_info >= (3, 11):
        import tomllib  # novermin (reached on 3.11 and later only)
        return tomllib
    try:
        import tomli
    except ImportError:
        raise ConfigError("reading the config file needs tomli on Python 3.10: pip install "
                          "'personaplex-edge[assistant]'") from None
    return tomli

Check = Callable[[Any], Any]  # a raw value -> the value to keep; ValueError says what is wrong


def _number(lo: float | None = None, hi: float | None = None, integer: bool = False,
            above: float | None = None) -> Check:
    """A finite number (an integer with `integer`) from `lo` to `hi`, or above `above`: inf and
    nan are refused, so no value makes a timer spin or never fire, or a buffer grow without
    bound."""
    kind = "an integer" if integer else "a number"

    def check(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and
                                                                      isinstance(v, float)):
            raise ValueError(f"expected {kind}")
        if not math.isfinite(v):
            raise ValueError("expected a finite number")
        if above is not None and not v > above:
            raise ValueError(f"expected {kind} above {above}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ValueError(f"expected {kind} from {lo} to {hi}" if hi is not None
                             else f"expected at least {lo}")
        return v
    return check


def _choice(*options) -> Check:
    def check(v):
        if v not in options:
            raise ValueError("expected one of " + ", ".join(map(repr, options)))
        return v
    return check


def _text(v):
    if not isinstance(v, str):
        raise ValueError("expected a string")
    return v


def _optional(check: Check) -> Check:
    """A check that also takes "" (TOML has no null): the default of 'none' (None)."""
    return lambda v: None if v == "" else check(v)


def _boolean(v):
    if not isinstance(v, bool):
        raise ValueError("expected true or false")
    return v


def _device(v):
    """A sound device: an index or part of its name (personaplex-edge devices)."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError("expected a device index or part of its name")
    return device_spec(v)


def _range(lo: int, hi: int) -> Check:
    return _number(lo, hi, integer=True)


_SAMPLING = SamplingParams()  # the defaults, the reference's


@dataclass(frozen=True)
class Key:
    check: Check
    default: Any
    help: str


# section.name -> Key. A new key is one entry here, one field below and (if it has one) a flag.
KEYS: dict[str, Key] = {
    "model": Key(_text, "models/personaplex-7b-v1", "model directory, hub id or built-in name"),
    "device": Key(_choice(*DEVICES), "auto", "where the graphs run"),
    "threads": Key(_optional(_range(1, 1024)), None, "onnxruntime threads"),
    "persona.text_prompt": Key(_text, DEFAULT_TEXT_PROMPT, "the persona's role"),
    "persona.voice": Key(_optional(_text), None, "a voice of the bank or an audio file"),
    "persona.cache_dir": Key(_optional(_text), None, "keep prefilled personas here too"),
    "sampling.seed": Key(_optional(_range(0, 2 ** 63 - 1)), None, "seed of the noise"),
    "sampling.greedy": Key(_boolean, _SAMPLING.greedy, "argmax instead of sampling"),
    "sampling.temp": Key(_number(above=0), _SAMPLING.temp, "audio temperature"),
    "sampling.temp_text": Key(_number(above=0), _SAMPLING.temp_text, "text temperature"),
    # the largest top-k is the model's (checked once it is loaded: check_with_model)
    "sampling.top_k": Key(_number(1, integer=True), _SAMPLING.top_k, "audio top-k"),
    "sampling.top_k_text": Key(_number(1, integer=True), _SAMPLING.top_k_text, "text top-k"),
    "audio.input_device": Key(_optional(_device), None, "microphone: index or part of name"),
    "audio.output_device": Key(_optional(_device), None, "speaker: index or part of name"),
    "audio.aec": Key(_boolean, True, "cancel the speaker's echo (false for a headset)"),
    "audio.max_backlog_frames": Key(_range(0, 1000), 2, "input frames that may wait"),
    "audio.retry_seconds": Key(_number(0.1, 3600), 1.0, "how often a lost device is looked for"),
    "idle.sleep_after": Key(_number(0, 86400), 60.0,
                            "seconds without speech before sleeping; 0 never"),
    "idle.vad": Key(_choice(*ENGINES), "webrtc",
                    "the voice detector (silero: pip install --no-deps silero-vad)"),
    "idle.vad_aggressiveness": Key(_range(0, 3), 3, "webrtcvad's mode (3: least false speech)"),
    "idle.voiced_subframes": Key(_range(1, 4), 2, "20 ms parts of a frame that must be voiced"),
    "idle.vad_threshold": Key(_number(0, 1), 0.5, "silero's score that is speech (0 to 1)"),
    "idle.silero_model": Key(_optional(_text), None, "silero_vad.onnx (default: the package's)"),
    "idle.wake_frames": Key(_range(1, 10), 1, "speech frames in a row that wake the model"),
    "idle.preroll_ms": Key(_range(0, 10000), 320, "audio before the wake the model hears"),
    "control.socket": Key(_optional(_text), "", "the control socket's path ('': the default)"),
    "control.enabled": Key(_boolean, True, "open the control socket"),
}


def config_home() -> Path:
    """$XDG_CONFIG_HOME, else ~/.config: where the config file and the systemd user unit go."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return Path(xdg) if xdg else Path.home() / ".config"


def default_config_path() -> Path:
    return config_home() / "personaplex-edge" / "assistant.toml"


def default_socket_path() -> Path:
    """$XDG_RUNTIME_DIR/personaplex-edge/assistant.sock (a systemd service's RuntimeDirectory
    or a login's /run/user/UID), else a per-user directory under /tmp."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path("/tmp") / f"personaplex-edge-{os.getuid()}"
    return base / "personaplex-edge" / "assistant.sock"


@dataclass(frozen=True)
class AssistantConfig:
    """Every key, checked (KEYS gives each one's meaning and default)."""

    values: Mapping[str, Any]
    source: str  # the file it came from, or "defaults"
    # key -> where its value came from, as an error names it: "FILE: key" or the flag that set
    # it ("--model"); a default's is absent
    origins: Mapping[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def named(self, key: str) -> str:
        return self.origins.get(key, f"{key} (its default)")

    @property
    def persona(self) -> Persona:
        return Persona(text_prompt=self["persona.text_prompt"] or None,
                       voice=self["persona.voice"])

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(temp=self["sampling.temp"], temp_text=self["sampling.temp_text"],
                              top_k=self["sampling.top_k"], top_k_text=self["sampling.top_k_text"],
                              greedy=self["sampling.greedy"], seed=self["sampling.seed"])

    @property
    def socket_path(self) -> Path | None:
        if not self["control.enabled"]:
            return None
        return Path(self["control.socket"]).expanduser() if self["control.socket"] \
            else default_socket_path()

    def differs(self, other: "AssistantConfig") -> list[str]:
        """The keys whose values differ from `other`'s, sorted."""
        return sorted(k for k in KEYS if self[k] != other[k])


def _flatten(table: Mapping, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for name, value in table.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and key not in KEYS:
            flat.update(_flatten(value, key + "."))
        else:
            flat[key] = value
    return flat


def load_config(path: str | Path | None = None,
                overrides: Mapping[str, tuple[str, Any]] | None = None) -> AssistantConfig:
    """The config of `path` (None: the default path, which may be absent), then `overrides`
    (key -> (the flag that set it, value)) on top. Raises ConfigError naming the key."""
    explicit = path is not None
    path = Path(path).expanduser() if explicit else default_config_path()
    raw: dict[str, Any] = {}
    source = "defaults"
    if path.is_file():
        toml = _toml()
        try:
            raw = _flatten(toml.loads(path.read_text(encoding="utf-8")))
        except (toml.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read it: {e}") from None
        source = str(path)
    elif explicit:
        raise ConfigError(f"{path}: no such config file (leave out --config to use "
                          f"{default_config_path()}, which may be absent)")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (the keys: docs/assistant.md; "
                          f"e.g. {', '.join(sorted(KEYS)[:4])}, ...)")
    values = {key: spec.default for key, spec in KEYS.items()}
    origins = {}
    for key, value in raw.items():
        origins[key] = f"{path}: {key}"
        values[key] = _checked(key, value, origins[key])
    for key, (flag, value) in (overrides or {}).items():
        origins[key] = flag
        values[key] = _checked(key, value, flag)
    return AssistantConfig(values, source, origins)


def _checked(key: str, value: Any, where: str) -> Any:
    try:
        return KEYS[key].check(value)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}, got {value!r}") from None
