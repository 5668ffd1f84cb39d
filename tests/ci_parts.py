"""What a skip may mean in CI. `.ci/run` installs every part the tests use (scripts/install.sh:
PulseAudio, systemd, chromium, nginx, libogg, node, silero's model, the side venvs' packages...)
and sets PERSONAPLEX_CI=1; there a test that skips fails instead (conftest.py), so a part that
went missing cannot pass unseen. A skip that no install can mend - no GPU on the machine,
TensorRT present where a test is of a machine without it, no root for a private mount
namespace - says so with `not_installable(reason)` and stays a skip, its reason shown."""

from __future__ import annotations

CI_ENV = "PERSONAPLEX_CI"
NOT_INSTALLABLE = "not installable: "


def not_installable(reason: str) -> str:
    """A skip reason that CI keeps as a skip."""
    return NOT_INSTALLABLE + reason
