"""Errors a user can act on. The CLI prints their message alone and exits non-zero."""


class PersonaPlexError(Exception):
    """Base of every error whose message tells the user what to fix."""

    exit_code = 2


class ConfigError(PersonaPlexError):
    """A config that is malformed or disagrees with the weights."""


class CheckpointError(PersonaPlexError):
    """A checkpoint file that is missing, unreadable, or holds the wrong tensors."""


class ModelDirError(PersonaPlexError):
    """An exported model directory that is missing, incomplete, tampered with or foreign."""


class AudioError(PersonaPlexError):
    """Audio input that cannot be used: unreadable, empty, non-finite, wrong rate."""


class StateError(PersonaPlexError):
    """A state buffer fed to a graph with the wrong name, shape or dtype."""


class AudioDeviceError(PersonaPlexError):
    """A sound device that does not exist, cannot be opened, or vanished mid-session."""


class VoiceError(PersonaPlexError):
    """A voice prompt that is not in the model's voice bank (or a bank that is missing)."""
