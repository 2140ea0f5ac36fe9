"""The snapshot barrier (docs/verifiers.md), one test per mutator: ``pytest -k snapshot_barrier``.

Harness: a verifier (``tests.integration.parking:Parking``) that parks on a
rendezvous mid-``verify``, after serializing the view it holds; each mutator is
fired only once the park is proven (``await parked``, never a sleep), from
outside the run, through its real service and command subject. One test per
mutator — they are different code paths:

* rewind (``<ns>.cmd.rewind`` → services/rewind) forks a new branch;
* cancel (``<ns>.cmd.cancel`` → services/cancel) cancels the Verifying run;
* recovery (``<ns>.cmd.recover`` → services/recovery) resolves the ``Dispatched``
  intent of the very attempt the held view contains (a crashed executor's).

Every test also checks that the ctx records the snapshot LSN,
a cold re-fold at that LSN gives a byte-identical view, and the failed attempt
is in it and counted. There is deliberately no concurrent-retry test: Verifying
is entered only when every step is terminal, so it would pass with no barrier.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import msgspec
from nats.js import JetStreamContext

from reel.services.cancel.app import serve as cancel_serve
from reel.services.recovery.app import serve as recovery_serve
from reel.services.rewind.app import serve as rewind_serve
from reel.shared.core.run.events import RunCompleted, RunVerifying, Verdict
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import EpisodeView, build_episode_view, serialize_view
from reel.shared.core.wire.commands import RecoverRuns, encode
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration import parking
from tests.integration.scenarios import crashed_attempt_scenario

PARK_TIMEOUT_S = 30.0


def _workflow(park_name: str) -> dict[str, Any]:
    """Two steps; the first fails its first attempt (the failed attempt the view must keep)."""
    return {
        "name": "barrier",
        "steps": [
            {"kind": "model", "id": "plan", "max_attempts": 3,
             "model": {"adapter": "scripted",
                       "outputs": [{"error": "context_missing", "message": "needed doc-b"}, "the plan"]},
             "context": [{"id": "doc-a", "text": "alpha " * 10, "priority": 2.0},
                         {"id": "doc-b", "text": "bravo " * 10, "priority": 1.0}]},
            {"kind": "tool", "id": "act", "tool": {"type": "scripted", "outputs": ["acted"]}},
        ],
        "verifiers": [{"type": "python", "name": park_name, "path": "tests.integration.parking:Parking",
                       "timeout_s": 60}],
    }


async def _park(client: ReelClient, wf: dict[str, Any], rv: parking.Rendezvous) -> str:
    """Start the run and return once its verifier is provably parked holding the view."""
    reply = await client.start(parse_workflow(wf))
    assert reply.ok and reply.run_id, reply
    await asyncio.wait_for(rv.parked.wait(), PARK_TIMEOUT_S)
    assert rv.held.run == reply.run_id
    return reply.run_id


async def _assert_snapshot_facts(rv: parking.Rendezvous, event_log: JetStreamEventLog,
                                 failed_attempt: tuple[str, int, str] = ("plan", 1, "context_missing"),
                                 ) -> EpisodeView:
    """Card steps 5–6 on the held ctx; returns the held view."""
    ctx = rv.held
    view = ctx.episode
    # 5. the ctx records the snapshot LSN: the LSN of the run's run_verifying commit
    at_p = [c for lsn, c in await event_log.read(ctx.run, upto_lsn=ctx.snapshot_lsn) if lsn == ctx.snapshot_lsn]
    assert at_p and any(isinstance(e, RunVerifying) for e in at_p[0].events)
    assert view.snapshot_lsn == ctx.snapshot_lsn
    # ... and a view built by a cold re-fold at that LSN equals the held one, byte for byte
    cold = await event_log.load(ctx.run, upto_lsn=ctx.snapshot_lsn, cold=True)
    assert serialize_view(build_episode_view(cold, view.branch_id)) == rv.before == serialize_view(view)
    # 6. failed attempts are present in the snapshot, and counted
    failed = [a for a in view.attempts() if a.status == "failed"]
    assert [(a.step_id, a.attempt, a.error_kind) for a in failed] == [failed_attempt]
    assert view.failed_attempts == 1 and len(view.step(failed_attempt[0]).attempts) >= 2
    return view


async def _verdicts(js: JetStreamContext, cfg: Config, run_id: str) -> Any:
    """A replaying consumer of the run's verdict subject."""
    return await js.subscribe(cfg.names.verdict(run_id), ordered_consumer=True)


