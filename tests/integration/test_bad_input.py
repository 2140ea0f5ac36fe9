"""Bad input at the executor's command edge.

Every bad command gets a clear error reply (``ok=false``, ``error.code``, a message
naming the field) and a log line; nothing is committed (no run subject appears); the
service keeps running and keeps serving good commands. Then hypothesis throws random
payloads at the start subject.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import structlog
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from reel.services.executor.app import serve
from reel.shared.core.wire.commands import Reply
from reel.shared.core.wire.subjects import REPLY_TO_HEADER
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config

VALID_WORKFLOW = {"name": "ok", "steps": [{"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": "x"}}]}
KNOWN_CODES = {"invalid_command", "workflow_invalid", "blob_missing", "run_not_found"}


@pytest.fixture
async def live_executor(infra: Infra, cfg: Config) -> AsyncIterator[asyncio.Task[None]]:
    """The executor service, in-process; the test can check the task is still alive."""
    stop = asyncio.Event()
    task = asyncio.create_task(serve(infra, cfg, stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def send(infra: Infra, cfg: Config, command: str, body: bytes, timeout_s: float = 10.0) -> Reply:
    """Publish a raw command body with a reply inbox; the service's answer."""
    inbox = infra.nc.new_inbox()
    sub = await infra.nc.subscribe(inbox, max_msgs=1)
    try:
        await infra.js.publish(cfg.names.command(command), body, headers={REPLY_TO_HEADER: inbox})
        msg = await sub.next_msg(timeout=timeout_s)
    finally:
        await sub.unsubscribe()
    return msgspec.json.decode(msg.data, type=Reply)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def step(kind: str = "tool", sid: str = "a", **kw: Any) -> dict[str, Any]:
    if kind == "tool":
        return {"kind": "tool", "id": sid, "tool": {"type": "recorded", "output": "x"}, **kw}
    return {"kind": kind, "id": sid, "model": {"adapter": "scripted", "outputs": ["x"]}, **kw}


MISSING_SHA = "0" * 64

BAD: list[tuple[str, str, bytes, str, tuple[str, ...]]] = [
    # (id, command, body, expected error.code, words the message must contain)
    ("malformed-json", "start", b'{"workflow": {', "invalid_command", ("not valid JSON",)),
    ("empty-body", "start", b"", "invalid_command", ("empty",)),
    ("not-an-object", "start", b"[1, 2, 3]", "invalid_command", ("object",)),
    ("wrong-type-nested", "start", dumps({"workflow": {"name": 42, "steps": [step()]}}), "invalid_command",
     ("$.workflow.name", "str")),
    ("wrong-type-top", "start", dumps({"workflow": VALID_WORKFLOW, "idempotency_key": 7}), "invalid_command",
     ("$.idempotency_key",)),
    ("wrong-type-labels", "start", dumps({"workflow": VALID_WORKFLOW, "labels": ["a"]}), "invalid_command",
     ("$.labels",)),
    ("unknown-field", "start", dumps({"workflow": VALID_WORKFLOW, "priority": "high"}), "invalid_command",
     ("priority",)),
    ("unknown-step-field", "start", dumps({"workflow": {"name": "w", "steps": [step(colour="red")]}}),
     "invalid_command", ("colour", "$.workflow.steps[0]")),
    ("unknown-step-kind", "start", dumps({"workflow": {"name": "w", "steps": [step(), {"kind": "robot", "id": "b"}]}}),
     "invalid_command", ("$.workflow.steps[1].kind", "robot")),
    ("duplicate-step-ids", "start", dumps({"workflow": {"name": "w", "steps": [step(sid="a"), step(sid="a")]}}),
     "workflow_invalid", ("duplicate", "steps[1]", ".id")),
    ("forward-reference", "start", dumps({"workflow": {"name": "w", "steps": [
        {**step("model", "a"), "context": [{"id": "c", "from_step": "b"}]}, step(sid="b")]}}),
     "workflow_invalid", ("from_step", "steps[0]")),
    ("unknown-adapter", "start", dumps({"workflow": {"name": "w", "steps": [
        {"kind": "model", "id": "a", "model": {"adapter": "gpt-42"}}]}}), "workflow_invalid",
     ("gpt-42", "model.adapter")),
    ("no-workflow", "start", dumps({"labels": {}}), "invalid_command", ("workflow",)),
    ("both-workflows", "start", dumps({"workflow": VALID_WORKFLOW,
                                       "workflow_ref": {"sha256": MISSING_SHA, "size_bytes": 1}}),
     "invalid_command", ("workflow_ref",)),
    ("missing-workflow-blob", "start", dumps({"workflow_ref": {"sha256": MISSING_SHA, "size_bytes": 10}}),
     "blob_missing", ("workflow_ref", MISSING_SHA[:12])),
    ("malformed-workflow-ref", "start", dumps({"workflow_ref": {"sha256": "../x.>", "size_bytes": 10}}),
     "invalid_command", ("$.workflow_ref.sha256",)),
    ("resume-unknown-run", "resume", dumps({"run_id": "r-nope"}), "run_not_found", ("r-nope",)),
    ("resume-wildcard-run", "resume", dumps({"run_id": "*"}), "invalid_command", ("'*'", "$.run_id")),
    ("resume-multi-token-run", "resume", dumps({"run_id": ">"}), "invalid_command", ("'>'", "$.run_id")),
    ("resume-malformed", "resume", b"{", "invalid_command", ("not valid JSON",)),
    ("resume-wrong-type", "resume", dumps({"run_id": 5}), "invalid_command", ("$.run_id",)),
]


