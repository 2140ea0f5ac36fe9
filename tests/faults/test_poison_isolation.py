"""The poison cases while real runs proceed: the *other* runs are unaffected.

Reuses the world of tests/integration/test_poison.py (executor, verifier, recovery, cancel on a real
server; a plain client publishing onto live runs' event subjects) — its tests check each poison case
in depth; here five are injected at once into five runs waiting at a gate while four runs of command
tools run beside them: garbage bytes, a forged ``run_completed`` mid-run, a commit naming another run,
an outcome for an attempt never dispatched, and a ``verdict_recorded`` from a verifier the run never
asked. Then a sixth run completes (its real verdict recorded) and gets a forged second verdict.

Asserted: each poisoned run reads corrupt at the injected LSN with its kind; every other run satisfies
every invariant of tests/faults/checks.py; the executor got each command once and is done with it;
``recover {}`` answers.
"""

from __future__ import annotations

import pytest

from reel.shared.core.run.events import Verdict, VerdictRecorded
from reel.shared.core.run.integrity import RunCorrupt
from tests.faults.checks import check_runs
from tests.faults.conftest import FaultsLedger
from tests.faults.scenario import effects_spec, record
from tests.integration.test_poison import World, executor_quiet
from tests.integration.test_poison import world as world  # the fixture, by name
from tests.support.payloads import POISON_COMMITS, forged

pytestmark = pytest.mark.faults


async def _corrupt_at(w: World, run_id: str) -> tuple[int, str, str]:
    with pytest.raises(RunCorrupt) as info:
        await w.log.load(run_id)
    bad = info.value.corruption
    return bad.lsn, bad.kind, bad.reason


async def test_poisoned_runs_leave_the_others_whole(world: World, faults_ledger: FaultsLedger) -> None:
    w = world  # test_poison's world: executor, verifier, recovery (sweeping every 0.2 s) and cancel, in-process
    effects = w.gate.parent / "effects.txt"
    waiting = await w.start_waiting(6)
    normal = [await w.start(effects_spec(effects, f"beside-poison-{i}", sleep_s=0.1)) for i in range(4)]
    garbage, completed, foreign, illegal, unasked, kept = waiting
    injected = {}
    for run_id, name in ((garbage, "garbage"), (completed, "forged_completed"), (foreign, "foreign_run"),
                         (illegal, "never_dispatched"), (unasked, "unasked_verdict")):
        case = POISON_COMMITS[name]  # the integration suite's cases (tests/support/payloads.py), all at once
        head = (await w.log.load(run_id)).head_lsn
        injected[run_id] = (await w.inject(run_id, case.body(run_id, kept, head)), case.kind)
    w.open_gate()

    counts = await check_runs(w.log, [*normal, kept], side_effects=effects, timeout_s=60, ignore=injected)
    for run_id, (lsn, kind) in injected.items():
        found = await _corrupt_at(w, run_id)
        if found[:2] != (lsn, kind):
            counts.problems.append(f"{run_id}: expected corrupt at {lsn} ({kind}), found {found}")
    record(faults_ledger, "poison_isolation", counts)
    assert not [p for p in counts.problems], counts.problems
    done = await w.log.load(kept)
    assert done.outcome == "passed" and len(done.verdicts) == 1, done
    await executor_quiet(w)

    real = done.verdicts[0]  # the same verifier, branch and snapshot again: a forged second verdict
    lsn = await w.inject(kept, forged(kept, VerdictRecorded(verdict=Verdict(
        run_id=kept, branch_id=real.branch_id, snapshot_lsn=real.snapshot_lsn, verifier=real.verifier,
        status="fail", reason="forged"))))
    at, kind, reason = await _corrupt_at(w, kept)
    assert (at, kind) == (lsn, "invalid_transition") and "recorded already" in reason, reason
    reply = await w.client.command("recover", b"{}", timeout_s=30)
    assert reply.ok and {c["run_id"] for c in reply.detail["corrupt"]} >= {garbage, foreign}, reply
