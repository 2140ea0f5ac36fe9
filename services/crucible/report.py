"""Rendering a session: rich table, TSV, JSON and a PNG of score over iterations."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from rich.markup import escape
from rich.table import Table

from reel.shared.core.lab.stats import PassRate, pass_rate
from reel.shared.crucible.config import SessionConfig
from reel.shared.crucible.fold import SessionState
from reel.shared.crucible.state import Fate, Row

TSV_COLUMNS = ("it", "regime", "verdict", "readings", "score", "delta", "best", "sha", "kept_sha", "cost_usd",
               "wall_ms", "note", "reason")
_STYLE = {Fate.KEEP: "bold green", Fate.DISCARD: "yellow", Fate.INVALID: "red", Fate.DENIED: "red",
          Fate.FAILED: "red", Fate.ESCALATED: "bold red", Fate.ABANDONED: "magenta", Fate.SKIP: "dim"}


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"


def _readings(r: Row) -> str:
    return ",".join("∅" if v is None else f"{v:.6g}" for v in r.readings)


def _note(r: Row) -> str:
    reason = r.reason if r.verdict is not Fate.DISCARD else ""
    return " — ".join(p for p in (r.note, reason) if p)


def _delta(x: float | None) -> str:
    return "" if x is None else f"{x:+.6g}"


def lab_pass_rate(config: SessionConfig, regime: str, values: Sequence[float | None]) -> PassRate | None:
    """The pooled pass rate of a ``lab`` regime's readings ``values`` (each the rate of ``lab.runs`` runs) with its
    95 % interval; ``None`` for a command judge's regime or no valid value."""
    names = {r.name: r for r in config.regimes}
    lab = names[regime].judge.lab if regime in names else None
    valid = [v for v in values if v is not None]
    if lab is None or not valid:
        return None
    return pass_rate(sum(round(v * lab.runs) for v in valid), lab.runs * len(valid))


def rows_table(state: SessionState) -> Table:
    """The rows as a rich table: iteration, verdict, readings, score, delta, kept sha (and, for a ``lab`` judge,
    the candidate's pooled pass rate with its 95 % interval)."""
    config = state.started.config
    labs = any(r.judge.lab is not None for r in config.regimes)
    title = f"crucible session {state.session_id} — {config.name}"
    t = Table(title=title, show_lines=False)
    for col, just in (("it", "right"), ("regime", "left"), ("verdict", "left"), ("readings", "left"),
                      ("score", "right"), ("delta", "right"), ("best", "right"), ("kept sha", "left")):
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    if labs:
        t.add_column("pass rate [95 %]", no_wrap=True)
    t.add_column("note / reason", overflow="fold")
    for r in state.run.rows if state.run else ():
        cells = [str(r.it), r.regime, f"[{_STYLE.get(r.verdict, '')}]{r.verdict.value}[/]", _readings(r),
                 _num(r.score), _delta(r.delta), _num(r.best_score), (r.kept_sha or "")[:12]]
        if labs:
            rate = lab_pass_rate(config, r.regime, r.readings)
            cells.append(rate.render() if rate is not None else "")
        t.add_row(*cells, escape(_note(r)[:200]))
    return t


def summary(state: SessionState) -> str:
    """One line: exit (code), best score and snapshot, spend."""
    run = state.run
    ended = state.ended
    head = f"exit: {ended.exit.value} ({ended.exit.exit_code}) — {ended.reason}" if ended else "exit: (running)"
    if run is None:
        return head
    seg = run.segment
    rates = [lab_pass_rate(state.started.config, seg.regime, vs) for vs in (
        seg.baseline_readings, seg.best_readings[seg.best_selecting:] or seg.best_readings)]
    if rates[0] is not None and rates[1] is not None:
        head += f"\npass rate: baseline {rates[0].render()} → best {rates[1].render()}"
    return (f"{head}\nregime {seg.regime}: baseline {seg.baseline_score:.6g} → best {seg.best_score:.6g} at "
            f"{seg.best_snap[:12]}; {run.spent.iterations} iterations, {len(run.kept_shas)} kept, "
            f"${run.spent.cost_usd:.4f}, active {run.active_ms / 1000:.1f}s, parked "
            f"{run.parked_total.total_seconds():.1f}s")


