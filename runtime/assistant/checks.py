"""What a config asks of the machine and of the model, checked where it can be first: the
machine's part before the model loads (at start and by --install-unit, so a unit that would
fail is not written), the model's part once it is loaded (at start, and before a SIGHUP reload
is accepted). Each failure is one ConfigError naming the key and where its value came from.

    before loading   the model names a directory, a built-in or a hub id; a voice file exists;
                     the voice detector and its model file are there; the control socket's
                     path can hold a socket
    with the model   the voice is in the model's bank; top-k within the graphs' largest;
                     temperatures above 0
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from personaplex_edge.errors import ConfigError, PersonaPlexError

from .config import AssistantConfig

if TYPE_CHECKING:
    from ..api import Model


def _refused(cfg: AssistantConfig, key: str, reason: object) -> ConfigError:
    return ConfigError(f"{cfg.named(key)}: {reason}")


def check_before_loading(cfg: AssistantConfig) -> None:
    from personaplex_edge.model_ref import model_kind

    from ..persona import is_voice_file
    from .control import check_socket_path
    from .vad import voice_detector

    try:
        model_kind(cfg["model"])
    except PersonaPlexError as e:
        raise _refused(cfg, "model", e) from None
    voice = cfg["persona.voice"]
    if is_voice_file(voice) and not Path(voice).is_file():
        raise _refused(cfg, "persona.voice", f"no audio file {voice}")
    try:  # the detector the gate will make: its package, and silero's model file
        voice_detector(cfg["idle.vad"], cfg["idle.vad_aggressiveness"],
                       cfg["idle.voiced_subframes"], cfg["idle.vad_threshold"],
                       cfg["idle.silero_model"])
    except PersonaPlexError as e:
        raise _refused(cfg, "idle.vad", e) from None
    if cfg.socket_path is not None:
        try:
            check_socket_path(cfg.socket_path)
        except PersonaPlexError as e:
            raise _refused(cfg, "control.socket", e) from None


def check_with_model(cfg: AssistantConfig, model: "Model") -> None:
    from ..persona import voice_identity

    try:
        cfg.sampling.check(*model.top_k_max, name=lambda field: cfg.named(f"sampling.{field}"))
    except PersonaPlexError as e:
        raise ConfigError(str(e)) from None
    try:
        voice_identity(model.loaded, cfg.persona)  # a bank name, or a readable recording
    except PersonaPlexError as e:
        raise _refused(cfg, "persona.voice", e) from None
