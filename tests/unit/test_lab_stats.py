"""Wilson intervals against published values and their edge cases."""

from __future__ import annotations

import pytest

from reel.shared.core.lab.stats import pass_rate, wilson


def test_wilson_matches_the_published_value_for_7_of_10() -> None:
    # Wilson's 95 % interval for 7/10 is [0.3968, 0.8922] (e.g. Newcombe 1998, table I).
    low, high = wilson(7, 10)
    assert low == pytest.approx(0.3968, abs=1e-4)
    assert high == pytest.approx(0.8922, abs=1e-4)


def test_the_interval_stays_inside_0_and_1_at_the_extremes() -> None:
    low0, high0 = wilson(0, 20)
    low20, high20 = wilson(20, 20)
    assert low0 == 0.0 and 0.0 < high0 < 0.2
    assert high20 == 1.0 and 0.8 < low20 < 1.0
    assert wilson(0, 206)[0] == 0.0 and wilson(206, 206)[1] == 1.0  # exact, not 1e-18 / 0.9999999999999999


def test_no_runs_means_nothing_is_known_and_bad_counts_are_refused() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="0 <= passes <= runs"):
        wilson(3, 2)
    with pytest.raises(ValueError):
        wilson(-1, 2)


def test_pass_rate_renders_percentages() -> None:
    rate = pass_rate(7, 10)
    assert rate.rate == pytest.approx(0.7)
    assert rate.render() == "7/10 = 70.0 % [39.7–89.2 %]"
    assert pass_rate(0, 0).render().startswith("0/0")
