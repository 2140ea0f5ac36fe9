"""Reusable integration scenarios for the mutator services (cancel, rewind, recovery).

The main one is :func:`crashed_attempt_scenario`, the realistic recovery case (an
executor killed after its side effect, before committing the outcome), built with real processes on the real server:

1. a real executor **subprocess** (``python -m reel.services.executor``) started with
   ``REEL_EXECUTOR_CRASH_AT=work:2:after_output`` runs the workflow of
   :func:`crashed_attempt_workflow`: step ``prepare`` succeeds, step ``work``
   attempt 1 fails (scripted, retryable), attempt 2 is dispatched, its output is
   stored (blob + outcome marker in the outcomes KV) and the process ``os._exit``s
   before committing the outcome;
2. rendezvous, no fixed sleeps: the process exit is awaited, then the leases KV
   is polled until the dead executor's lease entry has expired;
3. an in-process executor gets a ``ResumeRun`` and supersedes the lost attempt
   with attempt 3 (succeeds), and the run commits ``run_verifying``;
4. the function returns with the run **resting in Verifying** and attempt 2
   **still dispatched** (superseded); nothing has resolved it yet.

Usage (the snapshot-barrier recovery test does exactly this)::

    crash = await crashed_attempt_scenario(infra, cfg, client, verifiers=[{...}])
    # a verifier may now hold a view pinned at crash.verifying_lsn; then:
    async with running(recovery_serve, infra, cfg, sweep=False):
        reply = await client.command("recover", encode(RecoverRuns(run_id=crash.run_id)))
    # attempt crash.lost_attempt of crash.step_id is now succeeded(recovered=True),
    # committed above crash.verifying_lsn, with output_ref == crash.lost_output_ref

Rules for callers: **no other executor may consume this namespace's commands while
the scenario runs** (do not use the ``executor`` fixture in the same test: an
in-process executor could take the start command and never crash); and start
the recovery service only *after* it returns, or its sweep may resolve the lost
attempt before the run reaches Verifying. A verifier service may run throughout.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from nats.js.errors import KeyNotFoundError

from reel.shared.core.run.events import AnyEvent, BlobRef, RunCreated, StepDecl
from reel.shared.core.run.state import AttemptState, RunState
from reel.shared.core.wire.commands import ResumeRun, encode
from reel.shared.core.wire.subjects import outcome_key
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import REPO, running

STEP = "work"
LOST_ATTEMPT = 2
WINNING_ATTEMPT = 3
LOST_OUTPUT = "answer of attempt 2 (stored, never committed)"
WINNING_OUTPUT = "answer of attempt 3"
POLL_S = 0.05


@dataclass(frozen=True)
class CrashedAttempt:
    """Where :func:`crashed_attempt_scenario` left the run.

    Attributes:
        run_id: the run, resting in ``verifying`` on branch ``main``.
        step_id: the step with the lost attempt (``work``, the workflow's last step).
        lost_attempt: the attempt still ``dispatched`` (2); its executor is dead and
            its output is stored: ``lost_output_ref`` is in the outcomes KV under
            ``marker_key`` and in the blob store.
        winning_attempt: the attempt that superseded it and succeeded (3).
        failed_attempt: the scripted failure before it (1).
        lost_executor_id: the dead executor (its lease has expired).
        verifying_lsn: the LSN of the ``run_verifying`` commit (the snapshot LSN).
        state: the folded state at ``verifying_lsn``.
    """

    run_id: str
    step_id: str
    lost_attempt: int
    winning_attempt: int
    failed_attempt: int
    lost_executor_id: str
    lost_output_ref: BlobRef
    marker_key: str
    verifying_lsn: int
    state: RunState


# ---- polling rendezvous ----------------------------------------------------------------------


async def wait_until(check: Callable[[], Awaitable[Any]], *, timeout_s: float, what: str) -> Any:
    """Poll ``check`` until it returns something truthy; return that.

    Raises:
        AssertionError: ``what`` did not happen within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(POLL_S)


async def wait_state(event_log: JetStreamEventLog, run_id: str, pred: Callable[[RunState], bool], *,
                     timeout_s: float = 30.0, what: str = "the run state") -> RunState:
    """Poll the run (cold fold each time its head moves) until ``pred(state)``; return that state."""
    last = [-1]

    async def check() -> RunState | None:
        head = await event_log.head(run_id)
        if head is None or head[0] == last[0]:
            return None
        last[0] = head[0]
        state = await event_log.load(run_id)
        return state if pred(state) else None

    result: RunState = await wait_until(check, timeout_s=timeout_s, what=what)
    return result


async def head_lsn(event_log: JetStreamEventLog, run_id: str) -> int:
    """The run's head LSN (0 if it has no commit)."""
    head = await event_log.head(run_id)
    return 0 if head is None else head[0]


async def lease_alive(infra: Infra, executor_id: str) -> bool:
    """True while ``executor_id`` has a lease entry with a body in the leases KV."""
    try:
        entry = await infra.leases.get(executor_id)
    except KeyNotFoundError:
        return False
    return bool(entry.value)


def attempt_of(state: RunState, step_id: str, attempt: int, branch_id: str | None = None) -> AttemptState:
    """One attempt record of the folded state (default: the active branch)."""
    for a in state.branches[branch_id or state.active_branch].attempts.get(step_id, []):
        if a.attempt == attempt:
            return a
    raise KeyError(f"{step_id}#{attempt}")


# ---- hand-made runs (real commits on the real log; for validation tests) ------------------


async def commit_events(event_log: JetStreamEventLog, run_id: str, *events: AnyEvent, writer: str = "test") -> int:
    """Commit ``events`` to ``run_id`` fenced on its current head; returns the LSN."""
    return await event_log.commit(run_id, list(events), expected_lsn=await head_lsn(event_log, run_id),
                                  writer=writer)


async def create_manual_run(event_log: JetStreamEventLog, run_id: str, steps: Sequence[tuple[str, int]]) -> int:
    """Commit a ``run_created`` for ``steps`` ((step_id, max_attempts) tool steps); returns its LSN."""
    created = RunCreated(
        run_id=run_id, branch_id="main", workflow_name="manual", created_ms=0,
        workflow_ref=BlobRef(sha256="0" * 64, size_bytes=0, media_type="application/json"),
        steps=tuple(StepDecl(step_id=s, kind="tool", max_attempts=n) for s, n in steps),
    )
    return await event_log.commit(run_id, [created], expected_lsn=0, writer="test")


# ---- the crashed-attempt scenario ---------------------------------------------


def crashed_attempt_workflow(verifiers: Sequence[Mapping[str, Any]] = ()) -> WorkflowSpec:
    """``prepare`` (tool) then ``work`` (model, 3 attempts: fails, stores-then-crashes, succeeds)."""
    return parse_workflow({
        "name": "crashed-attempt",
        "steps": [
            {"kind": "tool", "id": "prepare", "tool": {"type": "scripted", "outputs": ["prepared notes"]}},
            {"kind": "model", "id": STEP, "max_attempts": 3, "instructions": "Answer using the notes.",
             "model": {"adapter": "scripted", "outputs": [
                 {"error": "context_missing", "message": "needed the notes"}, LOST_OUTPUT, WINNING_OUTPUT]},
             "context": [{"id": "notes", "from_step": "prepare", "kind": "output", "priority": 1.0},
                         {"id": "scratch", "text": "scratch pad", "kind": "scratch"}],
             "policy": {"exclude_kinds": ["scratch"]}},
        ],
        "verifiers": list(verifiers),
    })


async def crash_executor_mid_attempt(
    infra: Infra, cfg: Config, client: ReelClient, *, verifiers: Sequence[Mapping[str, Any]] = (),
    crash_attempt: int = LOST_ATTEMPT, timeout_s: float = 30.0,
) -> tuple[str, str]:
    """Phase 1 only: run the workflow in an executor subprocess that dies after storing
    ``work#crash_attempt``'s output; returns ``(run_id, dead_executor_id)`` once its lease is gone.

    The run is left ``running`` with that attempt ``dispatched`` and nobody driving it.
    """
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"reel-crashing-executor-{cfg.names.namespace}.log"
    env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace,
           "REEL_LEASE_TTL_S": str(cfg.lease_ttl_s), "REEL_STORAGE": cfg.storage, "REEL_REPLICAS": str(cfg.replicas),
           "REEL_EXECUTOR_CRASH_AT": f"{STEP}:{crash_attempt}:after_output", "REEL_LOG_FORMAT": "json",
           "REEL_COMMAND_ACK_WAIT_S": "120"}  # the dead process's start command must not come back mid-test
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.executor", cwd=REPO, env=env,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=log_file)
    try:
        reply = await client.start(crashed_attempt_workflow(verifiers), timeout_s=timeout_s)
        assert reply.ok and reply.run_id, reply
        code = await asyncio.wait_for(proc.wait(), timeout_s)
    except Exception as exc:
        raise AssertionError(f"the crashing executor did not run as scripted ({exc!r}); "
                             f"its log ({log_path}): {log_path.read_text()[-3000:]}") from exc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 137, f"executor exited {code}, not the injected crash; log: {log_path.read_text()[-3000:]}"
    log_path.unlink(missing_ok=True)
    state = await client.log.load(reply.run_id)
    lost = attempt_of(state, STEP, crash_attempt)
    assert lost.status == "dispatched", lost
    await wait_until(lambda: _not(lease_alive(infra, lost.executor_id)), timeout_s=cfg.lease_ttl_s * 5 + 5,
                     what=f"the lease of dead executor {lost.executor_id} to expire")
    return reply.run_id, lost.executor_id


