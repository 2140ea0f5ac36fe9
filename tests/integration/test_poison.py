"""Poison isolation on a real nats-server: one test per poison case.

A plain client — not Reel — publishes onto a live run's event subject, or into the blob
bucket, while the executor, verifier, recovery and cancel services run and other runs are
in flight on the same executor. Whatever the poison, each test asserts (:func:`isolated`):

* the poisoned run reads **corrupt at the poisoned LSN, with the reason** (the log cases),
  folded as of its last good commit, and no writer commits on top of it (a cancel is refused);
* ``reel ls`` exits 0 and lists it as corrupt and every other run normally; ``reel show``
  says so in one line;
* recovery's ``recover {}`` answers (twice, with sweeps between) and logged the run once;
* the executor does not loop: every command it got was delivered exactly once (consumer
  counters: deliveries = commands, no redelivery, nothing pending);
* the other runs complete, passed.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from reel.services.cancel.app import serve as cancel_serve
from reel.services.executor.app import serve as executor_serve
from reel.services.recovery.app import serve as recovery_serve
from reel.services.verifier.app import serve as verifier_serve
from reel.shared.core.run.events import Verdict
from reel.shared.core.run.integrity import RunCorrupt
from reel.shared.core.run.state import RunState
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore, ref_for
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.nats.subjectlog import SubjectLog
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import wait_state, wait_until
from tests.integration.test_cli import reel
from tests.logcapture import info_logs
from tests.support.payloads import POISON_COMMITS

STORED = "-" * 4096  # makes an output too large to ride inline in its ref: it is stored in the blob bucket


def gated(gate: Path, *, first: str = "hello", verifier: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run whose step ``a`` outputs ``first`` and whose step ``wait`` runs until ``gate`` exists."""
    return {"name": "gated", "steps": [
        {"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": first}},
        {"kind": "tool", "id": "wait", "tool": {"type": "command", "argv": [
            "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done; echo waited"]}}],
        "verifiers": [verifier or {"type": "output_regex", "step": "a", "pattern": "hello|planted"}]}


@dataclass
class World:
    """The services, a gate, and what the test did (see module doc)."""

    infra: Infra
    cfg: Config
    client: ReelClient
    log: JetStreamEventLog
    gate: Path
    logs: list[dict[str, Any]]
    commands: int = 0  # commands sent to the executor
    runs: list[str] = field(default_factory=list)

    async def start(self, spec: dict[str, Any]) -> str:
        reply = await self.client.start(parse_workflow(spec))
        self.commands += 1
        assert reply.ok and reply.run_id, reply
        self.runs.append(reply.run_id)
        return reply.run_id

    async def start_waiting(self, n: int = 3, **kw: Any) -> list[str]:
        """``n`` gated runs, each waiting in its ``wait`` step (its intent committed)."""
        runs = [await self.start(gated(self.gate, **kw)) for _ in range(n)]
        for run in runs:
            await wait_state(self.log, run, lambda s: "wait" in s.branches["main"].attempts,
                             what="the run to wait at its gate")
        return runs

    async def inject(self, run_id: str, body: bytes) -> int:
        """Publish ``body`` straight onto the run's event subject, as any NATS client can; its LSN."""
        return int((await self.infra.js.publish(self.cfg.names.events(run_id), body)).seq)

    def open_gate(self, suffix: str = "") -> None:
        Path(f"{self.gate}{suffix}").touch()

    def lines(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.logs if e["event"] == event]

    async def logged(self, event: str, n: int = 1) -> list[dict[str, Any]] | None:
        """The ``event`` lines once there are ``n`` (a rendezvous with a service's log), else ``None``."""
        found = self.lines(event)
        return found if len(found) >= n else None


@pytest.fixture
async def world(infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog,
                tmp_path: Path) -> AsyncIterator[World]:
    with info_logs() as logs:
        async with (running(executor_serve, infra, cfg), running(verifier_serve, infra, cfg),
                    running(recovery_serve, infra, cfg, sweep_interval_s=0.2), running(cancel_serve, infra, cfg)):
            yield World(infra, cfg, client, event_log, tmp_path / "gate", logs)


async def executor_quiet(w: World) -> None:
    """Every command the executor got is done with, each delivered exactly once."""
    async def quiet() -> Any:
        info = await w.infra.js.consumer_info(w.cfg.names.commands_stream, w.cfg.names.consumer("executor"))
        return info if info.num_ack_pending == 0 and info.num_pending == 0 else None

    info = await wait_until(quiet, timeout_s=30, what="the executor to be done with its commands")
    assert info.delivered.consumer_seq == w.commands, "a command was delivered more than once"
    assert not info.num_redelivered


