"""A file too big for one transfer to an offline GPU machine (where files reach it only in
transfers of limited size, the checkout included), cut into pieces that travel over successive
transfers and joined there, every piece and the whole checked by sha256.

    python3 scripts/gpu/carry.py split FILE DIR [--piece-mib 60]   # here: DIR/NAME.part-NN, DIR/NAME.pieces.json
    python3 scripts/gpu/carry.py check DIR NAME                    # there: which pieces are still to come
    python3 scripts/gpu/carry.py join DIR NAME OUT                 # there: OUT, or exit 1 naming what is missing or wrong

Pieces that arrived with earlier transfers stay where they are, so each transfer brings one more
piece; `check` and `join` say which are still missing. Standard library only: it runs under
whatever python3 the GPU machine has.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

CHUNK = 1 << 20


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def split(file: Path, out: Path, piece_bytes: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    pieces = []
    with open(file, "rb") as f:
        for n in range(-(-file.stat().st_size // piece_bytes)):
            piece = out / f"{file.name}.part-{n:02d}"
            piece.write_bytes(f.read(piece_bytes))
            pieces.append({"name": piece.name, "bytes": piece.stat().st_size,
                           "sha256": sha256(piece)})
    record = {"name": file.name, "bytes": file.stat().st_size, "sha256": sha256(file),
              "pieces": pieces}
    (out / f"{file.name}.pieces.json").write_text(json.dumps(record, indent=1))
    return record


def _record(folder: Path, name: str) -> dict:
    path = folder / f"{name}.pieces.json"
    if not path.is_file():
        raise SystemExit(f"no {path}: carry it with the first piece")
    return json.loads(path.read_text())


def wrong_pieces(folder: Path, name: str) -> list[str]:
    """Every piece of `name` that is not in `folder` as it was cut, said why."""
    wrong = []
    for p in _record(folder, name)["pieces"]:
        piece = folder / p["name"]
        if not piece.is_file():
            wrong.append(f"{p['name']} is missing")
        elif piece.stat().st_size != p["bytes"] or sha256(piece) != p["sha256"]:
            wrong.append(f"{p['name']} is damaged (size or sha256)")
    return wrong


def join(folder: Path, name: str, out: Path) -> Path:
    """The pieces of `name` in `folder`, checked and joined into `out`; SystemExit naming every
    piece that is missing or damaged."""
    record = _record(folder, name)
    wrong = wrong_pieces(folder, name)
    if wrong:
        raise SystemExit(f"cannot join {name}: " + "; ".join(wrong))
    partial = out.with_name(out.name + ".partial")
    with open(partial, "wb") as f:
        for p in record["pieces"]:
            f.write((folder / p["name"]).read_bytes())
    if sha256(partial) != record["sha256"]:
        partial.unlink()
        raise SystemExit(f"cannot join {name}: the joined file's sha256 is not the original's")
    partial.replace(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("split")
    s.add_argument("file", type=Path)
    s.add_argument("dir", type=Path)
    s.add_argument("--piece-mib", type=float, default=60)
    c = sub.add_parser("check")
    c.add_argument("dir", type=Path)
    c.add_argument("name")
    j = sub.add_parser("join")
    j.add_argument("dir", type=Path)
    j.add_argument("name")
    j.add_argument("out", type=Path)
    args = ap.parse_args()
    if args.verb == "split":
        record = split(args.file, args.dir, int(args.piece_mib * (1 << 20)))
        print(f"{record['name']}: {len(record['pieces'])} pieces in {args.dir}")
    elif args.verb == "check":
        wrong = wrong_pieces(args.dir, args.name)
        total = len(_record(args.dir, args.name)["pieces"])
        print(f"{args.name}: {total - len(wrong)} of {total} pieces here" +
              "".join(f"\n  {w}" for w in wrong))
    else:
        print(join(args.dir, args.name, args.out))


if __name__ == "__main__":
    sys.exit(main())
