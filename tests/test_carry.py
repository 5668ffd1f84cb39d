"""scripts/gpu/carry.py: a file cut into pieces that each fit one transfer to an offline GPU
machine, and joined there only when every piece and the whole are as they were cut."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "gpu"))

from carry import join, split, wrong_pieces  # noqa: E402


@pytest.fixture
def big(tmp_path) -> Path:
    path = tmp_path / "some.whl"
    path.write_bytes(os.urandom(2_500_000))
    return path


def test_pieces_fit_and_join_into_the_same_bytes(big, tmp_path):
    record = split(big, tmp_path / "pieces", piece_bytes=1 << 20)
    sizes = [p.stat().st_size for p in sorted((tmp_path / "pieces").glob("some.whl.part-*"))]
    assert sizes == [1 << 20, 1 << 20, 2_500_000 - 2 * (1 << 20)]
    assert len(record["pieces"]) == 3
    there = tmp_path / "there"
    there.mkdir()
    (there / "some.whl.pieces.json").write_bytes((tmp_path / "pieces" / "some.whl.pieces.json")
                                                 .read_bytes())
    for n in range(3):  # one piece a transfer
        assert [w.split()[0] for w in wrong_pieces(there, "some.whl")] == \
            [f"some.whl.part-{k:02d}" for k in range(n, 3)]
        name = f"some.whl.part-{n:02d}"
        (there / name).write_bytes((tmp_path / "pieces" / name).read_bytes())
    out = join(there, "some.whl", tmp_path / "joined.whl")
    assert out.read_bytes() == big.read_bytes()


def test_a_damaged_or_missing_piece_is_named_and_nothing_is_written(big, tmp_path):
    split(big, tmp_path / "p", piece_bytes=1 << 20)
    piece = tmp_path / "p" / "some.whl.part-01"
    data = bytearray(piece.read_bytes())
    data[100] ^= 1
    piece.write_bytes(bytes(data))
    (tmp_path / "p" / "some.whl.part-02").unlink()
    with pytest.raises(SystemExit) as e:
        join(tmp_path / "p", "some.whl", tmp_path / "joined.whl")
    assert "part-01 is damaged" in str(e.value) and "part-02 is missing" in str(e.value)
    assert not list(tmp_path.glob("joined.whl*"))