async def test_bad_commands_get_a_clear_error_and_commit_nothing(
        live_executor: asyncio.Task[None], infra: Infra, cfg: Config, event_log: JetStreamEventLog,
        client: ReelClient, subtests: pytest.Subtests) -> None:
    """Every case of BAD against one running executor (one subtest each)."""
    # an existing run at rest, so that a command reaching into other runs would show
    existing = await send(infra, cfg, "start", dumps({"workflow": VALID_WORKFLOW, "idempotency_key": "keep"}))
    assert existing.ok and existing.run_id
    await client.wait_for(existing.run_id, ("verifying",), timeout_s=30)
    head_before = await event_log.head(existing.run_id)
    for case, command, body, code, words in BAD:
        with subtests.test(case):
            runs_before = await event_log.list_runs()
            with structlog.testing.capture_logs() as logs:
                reply = await send(infra, cfg, command, body)
            assert reply.ok is False and reply.error is not None, reply
            assert reply.error.code == code, reply.error
            for word in words:
                assert word in reply.error.message.replace("`", ""), reply.error.message
            assert reply.run_id in (None, "r-nope", "*", ">"), "the reply names no other run"
            rejected = [e for e in logs if e["event"] == "command.rejected"]
            assert [e["code"] for e in rejected] == [code], "one clear log line per refused command"
            assert await event_log.list_runs() == runs_before, "nothing committed"
            assert await event_log.head(existing.run_id) == head_before, "no other run touched"
            assert not live_executor.done()
    after = await send(infra, cfg, "start", dumps({"workflow": VALID_WORKFLOW}))
    assert after.ok and after.created and after.run_id != existing.run_id


async def test_a_workflow_blob_that_is_not_a_workflow(live_executor: asyncio.Task[None], infra: Infra, cfg: Config,
                                                     event_log: JetStreamEventLog, blobs: JetStreamBlobStore) -> None:
    for body, words in ((b"not: [valid", ("workflow blob",)), (dumps({"name": "w", "steps": [{"kind": "x"}]}),
                                                                ("$.steps[0].kind",))):
        ref = await blobs.put(body, "application/json")
        reply = await send(infra, cfg, "start", dumps({"workflow_ref": msgspec.to_builtins(ref)}))
        assert reply.error is not None and reply.error.code == "workflow_invalid", reply
        assert all(w in reply.error.message.replace("`", "") for w in words), reply.error.message
    assert await event_log.list_runs() == []
    good = await blobs.put(dumps(VALID_WORKFLOW), "application/json")
    reply = await send(infra, cfg, "start", dumps({"workflow_ref": msgspec.to_builtins(good)}))
    assert reply.ok and reply.created and await event_log.list_runs() == [reply.run_id]


async def test_a_burst_of_bad_commands_loses_nothing_good(live_executor: asyncio.Task[None], infra: Infra,
                                                         cfg: Config, event_log: JetStreamEventLog) -> None:
    bodies = [body for _, cmd, body, _, _ in BAD if cmd == "start"]
    good = [dumps({"workflow": VALID_WORKFLOW, "idempotency_key": f"good-{i}"}) for i in range(3)]
    mixed = bodies[:5] + good[:1] + bodies[5:10] + good[1:2] + bodies[10:] + good[2:]
    replies = await asyncio.gather(*(send(infra, cfg, "start", b) for b in mixed))
    oks = [r for r in replies if r.ok]
    assert len(oks) == 3 and all(r.error is None for r in oks)
    assert all(r.error is not None for r in replies if not r.ok)
    assert sorted(await event_log.list_runs()) == sorted(r.run_id for r in oks)
    assert not live_executor.done()