async def _next_verdict(sub: Any) -> Verdict:
    return msgspec.json.decode((await sub.next_msg(timeout=PARK_TIMEOUT_S)).data, type=Verdict)


def _completions(commits: list[tuple[int, Any]]) -> list[RunCompleted]:
    return [e for _, c in commits for e in c.events if isinstance(e, RunCompleted)]


async def test_snapshot_barrier_rewind(executor: None, verifier: None, client: ReelClient, infra: Infra,
                                       cfg: Config, event_log: JetStreamEventLog) -> None:
    name = f"park-{uuid.uuid4().hex[:8]}"
    rv = parking.arm(name)  # the run on the new branch is judged too: that call does not park
    async with running(rewind_serve, infra, cfg):
        run_id = await _park(client, _workflow(name), rv)
        p = rv.held.snapshot_lsn

        # Mutator A, from outside the run: fork a new BranchId at step `act` of the judged branch
        reply = await client.rewind(run_id, at_step="act", idempotency_key="barrier-rewind")
        assert reply.ok and reply.branch_id and reply.branch_id != "main", reply
        assert reply.lsn > p, "the fork is a new commit above the snapshot"
        forked = await event_log.load(run_id)
        assert forked.active_branch == reply.branch_id and forked.verifying_lsn is None

        # the held view has not moved: same bytes, still the old branch and its lineage
        assert serialize_view(rv.held.episode) == rv.before
        assert rv.held.episode.branch_id == "main" and rv.held.branch == "main"
        assert [b.branch_id for b in rv.held.episode.lineage] == ["main"]
        sub = await _verdicts(infra.js, cfg, run_id)
        rv.release.set()
        await asyncio.wait_for(rv.done.wait(), PARK_TIMEOUT_S)
        assert rv.after == rv.before, "the held view changed while the verifier held it"
        await _assert_snapshot_facts(rv, event_log)

        # the verdict names the old branch and the snapshot LSN; the new branch is judged on its own
        verdicts = {(v.branch_id, v.snapshot_lsn): v for v in [await _next_verdict(sub), await _next_verdict(sub)]}
        state: RunState = await client.wait_for(run_id, ("completed",), timeout_s=PARK_TIMEOUT_S)
    old = verdicts[("main", p)]
    assert old.status == "pass" and old.reason == "released after park"
    new_p = state.verifying_lsn
    assert new_p is not None and new_p > reply.lsn and (reply.branch_id, new_p) in verdicts
    # the run completes from the new branch's snapshot only; the old verdict completed nothing
    assert [(c.branch_id, c.snapshot_lsn) for c in _completions(await event_log.read(run_id))] == [
        (reply.branch_id, new_p)]
    # a freshly built view of the active branch shows the fork; the old branch's records are intact
    fresh = build_episode_view(state)
    assert fresh.branch_id == reply.branch_id and [b.branch_id for b in fresh.lineage] == ["main", reply.branch_id]
    assert build_episode_view(state, "main").steps == rv.held.episode.steps


async def test_snapshot_barrier_cancel(executor: None, verifier: None, client: ReelClient, infra: Infra,
                                       cfg: Config, event_log: JetStreamEventLog) -> None:
    name = f"park-{uuid.uuid4().hex[:8]}"
    rv = parking.arm(name)
    async with running(cancel_serve, infra, cfg):
        run_id = await _park(client, _workflow(name), rv)
        p = rv.held.snapshot_lsn

        # Mutator B, from outside the run: cancel it while it rests in Verifying
        reply = await client.cancel(run_id, reason="barrier test")
        assert reply.ok and reply.status == "cancelled" and reply.lsn > p, reply
        assert (await event_log.load(run_id)).status == "cancelled"
        assert serialize_view(rv.held.episode) == rv.before

        sub = await _verdicts(infra.js, cfg, run_id)
        rv.release.set()
        await asyncio.wait_for(rv.done.wait(), PARK_TIMEOUT_S)
        # the verifier still completes: its verdict is published on the verdict subject ...
        published = await _next_verdict(sub)
    assert rv.after == rv.before, "the held view changed while the verifier held it"
    held = await _assert_snapshot_facts(rv, event_log)
    assert held.status == "verifying"
    assert (published.verifier, published.branch_id, published.snapshot_lsn, published.status) == (
        name, "main", p, "pass")
    # ... and recorded in the run's log (published only after it was recorded), above the cancel
    commits = await event_log.read(run_id)
    state = await event_log.load(run_id)
    assert state.status == "cancelled" and state.verdicts == (published,)
    recorded_at = [lsn for lsn, c in commits if any(getattr(e, "verdict", None) == published for e in c.events)]
    assert recorded_at and recorded_at[0] > reply.lsn
    assert _completions(commits) == [], "a cancelled run must not be completed by its verdicts"


