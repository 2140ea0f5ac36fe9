"""The fault suite's ledger and its one-line terminal summary.

Every scenario in ``tests/faults`` is marked ``faults`` (``pytestmark``) and, after
its checks ran, records what it saw in the session's :class:`FaultsLedger` — also
when a check is about to fail, so the summary counts honestly::

    counts = await check_all(...)          # tests/faults/checks.py
    faults_ledger.record("executor_kill_before_intent", counts.runs, counts.lost,
                         counts.stuck, counts.unrecorded)
    counts.assert_clean()

When any scenario recorded, pytest's terminal summary (also under ``-q``) ends with
exactly one line::

    faults: 7 scenarios, 230 runs, 0 lost, 0 stuck, 0 unrecorded side effects
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

_LEDGER = pytest.StashKey["FaultsLedger"]()


@dataclass(frozen=True)
class ScenarioRecord:
    """One scenario's counts.

    Attributes:
        scenario: the scenario's name (unique in the session; a second record replaces the first).
        runs: acked starts the scenario checked.
        lost: acked starts that did not complete exactly once (never, or twice).
        stuck: runs not at rest within the scenario's bound (or an attempt left dispatched).
        unrecorded: side-effect lines with no matching attempt in the log.
    """

    scenario: str
    runs: int
    lost: int
    stuck: int
    unrecorded: int


@dataclass
class FaultsLedger:
    """The session's scenario records (one per scenario), summed into the terminal line."""

    records: dict[str, ScenarioRecord] = field(default_factory=dict)

    def record(self, scenario: str, runs: int, lost: int, stuck: int, unrecorded: int) -> None:
        """Record one scenario's counts (call once, after its checks and before asserting them).

        Raises:
            ValueError: a count is negative.
        """
        if min(runs, lost, stuck, unrecorded) < 0:
            raise ValueError(f"negative count for {scenario}: {runs=} {lost=} {stuck=} {unrecorded=}")
        self.records[scenario] = ScenarioRecord(scenario, runs, lost, stuck, unrecorded)

    def line(self) -> str:
        """The summary line: ``faults: N scenarios, N runs, L lost, S stuck, U unrecorded side effects``."""
        rs = self.records.values()
        return (f"faults: {len(self.records)} scenarios, {sum(r.runs for r in rs)} runs, "
                f"{sum(r.lost for r in rs)} lost, {sum(r.stuck for r in rs)} stuck, "
                f"{sum(r.unrecorded for r in rs)} unrecorded side effects")


def _ledger(config: pytest.Config) -> FaultsLedger:
    ledger = config.stash.get(_LEDGER, None)
    if ledger is None:
        ledger = config.stash[_LEDGER] = FaultsLedger()
    return ledger


@pytest.fixture(scope="session")
def faults_ledger(pytestconfig: pytest.Config) -> FaultsLedger:
    """The session's :class:`FaultsLedger` (``record(scenario, runs, lost, stuck, unrecorded)``)."""
    return _ledger(pytestconfig)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    """Print the fault line when any scenario recorded (shown under ``pytest -q`` too)."""
    ledger = config.stash.get(_LEDGER, None)
    if ledger is not None and ledger.records:
        terminalreporter.write_line(ledger.line())
