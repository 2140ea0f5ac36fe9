"""Noise: aggregating repeats, the keep margin, the goal test. Pure.

A judge's score can wobble between runs of the same snapshot. A candidate is
kept only when its improvement over the best exceeds the margin

    margin = max(abs_margin, rel_margin · |best|, k_sigma · σ)

where σ is the sample standard deviation of the segment's repeated baseline
readings. With every knob at 0 a candidate must be strictly better.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from reel.shared.crucible.config import Direction, NoiseSpec


def aggregate(values: Sequence[float]) -> float:
    """The score of a measurement: the mean of its repeats.

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("no values to aggregate")
    return math.fsum(values) / len(values)


def sigma(values: Sequence[float]) -> float:
    """Sample standard deviation (0.0 with fewer than two values)."""
    return statistics.stdev(values) if len(values) >= 2 else 0.0


def margin(spec: NoiseSpec, best: float, baseline_values: Sequence[float]) -> float:
    """The improvement a candidate must exceed to be kept (judge units, ≥ 0)."""
    return max(spec.abs_margin, spec.rel_margin * abs(best), spec.k_sigma * sigma(baseline_values), 0.0)


def improvement(direction: Direction, score: float, best: float) -> float:
    """How much better ``score`` is than ``best`` (positive = better) under ``direction``."""
    return score - best if direction == "maximize" else best - score


def goal_met(direction: Direction, score: float, goal: float | None) -> bool:
    """True if ``score`` reaches ``goal`` (never, without a goal)."""
    if goal is None:
        return False
    return score >= goal if direction == "maximize" else score <= goal