async def test_snapshot_barrier_recovery(verifier: None, client: ReelClient, infra: Infra, cfg: Config,
                                         event_log: JetStreamEventLog) -> None:
    # no `executor` fixture: the scenario runs its own (a crashing subprocess, then a resumed one)
    name = f"park-{uuid.uuid4().hex[:8]}"
    rv = parking.arm(name)
    spec = {"type": "python", "name": name, "path": "tests.integration.parking:Parking", "timeout_s": 60}
    crash = await crashed_attempt_scenario(infra, cfg, client, verifiers=[spec])
    await asyncio.wait_for(rv.parked.wait(), PARK_TIMEOUT_S)
    ctx, p = rv.held, crash.verifying_lsn
    assert (ctx.run, ctx.snapshot_lsn, ctx.step, ctx.attempt) == (crash.run_id, p, crash.step_id, crash.winning_attempt)

    # the verifier is reading the step whose lost attempt recovery will resolve: in its view it is open
    def lost(view: EpisodeView) -> Any:
        return next(a for a in view.step(crash.step_id).attempts if a.attempt == crash.lost_attempt)

    held_lost = lost(ctx.episode)
    assert (held_lost.status, held_lost.superseded, held_lost.output_ref) == ("dispatched", True, None)

    # Mutator C, from outside the run: the recover command resolves exactly that intent
    async with running(recovery_serve, infra, cfg, sweep=False):
        reply = await client.command("recover", encode(RecoverRuns(run_id=crash.run_id)), timeout_s=PARK_TIMEOUT_S)
    assert reply.ok, reply
    resolved = reply.detail["resolved"]
    assert [(r["step"], r["attempt"], r["outcome"]) for r in resolved] == [
        (crash.step_id, crash.lost_attempt, "succeeded")], resolved
    assert resolved[0]["lsn"] > p, "recovery appends above the snapshot LSN"

    # the held view is unchanged; a freshly built view shows the new outcome of the same attempt
    assert serialize_view(ctx.episode) == rv.before and lost(ctx.episode) == held_lost
    fresh = build_episode_view(await event_log.load(crash.run_id, cold=True), "main")
    fresh_lost = lost(fresh)
    assert (fresh_lost.status, fresh_lost.recovered, fresh_lost.output_ref) == (
        "succeeded", True, crash.lost_output_ref)
    assert fresh_lost.outcome_lsn == resolved[0]["lsn"] and fresh.snapshot_lsn > p
    assert serialize_view(fresh) != rv.before

    sub = await _verdicts(infra.js, cfg, crash.run_id)
    rv.release.set()
    await asyncio.wait_for(rv.done.wait(), PARK_TIMEOUT_S)
    verdict = await _next_verdict(sub)
    assert rv.after == rv.before, "the held view changed while the verifier held it"
    await _assert_snapshot_facts(rv, event_log, failed_attempt=(crash.step_id, 1, "context_missing"))
    assert (verdict.snapshot_lsn, verdict.branch_id, verdict.attempt) == (p, "main", crash.winning_attempt)
    # recovery changed no run status: the run still rested in Verifying at P and completes from P
    state = await client.wait_for(crash.run_id, ("completed",), timeout_s=PARK_TIMEOUT_S)
    assert [(c.branch_id, c.snapshot_lsn) for c in _completions(await event_log.read(crash.run_id))] == [("main", p)]
    assert state.outcome == "passed"
