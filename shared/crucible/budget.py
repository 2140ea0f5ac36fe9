"""Budgets: iterations, active wall time, cost — checked before an iteration starts (issue 4). Pure.

"Stop before overshooting": the next iteration is assumed to cost as much and take
as long as the most expensive / longest one so far (or the configured estimate,
whichever is larger). If that could cross a limit, the run ends with
``LoopExit.BUDGET`` instead of starting it. Running out of iterations is the
run's planned end, ``LoopExit.FINISHED``.
"""

from __future__ import annotations

from shared.crucible.config import BudgetSpec
from shared.crucible.state import LoopExit, Run


def next_cost_usd(run: Run, spec: BudgetSpec) -> float:
    """Estimated cost of the next iteration (USD)."""
    return max([spec.cost_estimate_usd, *(r.cost_usd for r in run.rows)])


def next_wall_ms(run: Run, spec: BudgetSpec) -> int:
    """Estimated active wall time of the next iteration (ms)."""
    return max([int(spec.wall_estimate_s * 1000), *(r.wall_ms for r in run.rows)])


def exhausted(run: Run, spec: BudgetSpec) -> tuple[LoopExit, str] | None:
    """The budget exit due before the next iteration, with its reason, or ``None`` to go on."""
    if run.spent.iterations >= spec.iterations:
        return LoopExit.FINISHED, f"iteration budget used ({run.spent.iterations}/{spec.iterations})"
    if spec.cost_usd is not None:
        est = next_cost_usd(run, spec)
        if run.spent.cost_usd >= spec.cost_usd or run.spent.cost_usd + est > spec.cost_usd:
            return LoopExit.BUDGET, (f"cost budget: spent ${run.spent.cost_usd:.4f} + next ≈ ${est:.4f} "
                                     f"> ${spec.cost_usd:.4f}")
    if spec.wall_s is not None:
        limit_ms = int(spec.wall_s * 1000)
        est_ms = next_wall_ms(run, spec)
        if run.active_ms >= limit_ms or run.active_ms + est_ms > limit_ms:
            return LoopExit.BUDGET, (f"time budget: active {run.active_ms / 1000:.2f}s + next ≈ "
                                     f"{est_ms / 1000:.2f}s > {spec.wall_s:.2f}s")
    return None