def to_tsv(rows: Sequence[Row]) -> str:
    """Rows as tab-separated values with a header line."""
    out = io.StringIO()
    out.write("\t".join(TSV_COLUMNS) + "\n")
    for r in rows:
        cells = (str(r.it), r.regime, r.verdict.value, _readings(r), _num(r.score), _delta(r.delta),
                 _num(r.best_score), r.sha or "", r.kept_sha or "", f"{r.cost_usd:.6g}", str(r.wall_ms), r.note,
                 r.reason)
        out.write("\t".join(c.replace("\t", " ").replace("\n", " ") for c in cells) + "\n")
    return out.getvalue()


def to_json(state: SessionState) -> bytes:
    """The session as JSON: id, config, rows, the ``Run`` and (if ended) its ``SessionOutcome``."""
    run = state.run
    doc = {
        "session_id": state.session_id, "lsn": state.lsn, "config": state.started.config,
        "base_sha": state.started.base_sha, "world_dir": state.started.world_dir,
        "rows": run.rows if run else [], "run": run,
        "outcome": run.outcome() if run is not None and run.exit is not None else None,
        "ended": state.ended,
    }
    return msgspec.json.format(msgspec.json.encode(doc), indent=2)


def score_figure(state: SessionState) -> Any:
    """The score plot as a matplotlib figure (see :func:`plot_png`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = state.run.rows if state.run else ()
    cfg = state.started.config
    regime = cfg.regime(state.run.segment.regime) if state.run else cfg.regimes[0]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    measured = [r for r in rows if r.score is not None]
    kept = [r for r in measured if r.verdict is Fate.KEEP]
    other = [r for r in measured if r.verdict is not Fate.KEEP]
    ax.scatter([r.it for r in other], [r.score or 0.0 for r in other], color="tab:gray", label="discarded", zorder=2)
    ax.scatter([r.it for r in kept], [r.score or 0.0 for r in kept], color="tab:green", label="kept", zorder=3)
    for fate, color, style in ((Fate.INVALID, "tab:red", "-"), (Fate.ABANDONED, "tab:purple", "--"),
                               (Fate.DENIED, "tab:orange", ":")):
        marked = [r.it for r in rows if r.verdict is fate]
        for i, it in enumerate(marked):  # one legend entry per kind, however many iterations it marks
            ax.axvline(it, color=color, ls=style, alpha=0.35, lw=1.2, label=fate.value if i == 0 else None)
    start = 0.0
    if rows:
        first = rows[0]
        start = first.score - first.delta if first.score is not None and first.delta is not None else first.best_score
        ax.step([0] + [r.it for r in rows], [start] + [r.best_score for r in rows], where="post", color="tab:blue",
                label="best", zorder=1)
    if regime.goal is not None:
        ax.axhline(regime.goal, color="tab:green", ls="--", lw=1, alpha=0.7, label=f"goal {regime.goal:g}")
    if rows:
        _clip_outliers(ax, [start] + [r.best_score for r in rows] + ([regime.goal] if regime.goal is not None else []),
                       [r.it for r in measured], [r.score or 0.0 for r in measured])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    unit = f" ({regime.judge.unit})" if regime.judge.unit else ""
    better = "higher is better" if regime.judge.direction == "maximize" else "lower is better"
    ax.set_ylabel(f"score{unit} — {regime.judge.direction}, {better}")
    ax.set_title(f"{cfg.name} — {state.session_id}")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    return fig


def plot_png(state: SessionState, path: Path) -> None:
    """Score over iterations: every measured row (kept ones green), the best-so-far as a step line, the
    goal line; invalid, abandoned and denied iterations as marked verticals; integer iteration ticks;
    the y label names the unit and the direction."""
    import matplotlib.pyplot as plt

    fig = score_figure(state)
    fig.savefig(path)
    plt.close(fig)


def _clip_outliers(ax: Any, best: list[float], its: list[int], scores: list[float]) -> None:
    """Keep the best-so-far curve readable: far-off readings are drawn as arrows at the edge."""
    lo, hi = min(best), max(best)
    pad = max(3 * (hi - lo), 0.02 * max(abs(lo), abs(hi)), 1e-9)
    bottom, top = lo - pad, hi + pad
    if all(bottom <= y <= top for y in scores):
        return
    ax.set_ylim(bottom, top)
    above = [i for i, y in zip(its, scores, strict=True) if y > top]
    below = [i for i, y in zip(its, scores, strict=True) if y < bottom]
    ax.scatter(above, [top] * len(above), marker="^", color="tab:gray", clip_on=False, label="off chart")
    ax.scatter(below, [bottom] * len(below), marker="v", color="tab:gray", clip_on=False)