# ---- random payloads -----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
texts = st.text(max_size=12)
step_like = st.fixed_dictionaries(
    {"kind": st.sampled_from(["model", "tool", "robot", 3, None]),
     "id": st.sampled_from(["a", "b", "a.b", ""]) | texts},
    optional={
        "model": st.fixed_dictionaries({"adapter": st.sampled_from(["scripted", "replay", "gpt"]) | texts},
                                       optional={"outputs": st.lists(texts, max_size=2), "output": texts}),
        "tool": st.fixed_dictionaries({"type": st.sampled_from(["recorded", "scripted", "command", "shell"])},
                                      optional={"output": texts, "outputs": st.lists(texts, max_size=2),
                                                "argv": st.just(["true"])}),
        "max_attempts": st.integers(-1, 3) | texts,
        "context": st.lists(st.fixed_dictionaries({"id": texts}, optional={"text": texts, "from_step": texts}),
                            max_size=2),
    },
)
workflow_like = st.fixed_dictionaries(
    {"name": texts | st.integers(), "steps": st.lists(step_like, max_size=3) | json_values},
    optional={"budget_tokens": st.integers(-5, 100) | texts, "surprise": json_values},
)
start_like = st.fixed_dictionaries(
    {},
    optional={
        "workflow": workflow_like | json_values,
        "workflow_ref": st.fixed_dictionaries(
            {"sha256": st.sampled_from([MISSING_SHA, "", "a b", "*", "../x.>"]) | texts,
             "size_bytes": st.integers(-1, 10) | texts},
            optional={"media_type": texts}) | json_values,
        "idempotency_key": texts | st.integers(),
        "labels": st.dictionaries(texts, texts | st.integers(), max_size=2),
        "bogus": json_values,
    },
)
# near-valid starts: well-formed steps with small mutations, to get past decoding into validation
ids_ = st.sampled_from(["a", "b", "c", "d", "e", "a.b", ""])
near_step = st.one_of(
    st.builds(lambda i, n, ref: {"kind": "model", "id": i, "max_attempts": n,
                                 "model": {"adapter": st_adapter_output(ref)[0], **st_adapter_output(ref)[1]},
                                 "context": [{"id": "c1", "from_step": ref}] if ref else []},
              ids_, st.sampled_from([1, 1, 2, 0]), st.sampled_from([None, None, None, "a", "zzz"])),
    st.builds(lambda i, t: {"kind": "tool", "id": i, "tool": t}, ids_, st.sampled_from([
        {"type": "recorded", "output": "x"}, {"type": "scripted", "outputs": ["y"]}, {"type": "recorded"},
        {"type": "command", "argv": ["true"]}, {"type": "command", "argv": []}, {"type": "scripted", "outputs": []}])),
)


def st_adapter_output(ref: str | None) -> tuple[str, dict[str, Any]]:
    return ("scripted", {"outputs": ["z"]}) if ref != "zzz" else ("replay", {})


near_valid = st.builds(
    lambda steps, key: {"workflow": {"name": "fuzz", "steps": steps}, **({"idempotency_key": key} if key else {})},
    st.lists(near_step, min_size=1, max_size=3), st.none() | st.text(min_size=1, max_size=6))

payloads = st.one_of(
    near_valid.map(dumps),
    st.binary(max_size=200),
    near_valid.map(dumps),
    json_values.map(dumps),
    start_like.map(dumps),
    start_like.map(dumps).map(lambda b: b[: len(b) // 2]),  # truncated JSON
)


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(payload=payloads)
async def test_random_payloads_on_the_start_subject(
        payload: bytes, live_executor: asyncio.Task[None], infra: Infra, cfg: Config,
        event_log: JetStreamEventLog) -> None:
    """Every payload gets an answer; a refused one commits nothing; the executor survives them all.

    (pytest-asyncio runs each hypothesis example in the session loop; the executor
    fixture is deliberately shared by all examples, which is the point.)
    """
    runs_before = set(await event_log.list_runs())
    reply = await send(infra, cfg, "start", payload)
    runs_after = set(await event_log.list_runs())
    assert not live_executor.done(), "the executor died"
    event(f"reply: {'ok' if reply.ok else reply.error.code if reply.error else '?'}")
    if reply.ok:
        assert reply.run_id in runs_after and runs_after - runs_before <= {reply.run_id}
    else:
        assert reply.error is not None and reply.error.code in KNOWN_CODES, reply
        assert reply.error.message.strip()
        assert runs_after == runs_before, f"a refused start created a run: {reply}"
