"""The score plot: every fate that has no score is still marked in the legend, iteration
ticks are integers, the goal line, direction and unit are shown."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from reel.services.crucible.report import plot_png, score_figure
from reel.shared.crucible.events import IterationClosed, SegmentOpened, SessionStarted
from reel.shared.crucible.fold import SessionState, apply
from reel.shared.crucible.state import Fate, Reading, Row
from tests.crucible.fixtures import make_config


def session(root: Path) -> SessionState:
    cfg = make_config(root, root / "src", [], goal=3.5,
                      judge={"command": ["x"], "direction": "minimize", "unit": "tokens"})
    state = apply(None, 1, SessionStarted(session_id="s", config=cfg, base_sha="b", world_dir="w", protected=(),
                                          at_ms=0))
    state = apply(state, 2, SegmentOpened(regime="main", reason="baseline", fingerprint="f", fingerprint_parts={},
                                          reading=Reading(values=(5.0,), score=5.0), snap="b", wall_ms=1, at_ms=1))
    fates = [(Fate.KEEP, 4.0), (Fate.DISCARD, 4.5), (Fate.INVALID, None), (Fate.DENIED, None),
             (Fate.ABANDONED, None), (Fate.SKIP, None), (Fate.KEEP, 3.8), (Fate.INVALID, None)]
    best = 5.0
    for it, (fate, score) in enumerate(fates, start=1):
        if fate is Fate.KEEP and score is not None:
            best = score
        row = Row(it=it, regime="main", verdict=fate, score=score, best_score=best,
                  delta=None if score is None else score - best, kept_sha=f"k{it}" if fate is Fate.KEEP else None,
                  readings=(score,) if score is not None else ())
        state = apply(state, 2 + it, IterationClosed(row=row, at_ms=it))
    return state


def test_the_plot_marks_every_fate_and_shows_goal_direction_unit_and_integer_ticks(tmp_path: Path) -> None:
    state = session(tmp_path)
    fig = score_figure(state)
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels.count("invalid") == 1  # two invalid iterations, one legend entry
        for label in ("kept", "discarded", "invalid", "denied", "abandoned", "best", "goal 3.5"):
            assert label in labels, labels
        assert ax.get_ylabel() == "score (tokens) — minimize, lower is better"
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)
        assert any(abs(line.get_ydata()[0] - 3.5) < 1e-9 for line in ax.get_lines() if line.get_label() == "goal 3.5")
    finally:
        plt.close(fig)
    png = tmp_path / "score.png"
    plot_png(state, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