async def isolated(w: World, poisoned: str | None, *, lsn: int | None = None, kind: str = "", words: str = "",
                   others: list[str]) -> RunState | None:
    """The checks of the module doc; returns the poisoned run's state as of its last good commit."""
    good = None
    if lsn is not None and poisoned is not None:
        with pytest.raises(RunCorrupt) as info:
            await w.log.load(poisoned)
        bad, good = info.value.corruption, info.value.state
        assert (bad.run_id, bad.lsn, bad.kind) == (poisoned, lsn, kind) and words in bad.reason, bad
        assert good is not None and good.head_lsn < lsn and good.status == "running"
        await wait_until(lambda: w.logged("run.corrupt"), timeout_s=30, what="the executor to give the run up")
        assert [(e["run_id"], e["lsn"]) for e in w.lines("run.corrupt")] == [(poisoned, lsn)], "one line, once"
        refused = await w.client.cancel(poisoned)  # a writer: never commits on top of the bad commit
        assert refused.error is not None and refused.error.code == "run_corrupt", refused
        assert (await w.log.subjects.head_msg(poisoned)) is not None
        assert (await w.infra.js.get_last_msg(w.cfg.names.events_stream, w.cfg.names.events(poisoned))).seq == lsn
    for run in others:
        done = await w.client.wait_for(run, ("completed",), timeout_s=60)
        assert done.outcome == "passed", (run, done.outcome, done.verdicts)
    await executor_quiet(w)

    for _ in range(2):  # recovery answers, each time after a sweep of every run with an open intent
        reply = await w.client.command("recover", b"{}", timeout_s=30)
        assert reply.ok, reply
    if lsn is not None:
        assert [(c["run_id"], c["lsn"]) for c in reply.detail["corrupt"]] == [(poisoned, lsn)]
        assert [e["run_id"] for e in w.lines("recovery.run_corrupt")] == [poisoned], "logged once, not per sweep"
    assert not w.lines("recovery.sweep_failed")

    code, out, err = await reel(w.cfg, "ls")
    assert code == 0 and "Traceback" not in out + err, (out, err)
    rows = {line.split()[1]: line for line in out.splitlines() if re.search(r"\br-[0-9a-f]{20}\b", line)}
    for run in others:
        assert re.search(r"\bcompleted\b.*\bpassed\b", rows[run]), rows[run]
    if lsn is not None and poisoned is not None:
        assert re.search(rf"\bcorrupt\b.*at lsn {lsn}: {kind}", rows[poisoned]), rows[poisoned]
        code, out, err = await reel(w.cfg, "show", poisoned)
        assert code == 1 and "Traceback" not in out + err, (out, err)
        assert err.strip().splitlines() == [err.strip()], "one line"
        assert err.startswith(f"error: run_corrupt: run {poisoned} is corrupt at LSN {lsn}: ")
    return good


async def test_garbage_bytes_on_a_runs_subject(world: World) -> None:
    poisoned, *others = await world.start_waiting()
    case = POISON_COMMITS["garbage"]
    lsn = await world.inject(poisoned, case.body(poisoned, others[0], 0))
    world.open_gate()
    await isolated(world, poisoned, lsn=lsn, kind=case.kind, words=case.words, others=others)


async def test_a_forged_run_completed_mid_run(world: World) -> None:
    """Schema-valid and on the right subject: is it detectable? Here, yes — only a verification job
    commits ``run_completed``, and only on a run ``verifying`` on that branch at that snapshot
    (shared/core/run/lifecycle.py), so mid-run it is an illegal transition: the run reads corrupt at
    that LSN, **not** completed/passed with steps never run, and stays so (the fold never takes a
    later commit above it). One that fits those rules cannot be told from the verifier's own by
    reading the log: keeping outsiders off ``reel.ev.>`` is the permissions' job (worktree `auth`).
    What isolation must guarantee either way — and what is asserted — is that the fold stays
    consistent (corrupt at one LSN, the state of the last good commit) and other runs are unaffected."""
    poisoned, *others = await world.start_waiting()
    case = POISON_COMMITS["forged_completed"]
    lsn = await world.inject(poisoned, case.body(poisoned, others[0], 0))
    world.open_gate()
    good = await isolated(world, poisoned, lsn=lsn, kind=case.kind, words=case.words, others=others)
    assert good is not None and good.outcome is None and good.status == "running"


async def test_a_commit_naming_another_run(world: World) -> None:
    poisoned, *others = await world.start_waiting()
    victim = others[0]
    case = POISON_COMMITS["foreign_run"]
    lsn = await world.inject(poisoned, case.body(poisoned, victim, 0))
    world.open_gate()
    await isolated(world, poisoned, lsn=lsn, kind=case.kind, words=f"{case.words} ({victim!r})", others=others)
    assert (await world.log.load(victim)).cancel_reason is None  # the run it names is untouched


async def test_an_illegal_transition(world: World) -> None:
    poisoned, *others = await world.start_waiting()
    case = POISON_COMMITS["never_dispatched"]
    lsn = await world.inject(poisoned, case.body(poisoned, others[0], 0))
    world.open_gate()
    await isolated(world, poisoned, lsn=lsn, kind=case.kind, words=case.words, others=others)


