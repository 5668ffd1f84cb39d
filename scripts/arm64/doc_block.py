"""The shell block a document marks for the aarch64 lane, so the lane runs the very lines a user
reads: the first ```bash block after a line `<!-- arm64-lane: NAME -->`.

    python3 scripts/arm64/doc_block.py docs/jetson.md board-install    # its lines, one a line

Continuation lines (ending in a backslash) are joined; comments and blank lines are dropped.
Runs on any Python 3 with nothing installed (the host, before its venv exists).
"""

from __future__ import annotations

import sys
from pathlib import Path


def block(text: str, name: str) -> list[str]:
    lines = text.splitlines()
    marker = f"<!-- arm64-lane: {name} -->"
    try:
        at = next(i for i, line in enumerate(lines) if line.strip() == marker)
        start = next(i for i in range(at + 1, len(lines)) if lines[i].strip() == "```bash")
        end = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "```")
    except StopIteration:
        raise SystemExit(f"no ```bash block after '{marker}'") from None
    commands, pending = [], ""
    for line in lines[start + 1:end]:
        line = pending + line.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


if __name__ == "__main__":
    print("\n".join(block(Path(sys.argv[1]).read_text(), sys.argv[2])))
