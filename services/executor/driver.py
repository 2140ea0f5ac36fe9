"""Driving one run: plan → perform → commit, on the state the executor materialized.

:func:`reel.shared.core.run.planning.next_action` decides from the folded state; the
:class:`Driver` performs the action (claim, an attempt, entering Verifying), applies
its commit to the state it holds and asks again, until the run rests or another
executor owns it. The state is loaded once per drive and then kept up to date
commit by commit (:func:`reel.shared.application.fenced.commit_decided` is handed it): the run is
never re-read on the hot path. When a commit planned on that state loses the fence
(another writer committed first), the result is the Decided that committed nothing, carrying the state
refreshed to the run's head: the driver yields if another executor owns the run,
else plans again.

Inside an agent step several attempts run at once (a turn's tool calls): the
actions are :class:`~reel.services.executor.agent.AgentRun`'s, which keeps them as tasks
of this drive; ``next_action`` is told which are in flight, and ``Wait`` records
what finished. Before the drive returns or hands the run back, every attempt in
flight is recorded (never abandoned with its intent open) — unless the run was **lost**: another executor claimed
it while this one still held its lease (a fence lost to that claim, or the takeover found in the run's log by the
watch below, which fires ``lost``). Then the tool process groups of this run's drive are SIGKILLed at once (those
of this run only: the drive tracks its own, :func:`reel.shared.proc.group.tracked_groups`), its tasks are cancelled,
and nothing more is written for it — no commit (:class:`~reel.services.executor.attempts.Attempts` refuses any but
a claim on a run another executor owns), no outcome marker, no snapshot; its new owner resolves the open intents.

Each drive watches its run (:meth:`~reel.shared.nats.control.ControlHub.watch`, registered before
the run is loaded): a cancel, or the executor's drain deadline, stops the attempts in flight
at once (services/executor/interrupts.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from reel.shared.application.fenced import Decided
from reel.shared.application.toolimports import tool_search_path, unresolved_paths
from reel.shared.application.workflows import WorkflowCache
from reel.shared.core.errors import RunNotFound, WorkflowInvalid
from reel.shared.core.ports import EventLog
from reel.shared.core.run import planning as plan
from reel.shared.core.run import timers
from reel.shared.core.run.events import (
    AnyEvent,
    AttemptDispatched,
    AttemptSucceeded,
    RunSleeping,
    RunVerifying,
    RunWoke,
)
from reel.shared.core.run.state import DRIVABLE, RunState
from reel.shared.core.workflow.spec import AgentStep, WorkflowSpec
from reel.shared.nats.blobstore import ref_for
from reel.shared.nats.control import Cause, ControlHub, Interrupt
from reel.shared.proc.group import kill_groups, tracked_groups
from reel.shared.runtime.clock import now_ms

from .agent import AgentRun
from .attempts import Attempts, on_head
from .interrupts import RunLost, lost
from .plain import Chained, PlainSteps, Prepared

log = structlog.get_logger("reel.executor")


def _kill_if_lost(fired: asyncio.Future[Cause], groups: set[int]) -> None:
    """The moment a drive's interrupt fires ``lost``: SIGKILL the tool process groups of that run's drive (before
    its loop runs again: this callback was added first)."""
    if not fired.cancelled() and fired.result() == "lost":
        log.error("run.lost_tools_killed", process_groups=kill_groups(groups))


def _lost(state: RunState, groups: set[int]) -> RunState:
    """A drive that lost its run: its tools killed (again: a group started since), nothing written; the state."""
    log.warning("run.lost", process_groups=kill_groups(groups), known_lsn=state.head_lsn)
    return state


class HandedBack(Exception):
    """This executor is stopping: the run goes back to the queue (its command is nak'ed) between steps."""


class ToolsUnserved(Exception):
    """A run's ``python:`` tools do not resolve in this executor (a ``reel.Worker``'s function, with no worker
    here): the run waits — its command is nak'ed (redelivered with backoff, to any executor: a worker serving
    them takes it) and this executor's lease names the paths (``reel status``).

    Attributes:
        run_id: the run; paths: the ``module:function`` paths it needs; reason: the resolution error.
    """

    def __init__(self, run_id: str, paths: tuple[str, ...], reason: str) -> None:
        super().__init__(f"run {run_id} waits for an executor serving {', '.join(paths) or 'its tools'}: {reason}")
        self.run_id, self.paths, self.reason = run_id, paths, reason


class OwnedElsewhere(Exception):
    """Another executor owns the run and holds its lease (:func:`reel.shared.core.run.planning.claim_defers`): this
    executor does not claim it; the command is nak'ed (redelivered with backoff, until its owner takes the
    command or the owner's lease lapses)."""

    def __init__(self, run_id: str, owner: str) -> None:
        super().__init__(f"run {run_id} is driven by live executor {owner}")
        self.run_id, self.owner = run_id, owner


def uses_mcp(spec: WorkflowSpec) -> bool:
    """Whether an agent step of ``spec`` has an ``mcp:`` entry."""
    return any(t.type == "mcp" for s in spec.steps if isinstance(s, AgentStep) for t in s.tools)


async def mcp_expanded(spec: WorkflowSpec) -> WorkflowSpec:
    """``spec`` with its ``mcp:`` entries expanded into the tools their servers list (services/executor/mcptools.py;
    ``spec`` itself when it has none).

    Raises:
        WorkflowInvalid: a server cannot be started or listed (naming the entry), or the ``mcp`` package (the
            optional extra ``reel[mcp]``) is not installed.
    """
    if not uses_mcp(spec):
        return spec
    try:
        from . import mcptools  # the mcp SDK is an optional extra
    except ImportError as exc:
        raise WorkflowInvalid(f"the workflow names mcp tools but this executor cannot load the mcp SDK ({exc}):"
                              " install reel[mcp]") from None
    return await mcptools.servers().expand(spec)


async def with_mcp_tools(run_id: str, spec: WorkflowSpec) -> WorkflowSpec:
    """:func:`mcp_expanded` for a drive.

    Raises:
        ToolsUnserved: a server cannot be started or listed now (the run waits: its command is redelivered,
            with backoff; no tool path is named in the lease — no worker serves an MCP server).
    """
    try:
        return await mcp_expanded(spec)
    except WorkflowInvalid as exc:
        raise ToolsUnserved(run_id, (), exc.message) from exc


class Driver:
    """Drives runs for one executor (``attempts.executor_id``) until they rest.

    Args:
        stopping: set on shutdown: the attempt in flight finishes (until the drain deadline fires the
            ``control`` hub's interrupts), then runs are handed back.
        control: the executor's watch of its runs' control subjects (``None``: nothing interrupts an attempt).
        inline_max: bodies of at most this many bytes ride in their refs (``REEL_INLINE_MAX_BYTES``).
        owner_alive: whether an executor id holds a lease (shared/nats/leases.py ``executor_alive``), asked
            before claiming a run another executor owns; ``None``: every owner is taken for gone.
    """

    def __init__(self, log: EventLog, specs: WorkflowCache, attempts: Attempts, *,
                 stopping: asyncio.Event | None = None, control: ControlHub | None = None,
                 inline_max: int = 0, owner_alive: Callable[[str], Awaitable[bool]] | None = None) -> None:
        self.log, self.specs, self.attempts = log, specs, attempts
        self._owner_alive = owner_alive
        self.executor_id = attempts.executor_id
        self.stopping, self.control = stopping, control
        self.bodies = attempts.bodies  # the executor's one body cache
        self.plain = PlainSteps(attempts, inline_max=inline_max, stopping=stopping)

    async def drive(self, run_id: str, state: RunState | None = None) -> RunState | None:
        """Drive ``run_id`` until it rests (Verifying, Completed, Cancelled) or another executor owns it.

        ``state``: the run as this executor just committed it (its creation): the drive starts from it
        instead of reading the run (a commit of anyone else since then loses the fence and refreshes).

        Returns the state the executor materialized when it stopped driving (a lost run: the last one it knew), or
        ``None`` if there is no such run.

        Raises:
            HandedBack: the executor is stopping (between two steps; the attempts in flight recorded first).
            OwnedElsewhere: a live executor owns the run (nothing was committed).
            LeaseLost: this executor lost its lease (nothing more was written; its tools were killed).
            ConcurrencyConflict: an outcome lost the fence on every try of the one retry policy.
        """
        structlog.contextvars.bind_contextvars(run_id=run_id)
        with tracked_groups() as groups:  # the tool process groups of this run's drive (killed if it is lost)
            if self.control is None:
                return await self._drive(run_id, None, state, groups)
            await self.control.start()
            with self.control.watch(run_id) as interrupt:  # before the load: a cancel committed earlier is in it
                interrupt.fired.add_done_callback(lambda fired: _kill_if_lost(fired, groups))
                return await self._drive(run_id, interrupt, state, groups)

    async def _drive(self, run_id: str, interrupt: Interrupt | None, state: RunState | None,
                     groups: set[int]) -> RunState | None:
        if state is None:
            try:
                state = await self.log.load(run_id)
            except RunNotFound:
                log.warning("run.not_found")
                return None
        spec = await with_mcp_tools(run_id, await self.specs.load(state.workflow_ref))
        try:
            tools = await self.specs.python_tools(state.workflow_ref, state.tool_source_dir)
        except WorkflowInvalid as exc:  # resolved at its start elsewhere: a function only a worker serves
            missing = unresolved_paths(spec, self.specs.registered, search=tool_search_path(state.tool_source_dir))
            raise ToolsUnserved(run_id, missing, exc.message) from exc
        agents = AgentRun(self.attempts, run_id, spec, tools, bodies=self.bodies, stopping=self.stopping,
                          interrupt=interrupt, inline_max=self.plain.inline_max)
        async with agents:  # structured: no attempt of this run outlives the drive
            try:
                return await self._loop(state, spec, agents, interrupt)
            except RunLost as exc:
                return _lost(exc.state, groups)

    async def _loop(self, state: RunState, spec: WorkflowSpec, agents: AgentRun,
                    interrupt: Interrupt | None) -> RunState:
        held = False  # this drive has held the run (claimed it, or found it this executor's)
        prepared: Prepared | None = None  # an intent that rode the last outcome's commit: its body runs now
        cursor = plan.Cursor()
        while True:
            if lost(interrupt):
                raise RunLost(state)
            held = held or state.executor_id == self.executor_id
            start = cursor.at(state)  # advanced on every state the log gave (O(1) per step)
            if self.control is not None and state.status != "cancelled":
                self.control.seen(state.run_id, state.head_lsn)  # the cancel look goes on from here
            if prepared is not None:
                done = await self._perform(state, spec, prepared.action, agents, interrupt, cursor, prepared)
                prepared = None
                if isinstance(done, Chained):
                    state, prepared = done.state, done.next
                else:
                    state = done if isinstance(done, RunState) else done.state
                continue
            action = plan.next_action(state, self.executor_id, agents.in_flight, start=start)
            if isinstance(action, plan.Rest):
                state = await agents.drain(state)
                log.debug("run.resting", status=action.status, lsn=state.head_lsn)
                return state
            if self.stopping is not None and self.stopping.is_set():
                state = await agents.drain(state)
                log.info("run.handed_back", lsn=state.head_lsn, reason="executor stopping")
                raise HandedBack(state.run_id)
            if isinstance(action, plan.Claim):
                if held:  # we held it and another executor took it over: never take it back
                    raise RunLost(state)
                await self._check_owner(state)
            done = await self._perform(state, spec, action, agents, interrupt, cursor)
            if isinstance(done, Chained):
                state, prepared = done.state, done.next
                continue
            if not isinstance(done, Decided):
                state = done
                continue
            state = done.state  # someone else committed first: the run as it is now
            if state.executor_id not in (None, self.executor_id) and state.status in DRIVABLE:
                if held:  # it was ours: lost at this fence
                    raise RunLost(state)
                log.info("run.yielded", owner=state.executor_id)
                return await agents.drain(state)

    async def _check_owner(self, state: RunState) -> None:
        """Raise :class:`OwnedElsewhere` if ``state``'s owner (another executor) holds its lease."""
        owner = state.executor_id
        if owner is None or owner == self.executor_id or self._owner_alive is None:
            return
        if plan.claim_defers(state, self.executor_id, await self._owner_alive(owner)):
            log.info("run.owned_elsewhere", owner=owner, lsn=state.head_lsn)
            raise OwnedElsewhere(state.run_id, owner)

    async def _perform(self, state: RunState, spec: WorkflowSpec, action: plan.Action, agents: AgentRun,
                       interrupt: Interrupt | None, cursor: plan.Cursor, prepared: Prepared | None = None,
                       ) -> RunState | Decided | Chained:
        """Perform one action planned on ``state``: the state after it (:class:`Chained` when the next
        attempt's intent rode its commit), or the Decided that committed nothing if it lost the fence."""
        if isinstance(action, plan.Claim):
            claim = await self.plain.claim(state, spec, cursor)
            if not isinstance(claim, Decided):
                log.info("run.claimed", executor_id=self.executor_id,
                         lsn=(claim.state if isinstance(claim, Chained) else claim).head_lsn)
            return claim
        if isinstance(action, plan.EnterVerifying):
            events = [RunVerifying(branch_id=action.branch_id, at_ms=now_ms())]
            done = await self.attempts.commit(state, on_head(state.head_lsn, events))
            if isinstance(done, Decided):
                return done
            log.info("run.verifying", branch_id=action.branch_id, lsn=done.state.head_lsn)
            # in one round trip: a verifier that gets the trigger before the snapshot reads the log instead
            await asyncio.gather(self._snapshot(done.state, done.commit_id),
                                 self.attempts.trigger_verification(done.state))
            return done.state
        if isinstance(action, plan.Sleep | plan.FinishSleep):
            return await self._timer(state, spec, action)
        if not isinstance(action, plan.Dispatch):  # inside an agent step (services/executor/agent.py)
            return await agents.perform(state, action)
        structlog.contextvars.bind_contextvars(step_id=action.step_id, attempt=action.attempt,
                                               branch_id=action.branch_id)
        try:
            return await self.plain.run(state, spec, action, cursor, prepared, interrupt)
        finally:
            structlog.contextvars.unbind_contextvars("step_id", "attempt", "branch_id")

    async def _timer(self, state: RunState, spec: WorkflowSpec, action: plan.Sleep | plan.FinishSleep,
                     ) -> RunState | Decided:
        """Set a timer (``run_sleeping``; with its ``run_woke`` when the time has passed already) or record a woken
        sleep step's attempt (intent and success in one commit): the state after, or the Decided that committed
        nothing (the run moved)."""
        now = now_ms()
        events: list[AnyEvent]
        if isinstance(action, plan.Sleep):
            wake = action.wake_ms if action.wake_ms is not None else spec.sleep(action.step_id).wake_ms(now)
            events = [RunSleeping(branch_id=action.branch_id, step_id=action.step_id, wake_ms=wake,
                                  reason=action.reason, at_ms=now)]
            if wake <= now:
                events.append(RunWoke(branch_id=action.branch_id, step_id=action.step_id, at_ms=now))
        else:
            body = timers.sleep_output(action.wake_ms, action.woke_ms)
            events = [AttemptDispatched(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                                        executor_id=self.executor_id, at_ms=now),
                      AttemptSucceeded(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                                       output_ref=ref_for(body, media_type="application/json", inline_max=max(
                                           len(body), self.plain.inline_max)), at_ms=now)]
        done = await self.attempts.commit(state, on_head(state.head_lsn, events))
        if isinstance(done, Decided):
            return done
        if isinstance(action, plan.Sleep):
            log.info("run.sleeping", step_id=action.step_id, reason=action.reason, wake_ms=events[0].wake_ms
                     if isinstance(events[0], RunSleeping) else None, woke=len(events) > 1, lsn=done.state.head_lsn)
        else:
            log.info("attempt.succeeded", step_id=action.step_id, attempt=action.attempt, slept=True,
                     late_ms=max(0, action.woke_ms - action.wake_ms), lsn=done.state.head_lsn)
        return done.state

    async def _snapshot(self, state: RunState, commit_id: str) -> None:
        """Snapshot the state every verifier of this run pins (best effort: readers fall back to the log)."""
        try:
            store = await self.log.snapshots()
            if store is not None:
                await store.save(state, commit_id)
        except Exception as exc:  # a snapshot is only a shortcut; the run is already safely in Verifying
            log.warning("run.snapshot_failed", lsn=state.head_lsn, error=str(exc))
