"""What `personaplex-edge verify` found: one `Finding` per check, gathered in a `Report` that
prints as lines and writes as JSON (--json). Shared by the torch-free checks (runtime/verify.py)
and the checks against a checkpoint (export/check_export.py)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Finding:
    check: str  # "sha256", "signature", "torch", "config"
    target: str  # the file or graph it is about
    ok: bool
    detail: str = ""
    measured: dict[str, Any] | None = None  # what a comparison measured (verify_step's figures)

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.check:9s} {self.target}" + (
            f": {self.detail}" if self.detail else "")


@dataclass
class Report:
    model: str  # as named on the command line
    directory: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)

    def failures(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "directory": self.directory, "ok": self.ok,
                           "findings": [asdict(f) for f in self.findings]}, indent=2)
