"""What a run's outcome honestly says: outcome verifiers apart from context checks.

A replayed recording gets a *context check*, ``task-in-final-context`` (a
``context_requires`` verifier: was the task item still packed into the last
recorded turn's context?). That checks Reel's packing, not whether the recorded
agent succeeded; so it must not make a recording without an outcome label read
``passed``. The log keeps what the verifier service committed (``run_completed``
with its outcome over every verifier: golden logs and old stores fold unchanged);
this module is how every reader *reports* it:

* :func:`context_checks` — the run's verifiers that are context checks: the names
  in the run's ``context_checks`` label (comma-separated; the trajectory loader
  sets it on every replayed workflow, empty when there is none), or, for a run
  replayed before that label existed (label ``replayed_from`` but no
  ``context_checks``), ``task-in-final-context`` if the run has it;
* :func:`reported_outcome` — the outcome over the *other* verifiers (the outcome
  verifiers, e.g. ``recorded_outcome``) by the same rule
  (:func:`reel.shared.core.verify.verification.derive_outcome`), and :data:`UNLABELLED` when a
  run whose verifiers are declared this way (the label is present) has no outcome
  verifier and no step failed. A run without the label reports its logged outcome.

Pure: reads a folded :class:`~reel.shared.core.run.state.RunState`, no I/O.
"""

from __future__ import annotations

from reel.shared.core.run.events import Verdict
from reel.shared.core.run.state import RunState, branch_failed
from reel.shared.core.verify.verification import derive_outcome

CONTEXT_CHECKS_LABEL = "context_checks"
"""Run label naming the verifiers that are context checks, comma-separated (``""``: none)."""
LEGACY_CHECKS = ("task-in-final-context",)
"""Context checks of runs replayed before :data:`CONTEXT_CHECKS_LABEL` existed."""
UNLABELLED = "unlabelled"
"""The reported outcome of a completed run that had no outcome verifier (a recording without a label)."""


def declares_checks(state: RunState) -> bool:
    """Whether the run says which of its verifiers are context checks (a replayed run: yes)."""
    return CONTEXT_CHECKS_LABEL in state.labels or "replayed_from" in state.labels


def context_checks(state: RunState) -> tuple[str, ...]:
    """The run's context-check verifiers, in the run's verifier order (``()`` for most live runs)."""
    raw = state.labels.get(CONTEXT_CHECKS_LABEL)
    names = {n.strip() for n in raw.split(",") if n.strip()} if raw is not None else (
        set(LEGACY_CHECKS) if "replayed_from" in state.labels else set())
    return tuple(v for v in state.verifiers if v in names)


def final_verdicts(state: RunState) -> dict[str, Verdict]:
    """The verdict per verifier the run was (or is being) judged by: those of its verification
    snapshot (branch and LSN) when it has one, else the latest of each on the active branch."""
    out: dict[str, Verdict] = {}
    for v in state.verdicts:
        if state.verifying_lsn is not None:
            if v.snapshot_lsn == state.verifying_lsn and v.branch_id == state.verifying_branch:
                out[v.verifier] = v
        elif v.branch_id == state.active_branch:
            out[v.verifier] = v
    return out


def check_verdicts(state: RunState) -> list[Verdict]:
    """The context checks' verdicts (see :func:`final_verdicts`), in the run's verifier order."""
    got = final_verdicts(state)
    return [got[n] for n in context_checks(state) if n in got]


def reported_outcome(state: RunState) -> str | None:
    """The run's outcome as Reel reports it: ``None`` until it completes, else ``passed`` / ``failed`` /
    ``error`` / ``succeeded`` over its outcome verifiers, or :data:`UNLABELLED` (see the module doc)."""
    if state.outcome is None or not declares_checks(state):
        return state.outcome
    checks = set(context_checks(state))
    judges = [n for n in state.verifiers if n not in checks]
    branch = state.verifying_branch or state.active_branch
    failed = branch in state.branches and branch_failed(state, branch)
    if not judges:
        return "failed" if failed else UNLABELLED
    got = final_verdicts(state)
    if any(n not in got for n in judges):  # not judged as expected: what the log says
        return state.outcome
    return derive_outcome(step_failed=failed, statuses=[got[n].status for n in judges])


def checks_summary(state: RunState) -> str:
    """``task-in-final-context=pass`` (one per context check, comma-separated), ``""`` when none."""
    return ", ".join(f"{v.verifier}={v.status}" for v in check_verdicts(state))
