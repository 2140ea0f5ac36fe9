"""Many runs in a real store, fast: each run's commits written straight through the event log (no executor).

:func:`fill` writes ``n`` runs of two commits each — ``run_created`` + ``run_started`` + the first attempt, then the
rest — the first commits of every run pipelined (each is a new run: expected LSN 0), then the second ones. Run ``i``
is one of :data:`KINDS` (``i % len(KINDS)``) and carries labels ``team`` (:data:`TEAMS`, ``i % 4``) and ``n`` (``i``);
created ``i`` ms after ``t0_ms``, so run ``i`` is older than run ``i + 1``. Used by the UI's browser tests and
``bench/ui_runs_page.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from reel.shared.core.run.events import (
    AnyEvent,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunStarted,
    RunVerifying,
    StepDecl,
    Usage,
    Verdict,
    VerdictRecorded,
)
from reel.shared.core.run.ids import new_run_id
from reel.shared.nats.eventlog import JetStreamEventLog

KINDS = ("passed", "passed", "failed", "running", "passed", "retried", "cancelled", "passed")
"""What run ``i`` is: ``passed`` (outcome ``succeeded``), ``retried`` (a 429 then success), ``failed`` (a step
failed for good: outcome ``failed``), ``running`` (no end yet), ``cancelled``."""
TEAMS = ("infra", "ml", "web", "data")
WORKFLOW = BlobRef(sha256="0" * 64, size_bytes=2, media_type="application/json", inline="{}")
IN_FLIGHT = 500
"""Commits sent before their acks are awaited."""


@dataclass(frozen=True)
class FakeRun:
    """One run written: its id, kind, team label and the LSN of its first commit (its runs-page key)."""

    run_id: str
    kind: str
    team: str
    created_lsn: int


def _first(run_id: str, i: int, t0_ms: int) -> list[AnyEvent]:
    at = t0_ms + i
    return [RunCreated(run_id=run_id, branch_id="main", workflow_name=f"wf-{i % 7}", workflow_ref=WORKFLOW,
                       steps=(StepDecl(step_id="plan", kind="model", max_attempts=2),
                              StepDecl(step_id="summarize", kind="model", max_attempts=2)),
                       created_ms=at, labels={"team": TEAMS[i % len(TEAMS)], "n": str(i)}),
            RunStarted(executor_id="x-0123456789ab", at_ms=at + 1),
            AttemptDispatched(branch_id="main", step_id="plan", attempt=1, executor_id="x-0123456789ab", at_ms=at + 2)]


def _rest(kind: str, i: int, t0_ms: int) -> list[AnyEvent]:
    at = t0_ms + i + 1000
    usage = Usage(input_tokens=1200, output_tokens=230, latency_ms=840.5)
    ok = BlobRef(sha256="1" * 64, size_bytes=4, media_type="text/plain", inline="done")

    def dispatch(step: str, n: int) -> AttemptDispatched:
        return AttemptDispatched(branch_id="main", step_id=step, attempt=n, executor_id="x-0123456789ab", at_ms=at)

    def fail(step: str, n: int, kind: str, message: str, retryable: bool) -> AttemptFailed:
        return AttemptFailed(branch_id="main", step_id=step, attempt=n, error_kind=kind, message=message,
                             retryable=retryable, usage=usage, at_ms=at + 200)

    def succeed(step: str, n: int) -> AttemptSucceeded:
        return AttemptSucceeded(branch_id="main", step_id=step, attempt=n, output_ref=ok, usage=usage, at_ms=at + 300)

    plan = [succeed("plan", 1), dispatch("summarize", 1)]
    end: list[AnyEvent] = [RunVerifying(branch_id="main", at_ms=at + 400)]
    if kind == "running":
        return plan
    if kind == "cancelled":
        return [*plan, AttemptFailed(branch_id="main", step_id="summarize", attempt=1, error_kind="cancelled",
                                     message="run cancelled", retryable=False, usage=usage, at_ms=at + 150),
                RunCancelled(reason="stopped by a test", at_ms=at + 160)]
    if kind == "failed":
        return [*plan, fail("summarize", 1, "context_overflow", f"prompt is {9000 + i} tokens, the window 8192", True),
                dispatch("summarize", 2), fail("summarize", 2, "context_overflow", "still too long", False), *end,
                RunCompleted(branch_id="main", outcome="failed", at_ms=at + 500)]
    retry = ([fail("summarize", 1, "rate_limited", "429 Too Many Requests", True), dispatch("summarize", 2)]
             if kind == "retried" else [])
    return [*plan, *retry, succeed("summarize", 2 if retry else 1), *end,
            RunCompleted(branch_id="main", outcome="succeeded", at_ms=at + 500)]


async def _commit_all(log: JetStreamEventLog, items: Sequence[tuple[str, list[AnyEvent], int]]) -> list[int]:
    lsns: list[int] = []
    for lo in range(0, len(items), IN_FLIGHT):
        futs = [await log.commit_async(rid, evs, expected_lsn=exp, writer="x-0123456789ab")
                for rid, evs, exp in items[lo:lo + IN_FLIGHT]]
        lsns += await asyncio.gather(*futs)
    return lsns


async def fill(log: JetStreamEventLog, n: int, *, t0_ms: int, start: int = 0) -> list[FakeRun]:
    """Write runs ``start`` .. ``start + n - 1`` (see the module doc); returns them, oldest first."""
    idx = range(start, start + n)
    ids = [new_run_id() for _ in idx]
    first = await _commit_all(log, [(rid, _first(rid, i, t0_ms), 0) for rid, i in zip(ids, idx, strict=True)])
    kinds = [KINDS[i % len(KINDS)] for i in idx]
    await _commit_all(log, [(rid, _rest(k, i, t0_ms), lsn)
                            for rid, k, i, lsn in zip(ids, kinds, idx, first, strict=True)])
    return [FakeRun(run_id=rid, kind=k, team=TEAMS[i % len(TEAMS)], created_lsn=lsn)
            for rid, k, i, lsn in zip(ids, kinds, idx, first, strict=True)]


JUDGES = ("output_regex", "an_llm_judge_with_a_rather_long_name")


async def judged(log: JetStreamEventLog, *, t0_ms: int) -> str:
    """Write one run that passed two verifiers (:data:`JUDGES`), each with a long reason; returns its id."""
    rid = new_run_id()
    first = _first(rid, 0, t0_ms)
    created = first[0]
    assert isinstance(created, RunCreated)
    first[0] = RunCreated(**{**{f: getattr(created, f) for f in created.__struct_fields__}, "verifiers": JUDGES})
    lsn = await log.commit(rid, first, expected_lsn=0)
    body = _rest("passed", 0, t0_ms)[:-1]  # up to run_verifying
    lsn = await log.commit(rid, body, expected_lsn=lsn)
    reason = ("the final answer names every file it changed and the test that proves it, "
              "and nothing it did not change: " + "checked " * 12).strip()
    verdicts: list[AnyEvent] = [VerdictRecorded(verdict=Verdict(
        run_id=rid, branch_id="main", snapshot_lsn=lsn, verifier=v, step_id="summarize", attempt=1, status="pass",
        score=1.0, reason=reason, at_ms=t0_ms + 2000)) for v in JUDGES]
    await log.commit(rid, [*verdicts, RunCompleted(branch_id="main", outcome="passed", snapshot_lsn=lsn,
                                                   at_ms=t0_ms + 2001)], expected_lsn=lsn)
    return rid
