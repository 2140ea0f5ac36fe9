"""The executor's commands: ``start`` (create a run) and ``resume`` (drive an existing one).

The consumer shell's :class:`~reel.shared.nats.consumer.Router` decodes and validates each
command (a refusal is a ``command.rejected`` line and an error reply); the handlers here
return a :class:`~reel.shared.nats.consumer.Then`: the :class:`~reel.shared.core.wire.commands.Reply`
now, then the run is driven until it rests (services/executor/driver.py) before the
ack. The command message stays un-acked (kept alive with in-progress acks by the
shell) until the run rests, so if this process dies JetStream redelivers the command
and another executor takes over from the log.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Container

import msgspec
import structlog

from reel.shared.application.fenced import commit_new
from reel.shared.application.toolimports import PythonTools, Registered, check_tool_imports, tool_search_path
from reel.shared.application.workflows import WorkflowCache
from reel.shared.application.workspace import WorkspaceTooLarge, seed_dir
from reel.shared.application.workspace import snapshot as workspace_snapshot
from reel.shared.core.errors import (
    BlobMissing,
    IdempotencyConflict,
    InvalidCommand,
    LeaseLost,
    ReelError,
    RunNotFound,
    WorkflowInvalid,
)
from reel.shared.core.mutators import cancel
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER, TokenCounter
from reel.shared.core.ports import BlobStore, EventLog
from reel.shared.core.run.events import BlobRef, Budget, RunCreated, RunStarted
from reel.shared.core.run.ids import ROOT_BRANCH, ExecutorId, new_executor_id, run_id_for_key
from reel.shared.core.run.integrity import RunCorrupt
from reel.shared.core.run.planning import has_open_intent
from reel.shared.core.run.state import CANCELLED, COMPLETED, VERIFYING, RunState
from reel.shared.core.wire.commands import Reply, ResumeRun, StartRun
from reel.shared.core.workflow.spec import AgentStep, WorkflowSpec, encode_workflow, validate_workflow
from reel.shared.nats.blobstore import is_inline, ref_for
from reel.shared.nats.consumer import Ack, Deferred, Delivery, Router, Then
from reel.shared.nats.control import Cause, ControlHub
from reel.shared.nats.infra import Infra
from reel.shared.nats.leases import Lease, executor_alive, tools_served
from reel.shared.runtime.clock import now_ms
from reel.shared.runtime.config import Config

from .attempts import LOG_NAME, Attempts
from .driver import Driver, HandedBack, OwnedElsewhere, ToolsUnserved, mcp_expanded
from .orphans import Orphans

log = structlog.get_logger("reel.executor")

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

UNSERVED_KEEP_MS = 60_000
"""How long a tool a run waited for stays named in the lease after the last wait (ms): a run's command is
redelivered with a backoff of up to 30 s, so a still-waiting run renews it."""


FINISHED = frozenset({VERIFYING, COMPLETED, CANCELLED})
"""The statuses no executor drives a run on from (what it held of the run's working copies is dropped then)."""


def taken_from(state: RunState, executor_id: str) -> bool:
    """Whether another executor has claimed ``state``'s run while an attempt ``executor_id`` dispatched is still
    open (it was taken over from this one mid-attempt; before this executor's own claim it has no attempt)."""
    if state.executor_id in (None, executor_id):
        return False
    return any(a.executor_id == executor_id and a.outcome_lsn is None
               for b in state.branches.values() for attempts in b.attempts.values() for a in attempts)


def _invalid_run_id(run_id: str) -> str:
    return f"{run_id[:80]!r} is not a valid run id (at `$.run_id`)"


class Executor:
    """One executor: its id, its ports, the runs it drives, and the start/resume handler.

    Args:
        log: the event log port (constructed once by ``serve()``).
        blobs: the blob store port (constructed once by ``serve()``).
        stopping: set on shutdown: finish the attempt in flight, then hand runs back.
        lease: this executor's lease, checked before every write (``None``: not checked — tests that drive
            an executor without one).
        tools: function objects this executor serves by ``module:function`` path (a live mapping: the Python
            API's ``reel.Worker`` and ``reel.local()`` add to it); a ``python:`` tool found there is not imported.
    """

    def __init__(self, infra: Infra, cfg: Config, log: EventLog, blobs: BlobStore, *,
                 executor_id: ExecutorId | None = None, counter: TokenCounter = DEFAULT_COUNTER,
                 stopping: asyncio.Event | None = None, lease: Lease | None = None,
                 tools: Registered | None = None) -> None:
        self.infra, self.log, self.blobs = infra, log, blobs
        self.executor_id = executor_id or new_executor_id()
        self.lease = lease
        self.tools = tools
        self.unserved: dict[str, int] = {}  # module:function → when a run last waited for it here (epoch ms)
        self.specs = WorkflowCache(blobs, registered=tools)
        self.inline_max = cfg.inline_max_bytes
        self.default_budget = cfg.budget  # the namespace's (REEL_BUDGET): what a workflow's budget leaves unset
        attempts = self.attempts = Attempts(log, blobs, infra.nc, cfg.names, self.executor_id, counter,
                                            outcomes=infra.outcomes, tool_output=cfg.tool_output, lease=lease)
        self.control = ControlHub(infra.nc, cfg.names, self._stopped_since, check_s=cfg.cancel_check_s,
                                  heads=log.heads)
        self.driver = Driver(log, self.specs, attempts, stopping=stopping, control=self.control,
                             inline_max=cfg.inline_max_bytes,
                             owner_alive=lambda owner: executor_alive(infra.leases, owner))
        self.orphans = Orphans(log, attempts)
        self._driving: dict[str, bool] = {}  # run id → "look again" (a command for it came in meanwhile)
        names = self.names = cfg.names
        self.router = Router(infra, route_of=self._route_of)
        self.router.route(names.command("start"), StartRun, self.start, rejected="command.rejected",
                          rejected_fields={"command": "start"})
        self.router.route(names.command("resume"), ResumeRun, self.resume, rejected="command.rejected",
                          rejected_fields={"command": "resume"}, invalid_run_id=_invalid_run_id)

    def _route_of(self, subject: str) -> str:
        keyed = self.names.keyed_command(subject)
        return self.names.command(keyed[2]) if keyed else subject

    def _check_keyed(self, delivery: Delivery, run_id: str) -> None:
        """A keyed command (``<ns>.cmd.part.<p>.<run>.<cmd>``) must be about the run its subject names.

        Raises:
            InvalidCommand: it names another run (it was routed by a run id it does not drive).
        """
        keyed = self.names.keyed_command(delivery.subject)
        if keyed is not None and keyed[1] != run_id:
            raise InvalidCommand(f"the subject names run {keyed[1][:80]!r} but the command is about {run_id[:80]!r}"
                                 " (a keyed start's run id is that of its idempotency key, or of `cmd:<Nats-Msg-Id>`)")

    async def _stopped_since(self, run_id: str, from_lsn: int) -> tuple[Cause | None, int]:
        """``"cancelled"`` when ``run_id``'s log holds its ``run_cancelled`` at an LSN ≥ ``from_lsn`` (0: the run's
        state); ``"lost"`` when the run was taken over — the last ``run_started`` at an LSN ≥ ``from_lsn`` > 0 names
        another executor, or (``from_lsn`` 0) :func:`taken_from` this one; and the last LSN read."""
        if from_lsn <= 0:
            state = await self.log.load(run_id)
            if state.status == "cancelled":
                return "cancelled", state.head_lsn
            return ("lost" if taken_from(state, self.executor_id) else None), state.head_lsn
        commits = await self.log.read(run_id, from_lsn=from_lsn)
        head = commits[-1][0] if commits else from_lsn - 1
        if cancel.cancel_lsn(commits) is not None:
            return "cancelled", head
        claims = [e.executor_id for _, c in commits for e in c.events if isinstance(e, RunStarted)]
        return ("lost" if claims and claims[-1] != self.executor_id else None), head

    async def drive(self, run_id: str, state: RunState | None = None) -> RunState | None:
        """Drive ``run_id`` until it rests (see :meth:`Driver.drive`; ``state``: the run as just committed)."""
        return await self.driver.drive(run_id, state)

    async def handle(self, delivery: Delivery) -> Ack:
        """Handle one start or resume command (reply, then drive the run until it rests)."""
        return await self.router(delivery)

    async def start(self, start: StartRun, delivery: Delivery) -> Then:
        """Create the run of a start command (or find the one its key made), reply, then drive it.

        Raises:
            InvalidCommand, BlobMissing, WorkflowInvalid: the command's workflow cannot run (a python tool
                of an agent step that does not import included), or a keyed start names another run.
            IdempotencyConflict: the key's run exists with another workflow (sha256 of the encoded body);
                that run is untouched and not driven.
            Deferred: a python tool is served by another live executor only (a ``reel.Worker``): left to it.
        """
        spec = await self._spec_of_command(start)
        search = tool_search_path(start.source_dir or None)  # the file's folder, up to its project root; our cwd
        tools = await self._tools_of(spec, search)  # a python tool that does not resolve: refused now, naming it
        await mcp_expanded(spec)  # a server that cannot start or list its tools: refused now, naming the entry
        key = start.idempotency_key or f"cmd:{delivery.identity}"  # no key: the command message is the identity
        run_id = run_id_for_key(key)
        self._check_keyed(delivery, run_id)
        structlog.contextvars.bind_contextvars(run_id=run_id)
        body = encode_workflow(spec)
        # one round trip: a workflow up to the inline threshold rides in its ref; a larger one's
        # blob is in flight with run_created (awaited after it: a failed put naks the start, whose redelivery
        # puts it again before the existing run is driven)
        workflow_ref = ref_for(body, "application/json", inline_max=self.inline_max)
        stored = None if is_inline(workflow_ref) else await self.blobs.put_async(body, "application/json")
        self.specs.remember(workflow_ref.sha256, spec, tools, search)
        workspace = await self._seed_workspace(spec, start.source_dir or None)
        created = RunCreated(
            run_id=run_id, branch_id=ROOT_BRANCH, workflow_name=spec.name, workflow_ref=workflow_ref,
            steps=spec.decls(), verifiers=tuple(v.label for v in spec.verifiers),
            idempotency_key=start.idempotency_key, created_ms=now_ms(), labels={**spec.labels, **start.labels},
            source_dir=start.source_dir, budget=_budget(spec, self.default_budget), workspace=workspace,
        )
        self.driver.attempts.check_lease()
        done = await commit_new(self.log, run_id, [created], writer=self.executor_id, log_name=LOG_NAME)
        if stored is not None:
            await stored
        if done.commit is not None:
            log.info("run.created", workflow=spec.name, steps=len(spec.steps), lsn=done.commit.lsn)
            reply = Reply(ok=True, run_id=run_id, status="pending", created=True, lsn=done.commit.lsn)
            fresh: RunState | None = done.state  # the drive starts from it: no re-read of the run
        else:  # the key's run exists (a repeated or redelivered start)
            existing = done.state.workflow_ref.sha256
            if start.idempotency_key is not None and existing != workflow_ref.sha256 \
                    and not await self._same_workflow(done.state.workflow_ref, spec):
                raise IdempotencyConflict(
                    f"idempotency key {start.idempotency_key!r} was used for run {run_id} of workflow "
                    f"{done.state.workflow_name!r} (sha256 {existing[:12]}); this start's workflow "
                    f"{spec.name!r} (sha256 {workflow_ref.sha256[:12]}) differs: use another key",
                    run_id=run_id, key=start.idempotency_key, existing_workflow=done.state.workflow_name,
                    new_workflow=spec.name)
            log.info("run.exists", status=done.state.status, idempotency_key=start.idempotency_key)
            reply = Reply(ok=True, run_id=run_id, status=done.state.status, created=False)  # nothing committed: lsn 0
            fresh = None
        return Then(reply, lambda: self._drive_until_rest(run_id, "start", fresh))

    async def _seed_workspace(self, spec: WorkflowSpec, source_dir: str | None) -> BlobRef | msgspec.UnsetType:
        """The first snapshot of the workflow's ``workspace:`` (its ``from:`` folder), stored; unset: none declared.

        Raises:
            WorkflowInvalid: the folder is missing, or holds more than the workspace's limits (the run is not
                created: a workspace too big to snapshot is refused at start).
        """
        if isinstance(spec.workspace, msgspec.UnsetType):
            return msgspec.UNSET
        try:
            seed = seed_dir(spec.workspace, source_dir)
        except ValueError as exc:
            raise WorkflowInvalid(str(exc)) from None
        if not seed.is_dir():
            raise WorkflowInvalid(f"workspace: `from` folder {seed} does not exist")
        try:
            snap = await workspace_snapshot(seed, spec.workspace, self.blobs)
        except WorkspaceTooLarge as exc:
            raise WorkflowInvalid(f"workspace_too_large: {exc.message}") from None
        log.info("workspace.seeded", files=len(snap.manifest.files), stored_bytes=snap.stored_bytes,
                 manifest=snap.ref.sha256[:12])
        return snap.ref

    async def _tools_of(self, spec: WorkflowSpec, search: tuple[str, ...]) -> PythonTools:
        """The resolved ``python:`` tools of ``spec`` (:func:`check_tool_imports` over this executor's own
        function objects, then imported from the folders ``search``).

        Raises:
            Deferred: a tool does not resolve here but another live executor serves it (its lease names the
                path: a ``reel.Worker``): the start is left to it (nak'ed, no reply).
            WorkflowInvalid: a tool does not resolve and no live executor serves it (naming the field).
        """
        try:
            return check_tool_imports(spec, self.tools, search=search)
        except WorkflowInvalid as exc:
            mine = self.tools or {}
            paths = {t.python for s in spec.steps if isinstance(s, AgentStep) for t in s.tools
                     if t.python is not None and t.python not in mine}
            served = await tools_served(self.infra.leases)
            elsewhere = sorted(p for p in paths if served.get(p, set()) - {self.executor_id})
            if elsewhere:
                raise Deferred(f"left to the executor serving {', '.join(elsewhere)}") from None
            raise WorkflowInvalid(f"{exc.message}; no live executor serves it either (a reel.Worker serving a "
                                  "function names it in its lease: `reel status`)") from exc

    async def resume(self, resume: ResumeRun, delivery: Delivery) -> Then:
        """Reply, then drive an existing run (after a rewind, or recovery) until it rests.

        Raises:
            RunNotFound: there is no such run (refused before anything else; the drive loads it).
            InvalidCommand: a keyed resume names another run in its subject.
        """
        self._check_keyed(delivery, resume.run_id)
        if await self.log.head(resume.run_id) is None:
            raise RunNotFound(f"no run {resume.run_id!r}", run_id=resume.run_id)
        return Then(Reply(ok=True, run_id=resume.run_id), lambda: self._drive_until_rest(resume.run_id, "resume"))

    async def _drive_until_rest(self, run_id: str, kind: str, state: RunState | None = None) -> Ack:
        if run_id in self._driving:  # this process drives it already: make that loop look once more
            self._driving[run_id] = True
            log.info("run.already_driving", command=kind)
            return Ack.ACK
        self._driving[run_id] = False
        try:
            while True:
                rested = await self.drive(run_id, state)
                if rested is not None and has_open_intent(rested):  # any intent of ours left open is abandoned
                    await self._abandon_orphans(rested)
                state = None  # a second look re-reads the run
                if not self._driving[run_id]:
                    if rested is not None and rested.status in FINISHED and isinstance(rested.workspace, BlobRef):
                        await self.attempts.workspaces.forget(run_id)
                    return Ack.ACK
                self._driving[run_id] = False
        except HandedBack:
            return Ack.NAK  # redelivered at once to another instance, which takes over from the log
        except OwnedElsewhere:  # a duplicate while its live owner holds it: back to the queue, with backoff
            return Ack.NAK
        except ToolsUnserved as exc:  # it waits for a worker: back to the queue (a worker takes it), named in our lease
            now = now_ms()
            self.unserved.update(dict.fromkeys(exc.paths, now))
            log.warning("run.waiting_for_worker", tools=list(exc.paths), reason=exc.reason[:300])
            return Ack.NAK
        except LeaseLost:  # this executor may no longer write: the run goes to one that holds its lease
            log.warning("run.lease_lost", command=kind)
            return Ack.NAK
        except RunCorrupt as exc:  # no executor can drive it: never redeliver
            bad = exc.corruption
            log.error("run.corrupt", command=kind, lsn=bad.lsn, kind=bad.kind, reason=bad.reason)
            return Ack.TERM
        except Exception:  # an attempt of ours may be left open: resolved once settled (services/executor/orphans.py)
            self.orphans.crashed.add(run_id)
            raise
        finally:
            del self._driving[run_id]

    def waiting_for(self) -> dict[str, int]:
        """The ``python:`` paths runs waited for here in the last :data:`UNSERVED_KEEP_MS` (``path`` → epoch ms
        of the last wait): named in this executor's lease as ``waiting_for`` (``reel status``)."""
        cutoff = now_ms() - UNSERVED_KEEP_MS
        for path in [p for p, at in self.unserved.items() if at < cutoff]:
            del self.unserved[path]
        return dict(self.unserved)

    @property
    def driving(self) -> Container[str]:
        """The runs a drive of this executor holds now."""
        return self._driving.keys()

    async def _abandon_orphans(self, state: RunState) -> None:
        """Resolve our own settled intents of a run whose drive ended (:meth:`Orphans.settle`); a failure
        leaves the run to :meth:`Orphans.tend_loop`."""
        try:
            await self.orphans.settle(state)
        except RunCorrupt:
            raise
        except Exception as exc:
            log.warning("attempt.abandon_failed", error=repr(exc)[:300])
            self.orphans.crashed.add(state.run_id)

    async def _same_workflow(self, ref: BlobRef, spec: WorkflowSpec) -> bool:
        """Whether the workflow stored under ``ref`` is ``spec`` though its body's sha256 differs: a Reel version
        that encodes a workflow otherwise (a field order, a new field at its default) made the key's run, and a
        start with that key after an upgrade is the same start. ``False`` if that workflow no longer reads."""
        try:
            return await self.specs.load(ref) == spec
        except ReelError as exc:
            if exc.retryable:  # the store did not answer: the start is retried, not refused
                raise
            log.info("run.workflow_unreadable", sha256=ref.sha256[:12], error=exc.message[:200])
            return False

    async def _spec_of_command(self, start: StartRun) -> WorkflowSpec:
        if (start.workflow is None) == (start.workflow_ref is None):
            raise InvalidCommand("start needs exactly one of `workflow` or `workflow_ref`")
        if start.workflow is not None:
            return validate_workflow(start.workflow)
        assert start.workflow_ref is not None
        return await self._spec_of_ref(start.workflow_ref)

    async def _spec_of_ref(self, ref: BlobRef) -> WorkflowSpec:
        """The workflow a start command sends by reference; errors name `$.workflow_ref`.

        Raises:
            InvalidCommand: ``sha256`` is not a sha256 hex digest.
            BlobMissing: the blob store has no such blob (BlobCorrupt: the object under that name is not it).
            WorkflowInvalid: the blob is not a valid workflow.
        """
        if not _SHA256_HEX.fullmatch(ref.sha256):
            raise InvalidCommand(f"workflow_ref.sha256 must be 64 lowercase hex digits, got {ref.sha256[:80]!r}"
                                 " (at `$.workflow_ref.sha256`)")
        try:
            return await self.specs.load(ref)
        except BlobMissing as exc:
            raise type(exc)(f"workflow_ref: {exc.message}; upload the workflow first (at `$.workflow_ref`)") from exc


def _budget(spec: WorkflowSpec, default: Budget | None) -> Budget | msgspec.UnsetType:
    """The run's budget: the workflow's limits over the namespace's ``default``; unset when it has none."""
    own = spec.budget if isinstance(spec.budget, Budget) else Budget()
    budget = own.over(default)
    return budget if budget.limits else msgspec.UNSET