async def _not(value: Awaitable[bool]) -> bool:
    return not await value


async def crashed_attempt_scenario(
    infra: Infra, cfg: Config, client: ReelClient, *, verifiers: Sequence[Mapping[str, Any]] = (),
    timeout_s: float = 30.0,
) -> CrashedAttempt:
    """The crashed-attempt recovery case, ending with the run in Verifying and the lost attempt dispatched.

    Args:
        verifiers: verifier specs (workflow JSON objects) configured on the workflow.

    Raises:
        AssertionError: a phase did not happen as scripted (the message says which).
    """
    from reel.services.executor.app import serve as executor_serve

    run_id, dead = await crash_executor_mid_attempt(infra, cfg, client, verifiers=verifiers, timeout_s=timeout_s)
    async with running(executor_serve, infra, cfg):
        reply = await client.command("resume", encode(ResumeRun(run_id=run_id)), timeout_s=timeout_s)
        assert reply.ok, reply
        state = await wait_state(client.log, run_id, lambda s: s.status != "running", timeout_s=timeout_s,
                                 what="the run to rest after the resumed executor's attempt 3")
    assert state.status == "verifying", state.status
    lost, won, failed = (attempt_of(state, STEP, n) for n in (LOST_ATTEMPT, WINNING_ATTEMPT, 1))
    assert (failed.status, lost.status, won.status) == ("failed", "dispatched", "succeeded")
    key = outcome_key(run_id, "main", STEP, LOST_ATTEMPT)
    ref = msgspec.json.decode((await infra.outcomes.get(key)).value or b"", type=BlobRef)
    assert state.verifying_lsn == state.head_lsn
    return CrashedAttempt(
        run_id=run_id, step_id=STEP, lost_attempt=LOST_ATTEMPT, winning_attempt=WINNING_ATTEMPT, failed_attempt=1,
        lost_executor_id=dead, lost_output_ref=ref, marker_key=key, verifying_lsn=state.head_lsn, state=state,
    )
