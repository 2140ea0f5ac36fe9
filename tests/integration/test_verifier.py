"""The verifier service on a real nats-server: built-ins, error verdicts, sharing, restart, replay.

Runs go through the real executor and verifier services; verdicts are read back
from the run's log and from the verdict stream.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import msgspec

from reel.services.verifier.app import serve
from reel.shared.application.verifierrun import run_verifier
from reel.shared.core.run.events import (
    AttemptDispatched,
    AttemptSucceeded,
    BlobRef,
    RunCompleted,
    RunCreated,
    RunVerifying,
    StepDecl,
    Verdict,
    VerdictRecorded,
)
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.verify.verifiers import ContextRequires, OutputRegex, make_ctx
from reel.shared.core.workflow.spec import VerifierSpec, parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.nats.publish import publish_verify
from reel.shared.nats.subjectlog import SubjectLog
from reel.shared.runtime.config import Config
from tests.conftest import REPO, running
from tests.integration import parking

PY = sys.executable
P = "tests.integration.parking"


def _workflow(verifiers: list[dict[str, Any]], name: str = "verify-me") -> dict[str, Any]:
    return {
        "name": name,
        "steps": [
            {"kind": "model", "id": "plan", "max_attempts": 2,
             "model": {"adapter": "scripted",
                       "outputs": [{"error": "flaky", "message": "first try fails"}, '{"answer": 42}']},
             "policy": {"budget_tokens": 20},
             "context": [
                 {"id": "doc-a", "text": "alpha " * 5, "priority": 3.0},
                 {"id": "doc-b", "text": "bravo " * 5, "stale": True},
                 {"id": "doc-c", "text": "charlie " * 8, "priority": 1.0},
             ]},
            {"kind": "tool", "id": "final", "tool": {"type": "scripted", "outputs": ["DONE: 42"]}},
        ],
        "verifiers": verifiers,
    }


async def _recorded(event_log: JetStreamEventLog, run_id: str) -> list[tuple[str, Verdict]]:
    """(writer, verdict) of every verdict_recorded commit of the run, in log order."""
    return [(c.writer, e.verdict) for _, c in await event_log.read(run_id)
            for e in c.events if isinstance(e, VerdictRecorded)]


async def _published(infra: Infra, cfg: Config, run_id: str) -> list[Verdict]:
    pub = SubjectLog(infra.nc, cfg.names.verdicts_stream, cfg.names.verdict)
    return [msgspec.json.decode(b, type=Verdict) for _, b in await pub.read_raw(run_id)]


async def _run(client: ReelClient, wf: dict[str, Any], statuses: tuple[str, ...] = ("completed",)) -> str:
    reply = await client.start(parse_workflow(wf))
    assert reply.ok and reply.run_id, reply
    await client.wait_for(reply.run_id, statuses, timeout_s=30)
    return reply.run_id


async def test_builtin_verifiers(executor: None, verifier: None, client: ReelClient, event_log: JetStreamEventLog,
                                 infra: Infra, cfg: Config) -> None:
    check_files = ("import os,sys; d=sys.stdin.read(); f=open(os.environ['REEL_OUTPUT_FILE']).read();"
                   " sys.exit(0 if d == f == 'DONE: 42' and os.environ['REEL_STEP_ID'] == 'final' else 1)")
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}}
    wf = _workflow([
        {"type": "output_regex", "name": "regex_pass", "pattern": r"DONE: \d+"},
        {"type": "output_regex", "name": "regex_fail", "pattern": "^nope$"},
        {"type": "output_json_schema", "name": "schema_pass", "step": "plan", "json_schema": schema},
        {"type": "output_json_schema", "name": "schema_fail", "step": "plan",
         "json_schema": {**schema, "properties": {"answer": {"type": "string"}}}},
        {"type": "output_json_schema", "name": "schema_not_json", "json_schema": schema},
        {"type": "command", "name": "cmd_pass", "argv": [PY, "-c", check_files]},
        {"type": "command", "name": "cmd_fail", "argv": [PY, "-c", "print('bad output'); raise SystemExit(3)"]},
        {"type": "command", "name": "cmd_timeout", "argv": [PY, "-c", "import time; time.sleep(30)"],
         "timeout_s": 1.0},
        {"type": "command", "name": "cmd_missing", "argv": ["/nonexistent/verifier"]},
        {"type": "context_requires", "name": "ctx_packed", "step": "plan", "item": "doc-a"},
        {"type": "context_requires", "name": "ctx_available", "step": "plan", "item": "doc-c"},
        {"type": "context_requires", "name": "ctx_dropped", "step": "plan", "item": "doc-b"},
        {"type": "context_requires", "name": "ctx_unknown", "step": "plan", "item": "doc-z"},
        {"type": "context_requires", "name": "ctx_tool_step", "item": "doc-a"},
        {"type": "recorded_outcome", "name": "recorded_yes", "expect": True},
        {"type": "recorded_outcome", "name": "recorded_no", "expect": False},
        {"type": "python", "name": "py_raises", "path": f"{P}:Raises"},
        {"type": "python", "name": "py_deadline", "path": f"{P}:Sleeps", "timeout_s": 0.3},
        {"type": "python", "name": "py_stubborn", "path": f"{P}:Stubborn", "timeout_s": 0.3},
        {"type": "python", "name": "py_bad_score", "path": f"{P}:BadScore"},
        {"type": "python", "name": "py_prompt", "step": "plan", "path": f"{P}:PromptReader"},
        {"type": "python", "name": "py_factory", "path": f"{P}:proc_parker"},
        {"type": "python", "name": "py_bad_path", "path": "tests.integration.nope:Nothing"},
    ])
    run_id = await _run(client, wf)
    state = await event_log.load(run_id)
    got = {v.verifier: v for v in state.verdicts}
    assert len(state.verdicts) == len(got) == len(wf["verifiers"]), "one verdict per verifier, none twice"
    expected = {
        "regex_pass": ("pass", "matches 'DONE: 42'"), "regex_fail": ("fail", "does not match"),
        "schema_pass": ("pass", "matches the schema"), "schema_fail": ("fail", "schema violation at $['answer']"),
        "schema_not_json": ("fail", "not JSON"),
        "cmd_pass": ("pass", "exited 0"), "cmd_fail": ("fail", "exited 3: bad output"),
        "cmd_timeout": ("error", "did not finish within its 1s timeout"), "cmd_missing": ("error", "cannot run"),
        "ctx_packed": ("pass", "doc-a packed in plan#2"), "ctx_available": ("fail", "available but not packed"),
        "ctx_dropped": ("fail", "dropped by policy"), "ctx_unknown": ("fail", "not a candidate"),
        "ctx_tool_step": ("error", "no context partition"),
        "recorded_yes": ("pass", "agent succeeded"), "recorded_no": ("fail", "did not succeed"),
        "py_raises": ("error", "raised RuntimeError: verifier exploded"),
        "py_deadline": ("error", "passed its deadline"), "py_stubborn": ("error", "passed its deadline"),
        "py_bad_score": ("error", "outside 0..1"), "py_prompt": ("pass", "prompt has"),
        "py_factory": ("pass", "resumed elsewhere"), "py_bad_path": ("error", "cannot import"),
    }
    for name, (status, reason) in expected.items():
        v = got[name]
        assert (v.status, reason in v.reason) == (status, True), f"{name}: {v.status} {v.reason!r}"
        assert v.snapshot_lsn == state.verifying_lsn and v.branch_id == "main"
    assert got["py_factory"].verifier_version == "t1" and got["regex_pass"].verifier_version == "1"
    assert (got["ctx_packed"].step_id, got["ctx_packed"].attempt) == ("plan", 2)
    assert (got["regex_pass"].step_id, got["regex_pass"].attempt) == ("final", 1)
    assert state.status == "completed" and state.outcome == "failed"
    assert sorted(v.verifier for v in await _published(infra, cfg, run_id)) == sorted(got)
    assert {msgspec.json.encode(v) for v in await _published(infra, cfg, run_id)} == {
        msgspec.json.encode(v) for v in state.verdicts}, "published verdicts are exactly the recorded ones"


class CountingBlobs:
    """The real blob store, counting reads (to prove a verifier never reads a blob)."""

    def __init__(self, inner: JetStreamBlobStore) -> None:
        self.inner, self.gets = inner, 0

    async def get(self, ref: BlobRef) -> bytes:
        self.gets += 1
        return await self.inner.get(ref)


async def test_context_requires_reads_no_blob(executor: None, client: ReelClient, event_log: JetStreamEventLog,
                                              blobs: JetStreamBlobStore) -> None:
    run_id = await _run(client, _workflow([]), ("verifying",))
    state = await event_log.load(run_id)
    view = build_episode_view(state)
    counting = CountingBlobs(blobs)
    for item, status in (("doc-a", "pass"), ("doc-c", "fail"), ("doc-b", "fail")):
        spec = VerifierSpec(type="context_requires", step="plan", item=item)
        result = await run_verifier(ContextRequires(spec), make_ctx(view, step="plan", blobs=counting, timeout_s=5))
        assert result.status == status, result
    assert counting.gets == 0, "context_requires must answer from the partition alone"
    # the counter does count: an output check reads exactly one blob
    spec = VerifierSpec(type="output_regex", step="plan", pattern="answer")
    result = await run_verifier(OutputRegex(spec), make_ctx(view, step="plan", blobs=counting, timeout_s=5))
    assert result.status == "pass" and counting.gets == 1


async def test_outcomes_without_verifiers_and_after_a_failed_step(
    executor: None, verifier: None, client: ReelClient, event_log: JetStreamEventLog
) -> None:
    ok = await _run(client, _workflow([], name="no-verifiers"))
    wf = _workflow([{"type": "recorded_outcome", "expect": True}], name="failing-step")
    wf["steps"][1]["tool"]["outputs"] = [{"error": "boom", "retryable": False}]
    bad = await _run(client, wf)
    assert (await event_log.load(ok)).outcome == "succeeded"
    failed = await event_log.load(bad)
    assert failed.outcome == "failed" and [v.status for v in failed.verdicts] == ["pass"]


async def test_several_instances_share_work(executor: None, client: ReelClient, infra: Infra, cfg: Config,
                                            event_log: JetStreamEventLog) -> None:
    # each instance handles one message at a time; the verifier only returns once two
    # verifications are in flight together, so both runs complete only if both instances work
    parking.barrier("meet", 2)
    wf = _workflow([{"type": "python", "name": "meet", "path": f"{P}:Meeting", "timeout_s": 20}])
    async with running(serve, infra, cfg, concurrency=1, instance_id="v-one"), \
            running(serve, infra, cfg, concurrency=1, instance_id="v-two"):
        runs = await asyncio.gather(*(_run(client, {**wf, "name": f"shared-{i}"}) for i in range(2)))
    writers = set()
    for run_id in runs:
        state = await event_log.load(run_id)
        assert state.outcome == "passed" and len(state.verdicts) == 1, state.verdicts
        writers |= {w for w, _ in await _recorded(event_log, run_id)}
    assert writers == {"v-one", "v-two"}


async def test_restart_mid_verification_resumes(executor: None, client: ReelClient, infra: Infra, cfg: Config,
                                                event_log: JetStreamEventLog) -> None:
    park_subject = f"{cfg.names.namespace}.test.parked"
    parked = await infra.nc.subscribe(park_subject)
    env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace,
           "REEL_COMMAND_ACK_WAIT_S": "1", "REEL_LOG_FORMAT": "json", parking.PARK_SUBJECT_ENV: park_subject,
           "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(PY, "-m", "reel.services.verifier", cwd=REPO, env=env,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        wf = _workflow([{"type": "python", "name": "quick", "path": f"{P}:Counting"},
                        {"type": "python", "name": "parker", "path": f"{P}:ProcParker", "timeout_s": 60}])
        run_id = await _run(client, wf, ("verifying",))
        await parked.next_msg(timeout=30)  # the subprocess is inside parker.verify
        verdicts = await infra.js.subscribe(cfg.names.verdict(run_id), ordered_consumer=True)
        first = msgspec.json.decode((await verdicts.next_msg(timeout=30)).data, type=Verdict)
        assert first.verifier == "quick"  # recorded, then published: it is in the log
        proc.send_signal(signal.SIGKILL)  # dies mid-verify: no ack, no cleanup
        await asyncio.wait_for(proc.wait(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert [v.verifier for _, v in await _recorded(event_log, run_id)] == ["quick"]
    async with running(serve, infra, cfg, ack_wait_s=1, instance_id="v-after"):
        state = await client.wait_for(run_id, ("completed",), timeout_s=30)
    recorded = await _recorded(event_log, run_id)
    assert sorted(v.verifier for _, v in recorded) == ["parker", "quick"], "no verdict lost, none twice"
    assert dict((v.verifier, w) for w, v in recorded)["parker"] == "v-after"
    assert parking.calls("quick") == 0, "the resumed job re-ran a verifier whose verdict was recorded"
    assert sorted(v.verifier for v in await _published(infra, cfg, run_id)) == ["parker", "quick"]
    assert state.outcome == "passed"


async def test_late_consumer_replays_verdicts(executor: None, verifier: None, client: ReelClient, infra: Infra,
                                              cfg: Config, event_log: JetStreamEventLog) -> None:
    wf = _workflow([{"type": "output_regex", "pattern": "DONE"},
                    {"type": "context_requires", "step": "plan", "item": "doc-c"}])
    run_id = await _run(client, wf)
    late = await infra.js.subscribe(cfg.names.verdict(run_id), ordered_consumer=True)
    replayed = [msgspec.json.decode((await late.next_msg(timeout=5)).data, type=Verdict) for _ in range(2)]
    state = await event_log.load(run_id)
    assert sorted(replayed, key=lambda v: v.verifier) == sorted(state.verdicts, key=lambda v: v.verifier)
    assert {v.status for v in replayed} == {"pass", "fail"} and state.outcome == "failed"
    completed = [e for _, c in await event_log.read(run_id) for e in c.events if isinstance(e, RunCompleted)]
    assert len(completed) == 1 and completed[0].snapshot_lsn == state.verifying_lsn


async def test_unreadable_workflow_gives_error_verdicts(verifier: None, client: ReelClient, infra: Infra,
                                                        cfg: Config, event_log: JetStreamEventLog) -> None:
    # a hand-written run whose workflow blob does not exist: judged `error`, not retried forever
    run_id, missing = "r-handmade", BlobRef(sha256="0" * 64, size_bytes=0, media_type="application/json")
    created = RunCreated(run_id=run_id, branch_id="main", workflow_name="ghost", workflow_ref=missing,
                         steps=(StepDecl(step_id="s", kind="tool"),), verifiers=("v1", "v2"), created_ms=0)
    lsn = await event_log.commit(run_id, [created], expected_lsn=0)
    lsn = await event_log.commit(run_id, [
        AttemptDispatched(branch_id="main", step_id="s", attempt=1, executor_id="x-gone", at_ms=1),
        AttemptSucceeded(branch_id="main", step_id="s", attempt=1, output_ref=missing, at_ms=2),
        RunVerifying(branch_id="main", at_ms=3),
    ], expected_lsn=lsn)
    await publish_verify(infra.js, cfg.names, run_id, "main", lsn)  # what the executor sends after run_verifying
    state = await client.wait_for(run_id, ("completed",), timeout_s=30)
    assert [(v.verifier, v.status, v.snapshot_lsn) for v in state.verdicts] in (
        [("v1", "error", lsn), ("v2", "error", lsn)], [("v2", "error", lsn), ("v1", "error", lsn)])
    assert all("workflow unreadable" in v.reason for v in state.verdicts)
    assert state.outcome == "error"
