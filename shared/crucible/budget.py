"""Budgets: iterations, active wall time, cost — checked before an iteration starts. Pure.

"Stop before overshooting": the next iteration's worst case must fit. Its cost is
the proposer's declared per-call cap (``proposer.max_cost_usd``) when there is one,
else the most expensive iteration so far (or the configured estimate, whichever is
larger); its time the longest iteration so far (or the estimate). If that could
cross a limit, the run ends with ``LoopExit.BUDGET`` instead of starting it.
Running out of iterations is the run's planned end, ``LoopExit.FINISHED``. What is
left is told to a command proposer (:func:`left`, ``CRUCIBLE_BUDGET_*``).
"""

from __future__ import annotations

from reel.shared.crucible.config import BudgetSpec
from reel.shared.crucible.state import LoopExit, Run


def next_cost_usd(run: Run, spec: BudgetSpec, call_cap_usd: float | None = None) -> float:
    """Worst-case cost of the next iteration (USD): the declared per-call cap, else the estimate."""
    if call_cap_usd is not None:
        return call_cap_usd
    return max([spec.cost_estimate_usd, *(r.cost_usd for r in run.rows)])


def retry_exhausted(run: Run, spec: BudgetSpec, last_call_usd: float,
                    call_cap_usd: float | None = None) -> str | None:
    """Why the cost budget forbids retrying a blocked call, or ``None`` to retry.

    A blocked proposer (a missing resource) is called again within the same iteration, and
    each call is paid: the retry's worst case is the declared per-call cap, else the larger of
    the configured estimate and what the blocked call just cost (``last_call_usd``, USD).
    """
    if spec.cost_usd is None:
        return None
    est = call_cap_usd if call_cap_usd is not None else max(spec.cost_estimate_usd, last_call_usd)
    if run.spent.cost_usd + est <= spec.cost_usd:
        return None
    what = "cap" if call_cap_usd is not None else "≈"
    return f"cost budget: spent ${run.spent.cost_usd:.4f} + a retry {what} ${est:.4f} > ${spec.cost_usd:.4f}"


def judge_retry_exhausted(run: Run, spec: BudgetSpec, last_call_usd: float) -> str | None:
    """Why the cost budget forbids measuring again after an unavailable judge, or ``None`` to retry.

    An unavailable judge's call may still be paid (a lab batch's runs that did start, a command judge's
    ``cost_usd``): its retry's worst case is what that call just cost (``last_call_usd``, USD). A judge that
    costs nothing is retried until the block gate's ``max_block_s``.
    """
    if spec.cost_usd is None or last_call_usd <= 0 or run.spent.cost_usd + last_call_usd <= spec.cost_usd:
        return None
    return (f"cost budget: spent ${run.spent.cost_usd:.4f} + a judge retry ≈ ${last_call_usd:.4f} > "
            f"${spec.cost_usd:.4f}")


def next_wall_ms(run: Run, spec: BudgetSpec) -> int:
    """Estimated active wall time of the next iteration (ms)."""
    return max([int(spec.wall_estimate_s * 1000), *(r.wall_ms for r in run.rows)])


def left(run: Run, spec: BudgetSpec) -> dict[str, str]:
    """What is left before the next iteration, as a proposer's environment.

    ``CRUCIBLE_BUDGET_ITERATIONS`` (this one included), ``CRUCIBLE_BUDGET_COST_USD`` (USD)
    and ``CRUCIBLE_BUDGET_WALL_S`` (active seconds); a limit not configured is ``""``.
    """
    cost = "" if spec.cost_usd is None else f"{max(0.0, spec.cost_usd - run.spent.cost_usd):.6f}"
    wall = "" if spec.wall_s is None else f"{max(0.0, spec.wall_s - run.active_ms / 1000):.3f}"
    return {"CRUCIBLE_BUDGET_ITERATIONS": str(max(0, spec.iterations - run.spent.iterations)),
            "CRUCIBLE_BUDGET_COST_USD": cost, "CRUCIBLE_BUDGET_WALL_S": wall}


def exhausted(run: Run, spec: BudgetSpec, call_cap_usd: float | None = None) -> tuple[LoopExit, str] | None:
    """The budget exit due before the next iteration, with its reason, or ``None`` to go on.

    Args:
        call_cap_usd: the proposer's declared per-call cap (USD), if any: the worst case of the next call.
    """
    if run.spent.iterations >= spec.iterations:
        return LoopExit.FINISHED, f"iteration budget used ({run.spent.iterations}/{spec.iterations})"
    if spec.cost_usd is not None:
        est = next_cost_usd(run, spec, call_cap_usd)
        if run.spent.cost_usd >= spec.cost_usd or run.spent.cost_usd + est > spec.cost_usd:
            what = "cap" if call_cap_usd is not None else "≈"
            return LoopExit.BUDGET, (f"cost budget: spent ${run.spent.cost_usd:.4f} + next {what} ${est:.4f} "
                                     f"> ${spec.cost_usd:.4f}")
    if spec.wall_s is not None:
        limit_ms = int(spec.wall_s * 1000)
        est_ms = next_wall_ms(run, spec)
        if run.active_ms >= limit_ms or run.active_ms + est_ms > limit_ms:
            return LoopExit.BUDGET, (f"time budget: active {run.active_ms / 1000:.2f}s + next ≈ "
                                     f"{est_ms / 1000:.2f}s > {spec.wall_s:.2f}s")
    return None
