"""Pure parts of the verifiers (shared/core/verify/verifiers/, shared/application/verifierrun.py): outcome, deadline
guard, ctx defaults."""

from __future__ import annotations

import asyncio
import time

import pytest

from reel.shared.application.verifierrun import make_verifier, run_verifier
from reel.shared.core.run.events import BlobRef, ContextPartition, VerdictStatus
from reel.shared.core.run.views import AttemptView, EpisodeView, StepView
from reel.shared.core.verify.verification import derive_outcome
from reel.shared.core.verify.verifiers import ContextRequires, VerdictResult, VerifierCtx, VerifierInvalid, make_ctx
from reel.shared.core.workflow.spec import VerifierSpec


@pytest.mark.parametrize(("step_failed", "statuses", "outcome"), [
    (False, [], "succeeded"),
    (True, [], "failed"),
    (True, ["pass", "pass"], "failed"),
    (False, ["pass", "pass"], "passed"),
    (False, ["pass", "fail"], "failed"),
    (False, ["error", "fail"], "failed"),
    (False, ["pass", "error"], "error"),
    (False, ["error"], "error"),
])
def test_derive_outcome(step_failed: bool, statuses: list[VerdictStatus], outcome: str) -> None:
    assert derive_outcome(step_failed=step_failed, statuses=statuses) == outcome


class NoBlobs:
    """A blob handle that must not be used."""

    async def get(self, ref: BlobRef) -> bytes:
        raise AssertionError("no blob read expected")


def _view() -> EpisodeView:
    ctx = ContextPartition(packed=("a",), available=("b",), dropped=("c",))
    plan = StepView(step_id="plan", kind="model", status="succeeded", attempts=(
        AttemptView(step_id="plan", attempt=1, status="failed", executor_id="x", dispatched_lsn=2, context=ctx),
        AttemptView(step_id="plan", attempt=2, status="succeeded", executor_id="x", dispatched_lsn=4, context=ctx),
    ))
    act = StepView(step_id="act", kind="tool", status="skipped")
    return EpisodeView(run_id="r-1", workflow_name="w", branch_id="main", snapshot_lsn=9, status="verifying",
                       lineage=(), steps=(plan, act))


def test_ctx_defaults_to_the_last_step_and_its_final_attempt() -> None:
    view = _view()
    last = make_ctx(view, step=None, blobs=NoBlobs(), timeout_s=1, now=100.0)
    assert (last.step, last.attempt, last.deadline, last.snapshot_lsn) == ("act", None, 101.0, 9)
    plan = make_ctx(view, step="plan", blobs=NoBlobs(), timeout_s=1)
    assert plan.attempt == 2 and plan.attempt_view is not None and plan.attempt_view.status == "succeeded"


class _V:
    name, version = "v", "1"

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        if self.behaviour == "raise":
            raise ValueError("nope")
        if self.behaviour == "hang":
            await asyncio.Event().wait()
        if self.behaviour == "stubborn":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await asyncio.sleep(0.3)
        if self.behaviour == "not_a_result":
            return "pass"  # type: ignore[return-value]
        if self.behaviour == "score":
            return VerdictResult(status="pass", score=-0.5)
        return VerdictResult(status="pass", score=1.0, reason="x" * 5000)


@pytest.mark.parametrize(("behaviour", "status", "reason"), [
    ("raise", "error", "raised ValueError: nope"),
    ("hang", "error", "passed its deadline"),
    ("stubborn", "error", "passed its deadline"),
    ("not_a_result", "error", "returned str, not a VerdictResult"),
    ("score", "error", "outside 0..1"),
    ("ok", "pass", "xxx"),
])
async def test_run_verifier_never_raises_never_hangs(behaviour: str, status: str, reason: str) -> None:
    ctx = make_ctx(_view(), step="plan", blobs=NoBlobs(), timeout_s=0.1)
    started = time.monotonic()
    result = await run_verifier(_V(behaviour), ctx, cancel_grace_s=0.1)
    assert (result.status, reason in result.reason) == (status, True), result
    assert len(result.reason) <= 500
    assert time.monotonic() - started < 1.0


async def test_context_requires_on_a_skipped_or_tool_step() -> None:
    view = _view()
    v = ContextRequires(VerifierSpec(type="context_requires", item="a"))
    assert (await v.verify(make_ctx(view, step="act", blobs=NoBlobs(), timeout_s=1))).status == "fail"
    passed = await v.verify(make_ctx(view, step="plan", blobs=NoBlobs(), timeout_s=1))
    assert passed.status == "pass" and "position 1/1" in passed.reason


@pytest.mark.parametrize("spec", [
    VerifierSpec(type="output_regex", pattern="("),
    VerifierSpec(type="output_json_schema", json_schema={"type": "nonsense"}),
    VerifierSpec(type="python", path="no_colon"),
    VerifierSpec(type="python", path="json:not_there"),
    VerifierSpec(type="python", path="json:dumps"),  # a callable that is no Verifier factory
])
def test_make_verifier_refuses_bad_specs(spec: VerifierSpec) -> None:
    with pytest.raises(VerifierInvalid):
        make_verifier(spec)


async def test_recorded_outcome_quotes_the_recording_label() -> None:
    source = {"outcome": False, "outcome_from": "/data/django-10999.report.json"}
    v = make_verifier(VerifierSpec(type="recorded_outcome", expect=False), source=source)
    result = await v.verify(make_ctx(_view(), step=None, blobs=NoBlobs(), timeout_s=1))
    assert result.status == "fail" and "'outcome=false from django-10999.report.json'" in result.reason
    v = make_verifier(VerifierSpec(type="recorded_outcome", expect=True), source={"outcome": True, "reward": 1.0})
    result = await v.verify(make_ctx(_view(), step=None, blobs=NoBlobs(), timeout_s=1))
    assert result.status == "pass" and "'outcome=true reward=1.0'" in result.reason


@pytest.mark.parametrize(("status", "error_kind", "reason"), [
    ("failed", "max_turns", "agent step fix has no output (it failed: max_turns)"),
    ("skipped", None, "agent step fix never ran"),
])
async def test_an_output_check_on_an_agent_step_without_output_says_why(status: str, error_kind: str | None,
                                                                          reason: str) -> None:
    """An agent step has no attempts of its own: a failed one must not read as 'never ran'."""
    fix = StepView(step_id="fix", kind="agent", status=status, error_kind=error_kind)  # type: ignore[arg-type]
    view = EpisodeView(run_id="r-1", workflow_name="w", branch_id="main", snapshot_lsn=9, status="verifying",
                       lineage=(), steps=(fix,))
    v = make_verifier(VerifierSpec(type="output_regex", pattern="done"))
    result = await v.verify(make_ctx(view, step="fix", blobs=NoBlobs(), timeout_s=1))
    assert (result.status, result.reason) == ("fail", reason)
