"""Poison commands on every command subject of every service, crucible's included, on a real server.

A command that does not decode, has the wrong schema, or names an id that is not one
subject token is refused with a reason on its reply subject and acknowledged: each
command is delivered exactly once (the durable consumers' counters: deliveries =
commands, no redelivery, nothing pending), and every service still answers a
well-formed command afterwards. The verifier's triggers, which have no reply, are
terminated.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.js.errors import NotFoundError

from reel.services.cancel.app import serve as cancel_serve
from reel.services.crucible.app import serve as crucible_serve
from reel.services.executor.app import serve as executor_serve
from reel.services.recovery.app import serve as recovery_serve
from reel.services.rewind.app import serve as rewind_serve
from reel.services.verifier.app import serve as verifier_serve
from reel.shared.core.run.events import RunStarted
from reel.shared.core.run.ids import LSN, BranchId, RunId
from reel.shared.core.wire.commands import VerifyRun
from reel.shared.core.wire.limits import MAX_DEPTH
from reel.shared.crucible.names import CrucibleNames
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import commit_events, create_manual_run, wait_until
from tests.logcapture import info_logs
from tests.support.payloads import DEEP, GARBAGE, ask

WORKFLOW = {"name": "ok", "steps": [{"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": "x"}}]}

# service (durable name) → its subjects' suffixes → (poison bodies beyond GARBAGE, a good body and its answer)
ROUTES: dict[str, dict[str, tuple[list[bytes], bytes, str]]] = {
    "executor": {
        "start": ([b'{"workflow": {"name": 1}}', b'{"workflow_ref": {"sha256": "../x.>", "size_bytes": 1}}'],
                  msgspec.json.encode({"workflow": WORKFLOW}), "ok"),
        "resume": ([b'{"run_id": "*"}', b'{"run_id": "a.>"}'], b'{"run_id": "r-nope"}', "run_not_found"),
    },
    "cancel": {
        "cancel": ([b'{"run_id": ">"}', b'{"run_id": "r-1", "reason": 7}'], b'{"run_id": "r-nope"}', "run_not_found"),
        "respond": ([b'{"run_id": "*", "request_id": "q", "decision": "approve"}',
                     b'{"run_id": "r-1", "request_id": "q", "decision": "maybe"}'],
                    b'{"run_id": "r-nope", "request_id": "q", "decision": "approve"}', "run_not_found"),
    },
    "rewind": {"rewind": ([b'{"run_id": "r.*", "at_step": "a"}', b'{"run_id": "r-1", "at_lsn": "three"}'],
                          b'{"run_id": "r-nope", "at_step": "a"}', "run_not_found")},
    "recovery": {"recover": ([b'{"run_id": "*"}'], b"{}", "ok")},
    "crucible": {
        "crucible.run": ([b'{"config": 1}', b'{"config": {}, "session_id": "cs-1"}'], b'{"session_id": "cs-nope"}',
                         "invalid_command"),  # a run needs a config: the good command here is resume's
        "crucible.resume": ([b'{"session_id": ">"}', b'{"session_id": "cs.*"}', b'{"session_id": 3}'],
                            b'{"session_id": "cs-nope"}', "crucible_session_not_found"),
    },
}


@pytest.fixture
async def services(infra: Infra, cfg: Config) -> AsyncIterator[None]:
    async with (running(executor_serve, infra, cfg), running(cancel_serve, infra, cfg),
                running(rewind_serve, infra, cfg), running(recovery_serve, infra, cfg, sweep=False),
                running(crucible_serve, infra, cfg)):
        yield


async def test_poison_commands_are_refused_with_a_reason_and_never_redelivered(
        services: None, infra: Infra, cfg: Config, subtests: pytest.Subtests) -> None:
    sent: dict[str, int] = {}
    for service, subjects in ROUTES.items():
        for suffix, (poison, good, answer) in subjects.items():
            subject = cfg.names.command(suffix)
            for body in [*GARBAGE, *poison]:
                with subtests.test(f"{suffix}: {body[:40]!r}"):
                    reply = await ask(infra, subject, body, timeout_s=20)
                    sent[service] = sent.get(service, 0) + 1
                    assert reply.ok is False and reply.error is not None, reply
                    assert reply.error.code == "invalid_command", reply.error
                    assert reply.error.message.strip(), "a reason"
            reply = await ask(infra, subject, good, timeout_s=20)  # still serving
            sent[service] += 1
            assert (reply.error.code if reply.error else "ok") == answer, reply

    for service, n in sent.items():
        durable = CrucibleNames(cfg.names).consumer_service if service == "crucible" else service

        async def done(durable: str = durable) -> object:
            info = await infra.js.consumer_info(cfg.names.commands_stream, cfg.names.consumer(durable))
            return info if info.num_ack_pending == 0 and info.num_pending == 0 else None

        info = await wait_until(done, timeout_s=30, what=f"{service} to settle its commands")
        assert (service, info.delivered.consumer_seq, info.num_redelivered) == (service, n, 0)


async def test_deep_json_on_every_command_subject_is_refused_at_once_without_a_traceback(
        services: None, infra: Infra, cfg: Config, subtests: pytest.Subtests) -> None:
    """10,000 levels of nesting — in a workflow's ``source``, a respond's ``arguments``, a session's ``config``,
    a run id, or the whole body — get ``invalid_command: nested deeper than 64`` on every command subject, one
    warning line each naming it, and no handler crash (a decoder's ``RecursionError`` was one, then 20
    redeliveries and no reply)."""
    with info_logs() as logs:
        for subjects in ROUTES.values():
            for suffix in subjects:
                for body in DEEP:
                    with subtests.test(f"{suffix}: {body[:30]!r}"):
                        reply = await ask(infra, cfg.names.command(suffix), body, timeout_s=10)
                        assert reply.error is not None, reply
                        assert (reply.error.code, reply.error.message.split(" (")[0]) == (
                            "invalid_command", f"nested deeper than {MAX_DEPTH}")
    assert not [e for e in logs if e.get("exc_info") or "crash" in e["event"]]
    refused = [e for e in logs if e["log_level"] == "warning" and "nested deeper than" in e.get("reason", "")]
    assert len(refused) == len(DEEP) * sum(len(s) for s in ROUTES.values())


async def test_poison_verification_triggers_are_terminated_not_redelivered(
        infra: Infra, cfg: Config, event_log: JetStreamEventLog) -> None:
    """The verifier's triggers (``<ns>.cmd.verify.<run>``) have no reply: a garbage one, one with the wrong
    schema, one nested 10,000 deep, and a forged one naming a commit that is no ``run_verifying`` are each
    logged and terminated."""
    created = await create_manual_run(event_log, "r-target", [("s", 1)])
    await commit_events(event_log, "r-target", RunStarted(executor_id="x-1", at_ms=1))
    forged = VerifyRun(run_id=RunId("r-target"), branch_id=BranchId("main"), snapshot_lsn=LSN(created))
    bodies = [b"\x00 garbage", b'{"run_id": "r-target"}', DEEP[0], msgspec.json.encode(forged)]
    with info_logs() as logs:
        async with running(verifier_serve, infra, cfg):
            for body in bodies:
                await infra.js.publish(cfg.names.verify("r-target"), body)

            async def done() -> object:
                try:
                    info = await infra.js.consumer_info(cfg.names.commands_stream, cfg.names.consumer("verifier"))
                except NotFoundError:  # the service has not created its durable yet
                    return None
                return info if info.num_ack_pending == 0 and info.num_pending == 0 else None

            info = await wait_until(done, timeout_s=30, what="the verifier to settle its triggers")
    assert (info.delivered.consumer_seq, info.num_redelivered) == (4, 0)
    assert len([e for e in logs if e["event"] == "verification.trigger_undecodable"]) == 3
    [unreadable] = [e for e in logs if e["event"] == "verification.unreadable_run"]
    assert unreadable["code"] == "not_a_trigger" and "is not a run_verifying of branch 'main'" in unreadable["reason"]
    assert (await event_log.load("r-target")).verdicts == ()
