"""`bench --position N`: a conversation started N frames in, its KV ring full from the context
on, without stepping there (TokenRing.jump)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from personaplex_edge.config import preset
from personaplex_edge.streams import TokenRing


def _frame(ring: TokenRing, t: int) -> tuple[np.ndarray, np.ndarray | None]:
    """One frame of fixed made-up tokens: (the step's input column, the frame emitted)."""
    ring.write_user(np.arange(8)[None] + 10 * t)
    column = ring.step_input()
    ring.write_generated(np.array([t]), np.arange(8)[None] + 100 * t)
    return column, ring.output()


def test_a_jumped_ring_goes_on_as_if_it_had_stepped():
    cfg = preset("tiny")
    stepped, jumped = TokenRing(cfg), TokenRing(cfg)
    for t in range(5):
        _frame(stepped, t), _frame(jumped, t)
    jumped.jump(1003)  # not a multiple of the ring's slots
    assert jumped.position == 1003
    for t in range(5, 12):
        (a, out_a), (b, out_b) = _frame(stepped, t), _frame(jumped, t)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(out_a, out_b)
    with pytest.raises(ValueError, match="cannot go back"):
        jumped.jump(10)
    # a ring that has not stepped yet (no persona) starts there: the same frames as from 0
    fresh, start = TokenRing(cfg), TokenRing(cfg)
    fresh.jump(3000)
    for t in range(4):
        (a, out_a), (b, out_b) = _frame(start, t), _frame(fresh, t)
        np.testing.assert_array_equal(a, b)
        assert (out_a is None) == (out_b is None)
        if out_a is not None:
            np.testing.assert_array_equal(out_a, out_b)


def test_bench_at_a_position_steps_there(demo_model_dir, tmp_path, monkeypatch, capsys):
    from personaplex_edge.cli import main
    from personaplex_edge.runtime.backends.state import BoundGraph

    positions = []
    run = BoundGraph.run

    def recording(self, active=None):
        if "position" in self.inputs:
            positions.append(int(self.inputs["position"][0]))
        return run(self, active)

    monkeypatch.setattr(BoundGraph, "run", recording)
    context = preset("demo").temporal_config.max_position_embeddings  # 500
    assert main(["bench", "--model", str(demo_model_dir), "--frames", "3", "--warmup", "1",
                 "--position", str(2 * context + 7), "--device", "cpu", "--aec", "off",
                 "--json", str(tmp_path / "b.json")]) == 0
    # the persona's frames from 0 (a prefill call, then its last frame as a step), then the
    # conversation's four from the position on
    live = [p for p in positions if p >= context]
    assert live == list(range(2 * context + 7, 2 * context + 11))
    assert json.loads((tmp_path / "b.json").read_text())["position"] == 2 * context + 11
    assert f"position {2 * context + 11} (context {context})" in capsys.readouterr().out
    # inside the persona: refused, with what to do
    assert main(["bench", "--model", str(demo_model_dir), "--frames", "1", "--position", "3",
                 "--device", "cpu", "--aec", "off"]) == 2
    assert "is inside the persona's" in capsys.readouterr().err


def test_fill_rings_writes_every_slot_of_the_rows_only(batch_model_dir):
    """bench --position's stand-in history: every slot of the asked rows, nothing else."""
    from personaplex_edge.manifest import load_model_dir
    from personaplex_edge.runtime.backends import load_graphs

    manifest = load_model_dir(batch_model_dir)
    graph = load_graphs(batch_model_dir, manifest, ["helium_step"], "cpu", 1)["helium_step"]
    helium = graph.bind()
    helium.fill_rings([1], 1.5)
    state = helium.state()
    rings = [r.input_name for r in manifest.graphs["helium_step"].rings]
    assert rings and all((state[n][1] == 1.5).all() for n in rings)
    assert all((state[n][[0, 2]] == 0.0).all() for n in rings)
    helium.close()