async def test_a_run_going_corrupt_while_verified_gets_error_verdicts(world: World) -> None:
    """The verifiers give it an ``error`` verdict each (published on the verdict subject, never recorded: no
    writer commits on top of a corrupt run); the verifier terms its job (no redelivery)."""
    slow = {"type": "command", "name": "slow", "argv": [
        "sh", "-c", f"while [ ! -e {world.gate}.v ]; do sleep 0.02; done; exit 0"]}
    poisoned = await world.start(gated(world.gate, verifier=slow))
    others = await world.start_waiting(2)
    world.open_gate()
    verifying = await world.client.wait_for(poisoned, ("verifying",), timeout_s=30)
    lsn = await world.inject(poisoned, b"garbage while verifying")
    world.open_gate(".v")
    verdicts = SubjectLog(world.infra.nc, world.cfg.names.verdicts_stream, world.cfg.names.verdict)

    async def published() -> list[Verdict]:
        return [msgspec.json.decode(b, type=Verdict) for _, b in await verdicts.read_raw(poisoned)]

    [verdict] = await wait_until(published, timeout_s=30, what="the error verdict")
    assert (verdict.verifier, verdict.status, verdict.snapshot_lsn) == ("slow", "error", verifying.verifying_lsn)
    assert verdict.reason.startswith(f"run {poisoned} is corrupt at LSN {lsn}: the commit does not decode")
    with pytest.raises(RunCorrupt) as info:
        await world.log.load(poisoned)
    assert info.value.corruption.lsn == lsn and info.value.state is not None
    assert info.value.state.verdicts == (), "published, never recorded"
    assert [e["error_verdicts"] for e in world.lines("verification.run_corrupt")] == [["slow"]]
    for run in others:
        assert (await world.client.wait_for(run, ("completed",), timeout_s=60)).outcome == "passed"
    vinfo = await world.infra.js.consumer_info(world.cfg.names.commands_stream, world.cfg.names.consumer("verifier"))
    assert not vinfo.num_redelivered and not vinfo.num_ack_pending, "the job's trigger was terminated, not retried"
    await isolated(world, None, others=others)


async def test_a_blob_written_under_the_wrong_sha(world: World, blobs: JetStreamBlobStore) -> None:
    """A client-written object is never taken for another: a start naming it is refused (``blob_corrupt``,
    with what the object holds), and an output overwritten under a live run reads as corrupt to the
    verifier (an ``error`` verdict naming it) — the run's log is fine, so the run is not corrupt."""
    workflow = json.dumps({"name": "w", "steps": [{"kind": "tool", "id": "a", "tool": {"type": "recorded",
                                                                                      "output": "x"}}]}).encode()
    claimed = ref_for(workflow, "application/json")
    await world.infra.blobs.put(claimed.sha256, b'{"name": "evil", "steps": []}')
    reply = await world.client.command("start", msgspec.json.encode({"workflow_ref": claimed}))
    world.commands += 1
    assert reply.error is not None and reply.error.code == "blob_corrupt", reply
    assert f"{claimed.sha256[:12]}… is corrupt: the object holds" in reply.error.message

    overwritten, = await world.start_waiting(1, first="hello, overwritten" + STORED)  # no other run shares it
    others = await world.start_waiting(2)
    output = (await world.log.load(overwritten)).branches["main"].attempts["a"][0].output_ref
    assert output is not None and output.inline is msgspec.UNSET, "stored in the bucket"
    await world.infra.blobs.put(output.sha256, b"forged")  # overwrites the run's stored output
    world.open_gate()
    done = await world.client.wait_for(overwritten, ("completed",), timeout_s=60)
    assert done.outcome == "error"
    [verdict] = done.verdicts
    assert verdict.status == "error" and f"blob {output.sha256[:12]}… is corrupt" in verdict.reason
    await isolated(world, None, others=others)


async def test_a_pre_existing_object_at_a_sha(world: World, blobs: JetStreamBlobStore) -> None:
    """An object planted under sha256(X) before a run stores X never costs the run X: the writer finds it
    corrupt and replaces it (never an intact one); the run completes with X readable."""
    body = ("planted-output" + STORED).encode()
    planted = ref_for(body)
    await world.infra.blobs.put(planted.sha256, b"evil")
    poisoned, *others = await world.start_waiting(first=body.decode())
    output = (await world.log.load(poisoned)).branches["main"].attempts["a"][0].output_ref
    assert output is not None and output.sha256 == planted.sha256, "the run wrote X under the planted name"
    assert output.inline is msgspec.UNSET, "stored in the bucket"
    world.open_gate()
    done = await world.client.wait_for(poisoned, ("completed",), timeout_s=60)
    assert done.outcome == "passed", done.verdicts
    assert await blobs.get(output) == body
    assert [e["sha256"] for e in world.lines("blob.replaced_corrupt")] == [planted.sha256]
    await isolated(world, None, others=[poisoned, *others])
