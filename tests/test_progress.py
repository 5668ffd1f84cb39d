"""The progress of a long step (personaplex_edge/progress.py): a bar on a terminal, plain lines
at an interval elsewhere, both saying done / total, rate and time left."""

from __future__ import annotations

import io

from personaplex_edge.progress import Meter, clock


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_bar_redrawn_in_place_and_cleared(monkeypatch):
    import personaplex_edge.progress as progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    screen, said = _Terminal(), []
    meter = Meter("model.onnx.data", 4_000_000_000, said.append, stream=screen)
    for _ in range(4):
        now[0] += 1.0
        meter.advance(1_000_000_000)
    meter.close()
    frames = screen.getvalue().split("\r\033[K")
    assert said == []  # nothing in the log on a terminal
    assert frames[1].startswith("[######------------------] model.onnx.data: 1.00 / 4.00 GB")
    assert "1000 MB/s, 0:01 elapsed, 0:03 left" in frames[1]
    assert frames[4].startswith("[########################] model.onnx.data: 4.00 / 4.00 GB")
    assert frames[-1] == ""  # the bar is gone at the end


def test_a_log_gets_a_line_per_interval(monkeypatch):
    import personaplex_edge.progress as progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    said = []
    meter = Meter("x", 100_000_000_000, said.append, stream=io.StringIO(), interval=10.0)
    for _ in range(25):  # a step every 2 s: a line every 5 steps
        now[0] += 2.0
        meter.advance(2_000_000_000)
    assert len(said) == 5
    assert said[0].strip() == "x: 10.00 / 100.00 GB, 1000 MB/s, 0:10 elapsed, 1:30 left"
    assert said[-1].strip() == "x: 50.00 / 100.00 GB, 1000 MB/s, 0:50 elapsed, 0:50 left"
    assert clock(3725) == "1:02:05" and clock(65) == "1:05"
