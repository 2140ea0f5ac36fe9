"""Pass rates with confidence intervals: the figures a lab and crucible's `lab:` judge report.

A pass rate is `passes / runs` over runs each judged pass or not (a run with no verdict is
not counted as a run; callers decide which runs count). Its interval is Wilson's score
interval, which stays inside [0, 1] and is sane at 0 and n passes, unlike the normal
approximation. `z = 1.96` gives the 95 % interval.
"""

from __future__ import annotations

import math

import msgspec

Z_95 = 1.959963984540054
"""The two-sided 95 % quantile of the standard normal distribution."""


class PassRate(msgspec.Struct, frozen=True):
    """`passes` of `runs` passed; `low`..`high` the Wilson interval of `rate` at `confidence`.

    With `runs == 0` the rate is undefined: `rate` is 0.0 and the interval is the whole
    [0, 1] (nothing is known).
    """

    passes: int
    runs: int
    rate: float
    low: float
    high: float
    confidence: float = 0.95

    def render(self) -> str:
        """E.g. `7/10 = 70.0 % [39.7–89.2 %]` (percent, one decimal)."""
        if self.runs == 0:
            return "0/0 = – [0.0–100.0 %]"
        return (
            f"{self.passes}/{self.runs} = {100 * self.rate:.1f} % "
            f"[{100 * self.low:.1f}–{100 * self.high:.1f} %]"
        )


def wilson(passes: int, runs: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval `(low, high)` for `passes` successes in `runs` trials.

    Raises ValueError when `runs < 0`, `passes < 0` or `passes > runs`. `runs == 0` gives
    `(0.0, 1.0)`.
    """
    if runs < 0 or passes < 0 or passes > runs:
        raise ValueError(f"a pass rate needs 0 <= passes <= runs, got {passes} of {runs}")
    if runs == 0:
        return 0.0, 1.0
    p = passes / runs
    z2 = z * z
    denominator = 1.0 + z2 / runs
    centre = (p + z2 / (2 * runs)) / denominator
    half = (z / denominator) * math.sqrt(p * (1.0 - p) / runs + z2 / (4 * runs * runs))
    low = 0.0 if passes == 0 else max(0.0, centre - half)  # exact at the ends (no 1e-18 or 0.9999…)
    high = 1.0 if passes == runs else min(1.0, centre + half)
    return low, high


def pass_rate(passes: int, runs: int) -> PassRate:
    """The pass rate of `passes` in `runs` with its 95 % Wilson interval (errors as `wilson`)."""
    low, high = wilson(passes, runs)
    rate = passes / runs if runs else 0.0
    return PassRate(passes=passes, runs=runs, rate=rate, low=low, high=high)
