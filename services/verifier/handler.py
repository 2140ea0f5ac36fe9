"""One verification job: the verdicts of one run at one snapshot LSN.

A job is triggered by a ``VerifyRun`` (services/verifier/app.py) naming the run's ``run_verifying``
commit at LSN P and its branch. It:

1. folds the run up to P (the pinned view) and to the head (what is already
   recorded) — each from the run's state snapshot plus the commits above it, or cold;
2. builds the frozen :class:`~reel.shared.core.run.views.EpisodeView` of the verifying branch at P;
3. runs every configured verifier whose verdict for (branch, P) is not yet in the
   log — a restarted job resumes, it never judges twice;
4. records each verdict in the run's log (``verdict_recorded``, a fenced commit
   through :func:`reel.shared.application.fenced.commit_decided` deciding
   :func:`reel.shared.core.verify.verification.record`:
   on a conflict it refreshes and decides again, dropping its own if a verdict for
   the same (branch, P, verifier) landed meanwhile) and then publishes the recorded
   verdict on ``<ns>.verdict.<run_id>`` with ``Nats-Msg-Id = run:P:verifier``;
5. commits ``run_completed`` only if the run still rests in ``Verifying`` at P
   (:func:`reel.shared.core.verify.verification.completion`). A run cancelled or rewound
   meanwhile keeps its verdicts (they name the old branch and P) but is not completed by them.

The log is the source of truth: what is published is always what was recorded.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import msgspec
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext

from reel.shared.application.fenced import Decide, Decided, commit_decided
from reel.shared.application.verifierrun import make_verifier, run_verifier
from reel.shared.application.workflows import WorkflowCache
from reel.shared.core.decision import Decision
from reel.shared.core.errors import BlobMissing, ReelError, RunNotFound, WorkflowInvalid
from reel.shared.core.ports import BlobStore, EventLog
from reel.shared.core.run.events import Verdict
from reel.shared.core.run.ids import LSN, BranchId, RunId
from reel.shared.core.run.integrity import RunCorrupt
from reel.shared.core.run.state import RunState, branch_failed
from reel.shared.core.run.views import EpisodeView, build_episode_view
from reel.shared.core.verify import verification
from reel.shared.core.verify.verifiers import Verifier, VerifierInvalid, errored, make_ctx
from reel.shared.core.wire.subjects import MSG_ID_HEADER, Names
from reel.shared.core.workflow.spec import VerifierSpec, WorkflowSpec
from reel.shared.nats.subjectlog import SubjectLog
from reel.shared.runtime.clock import now_ms

log = structlog.get_logger("reel.verifier")


def verdict_msg_id(run_id: str, snapshot_lsn: int, verifier: str) -> str:
    """``Nats-Msg-Id`` of a published verdict: one per (run, snapshot, verifier)."""
    return f"{run_id}:{snapshot_lsn}:{verifier}"


class SnapshotNotVisible(ReelError):
    """The pinned LSN is not (yet) readable: a lagging replica; the job is retried."""

    code = "snapshot_not_visible"
    retryable = True


class NotATrigger(ReelError):
    """The trigger names no ``run_verifying`` commit of its run on its branch (a forged one): never retried."""

    code = "not_a_trigger"


@dataclass
class Job:
    """The verification of ``run_id`` at ``snapshot_lsn`` (on ``branch_id``)."""

    run_id: RunId
    branch_id: BranchId
    snapshot_lsn: LSN
    pinned: RunState
    view: EpisodeView
    current: RunState
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def recorded(self, state: RunState | None = None) -> dict[str, Verdict]:
        """Verdicts already in the log for this (branch, snapshot), by verifier name."""
        return verification.recorded(state or self.current, self.branch_id, self.snapshot_lsn)


def _first(group: BaseExceptionGroup[RunCorrupt]) -> RunCorrupt:
    exc = group.exceptions[0]
    return exc if isinstance(exc, RunCorrupt) else _first(exc)


class VerificationHandler:
    """Runs verification jobs for one verifier service instance."""

    def __init__(self, nc: Client, names: Names, events: EventLog, blobs: BlobStore, *, writer: str) -> None:
        self.names, self.blobs, self.writer = names, blobs, writer
        self.log = events
        self.js: JetStreamContext = nc.jetstream()
        self.published = SubjectLog(nc, names.verdicts_stream, names.verdict)
        self.specs = WorkflowCache(blobs)

    async def open_job(self, run_id: str, snapshot_lsn: int, branch_id: str) -> Job:
        """Fold the run at the head and at the snapshot LSN (each from the run's state snapshot, if any,
        plus the commits above it — or cold; see JetStreamEventLog.load). When the head is the snapshot
        LSN (nothing was committed since ``run_verifying``: the usual case) the two are one read.

        Raises:
            SnapshotNotVisible: the read does not contain the commit at ``snapshot_lsn``.
            NotATrigger: the run's head is past ``snapshot_lsn`` and that is no ``run_verifying`` commit of
                ``branch_id``.
            RunCorrupt: the run is corrupt at or below its head.
        """
        try:
            current: RunState | None = await self.log.load(run_id)
        except RunNotFound:
            current = None
        pinned = current
        if current is not None and current.head_lsn > snapshot_lsn:
            pinned = await self.log.load(run_id, upto_lsn=snapshot_lsn)
        if current is None or pinned is None or pinned.head_lsn != snapshot_lsn:
            if current is not None and current.head_lsn > snapshot_lsn:
                raise NotATrigger(f"lsn {snapshot_lsn} is not a commit of {run_id}", run_id=run_id)
            raise SnapshotNotVisible(f"commit {snapshot_lsn} of {run_id} not visible yet", run_id=run_id)
        if (pinned.verifying_lsn, pinned.verifying_branch) != (snapshot_lsn, branch_id):
            raise NotATrigger(f"the commit at lsn {snapshot_lsn} of {run_id} is not a run_verifying of branch "
                              f"{branch_id!r}", run_id=run_id)
        view = build_episode_view(pinned, BranchId(branch_id))
        return Job(run_id=RunId(run_id), branch_id=BranchId(branch_id), snapshot_lsn=LSN(snapshot_lsn), pinned=pinned,
                   view=view, current=current)

    async def run(self, job: Job) -> None:
        """Judge, record, publish, complete (see module doc).

        Raises:
            RunCorrupt: the run went corrupt during the job (a record or completion re-read it).
        """
        await self._republish(job)
        todo = await self._todo(job)
        if todo:
            try:
                async with asyncio.TaskGroup() as tg:
                    for name, verifier, spec in todo:
                        tg.create_task(self._judge(job, name, verifier, spec))
            except* RunCorrupt as group:  # the run went corrupt under a judge: one RunCorrupt for the caller
                raise _first(group) from None
        await self._complete(job)

    # ---- configuration ---------------------------------------------------------------
    async def _spec(self, state: RunState) -> WorkflowSpec:
        return await self.specs.load(state.workflow_ref)  # its models' keys: scrubbed from verdicts and logs

    async def _todo(self, job: Job) -> list[tuple[str, Verifier | str, VerifierSpec | None]]:
        """(name, the verifier or why it cannot be built, spec) for each verdict still missing."""
        done = job.recorded()
        missing = [n for n in job.pinned.verifiers if n not in done]
        if not missing:
            return []
        try:
            wf = await self._spec(job.pinned)
        except (WorkflowInvalid, BlobMissing) as exc:  # permanent: judge it as an error, do not retry forever
            log.error("verification.workflow_unreadable", code=exc.code, reason=exc.message)
            return [(n, f"workflow unreadable: {exc.message}", None) for n in missing]
        specs = {v.label: v for v in wf.verifiers}
        out: list[tuple[str, Verifier | str, VerifierSpec | None]] = []
        for name in missing:
            spec = specs.get(name)
            if spec is None:
                out.append((name, f"verifier {name} is not in the workflow spec", None))
                continue
            try:
                out.append((name, make_verifier(spec, source=wf.source), spec))
            except VerifierInvalid as exc:
                log.warning("verifier.invalid", verifier=name, reason=exc.message)
                out.append((name, exc.message, spec))
        return out

    # ---- judging ---------------------------------------------------------------------
    async def _judge(self, job: Job, name: str, verifier: Verifier | str, spec: VerifierSpec | None) -> None:
        started = time.perf_counter()
        step = spec.step if spec else None
        ctx = make_ctx(job.view, step=step if step in {s.step_id for s in job.view.steps} else None,
                       blobs=self.blobs, timeout_s=spec.timeout_s if spec else 0.0)
        if isinstance(verifier, str):
            result, version = errored(verifier), spec.version if spec else "1"
        else:
            result, version = await run_verifier(verifier, ctx), verifier.version
        verdict = Verdict(
            run_id=job.run_id, branch_id=job.branch_id, snapshot_lsn=job.snapshot_lsn, verifier=name,
            verifier_version=version,
            step_id=ctx.step, attempt=ctx.attempt, status=result.status, score=result.score,
            reason=result.reason, at_ms=now_ms(),
        )
        recorded = await self._record(job, verdict)
        await self._publish(recorded)
        log.info("verdict", verifier=name, status=recorded.status, score=recorded.score, reason=recorded.reason,
                 mine=recorded is verdict, duration_ms=round((time.perf_counter() - started) * 1000, 2))

    async def _commit_fenced(self, job: Job, decide: Decide) -> Decided:
        """Commit ``decide(state)`` fenced on the job's state (one at a time per job; ``job.current`` follows).

        The job's own commits keep ``job.current`` at the head, so no read comes first: a commit by
        anyone else (a cancel, a fork, another instance) makes the fence fail, and
        :func:`~reel.shared.application.fenced.commit_decided` refreshes the state and decides again.

        Raises:
            RunCorrupt: the refresh after a lost fence found the run corrupt.
            ConcurrencyConflict: the fence failed on every try (the job is redelivered).
        """
        async with job.lock:
            result = await commit_decided(self.log, job.run_id, decide, writer=self.writer, state=job.current,
                                          log_name="verification")
            job.current = result.state
            return result

    async def _record(self, job: Job, verdict: Verdict) -> Verdict:
        """Record ``verdict`` unless one for its (branch, snapshot, verifier) is in; returns the recorded one."""
        await self._commit_fenced(job, lambda state: verification.record(state, verdict))
        return job.recorded()[verdict.verifier]

    async def _publish(self, verdict: Verdict) -> None:
        """Publish on the run's verdict subject (deduplicated by msg id within the stream's window)."""
        await self.js.publish(
            self.names.verdict(verdict.run_id), msgspec.json.encode(verdict),
            headers={MSG_ID_HEADER: verdict_msg_id(verdict.run_id, verdict.snapshot_lsn, verdict.verifier)},
        )

    async def _republish(self, job: Job) -> None:
        """Publish verdicts recorded by an earlier, interrupted job but missing from the verdict stream."""
        recorded = job.recorded()
        if not recorded:
            return
        seen: set[tuple[str, int, str]] = set()
        for _, body in await self.published.read_raw(job.run_id):
            v = msgspec.json.decode(body, type=Verdict)
            seen.add((v.branch_id, v.snapshot_lsn, v.verifier))
        for v in recorded.values():
            if (v.branch_id, v.snapshot_lsn, v.verifier) not in seen:
                log.info("verdict.republished", verifier=v.verifier)
                await self._publish(v)

    async def corrupt(self, run_id: str, snapshot_lsn: int, branch_id: str, exc: RunCorrupt) -> None:
        """The job's run is corrupt: publish an ``error`` verdict per verifier not yet recorded, record nothing."""
        bad = exc.corruption
        verdicts = verification.corrupt_verdicts(RunId(run_id), BranchId(branch_id), LSN(snapshot_lsn), exc,
                                                 at_ms=now_ms())
        for v in verdicts:
            await self._publish(v)
        log.error("verification.run_corrupt", lsn=bad.lsn, kind=bad.kind, reason=bad.reason,
                  error_verdicts=[v.verifier for v in verdicts])

    # ---- completion ------------------------------------------------------------------
    async def _complete(self, job: Job) -> None:
        """Commit ``run_completed`` iff the run still rests in Verifying at the snapshot."""
        step_failed = branch_failed(job.pinned, job.branch_id)
        at_ms = now_ms()

        def decide(state: RunState) -> Decision:
            return verification.completion(state, branch_id=job.branch_id, snapshot_lsn=job.snapshot_lsn,
                                           step_failed=step_failed, at_ms=at_ms)

        result = await self._commit_fenced(job, decide)
        if result.commit is not None:
            log.info("run.completed", outcome=result.state.outcome, lsn=result.commit.lsn)
        elif result.decision == verification.MOVED:
            state = result.state
            log.info("verification.not_completing", status=state.status, verifying_lsn=state.verifying_lsn,
                     active_branch=state.active_branch)
