"""Codecs at the edges: commits on the wire and workflow specs.

A commit decodes to exactly what was encoded, for every event type; an event type or
schema version this build does not know is an error that names it, never a skip.
A workflow that fails validation says which field, in JSON and in YAML alike.
"""

from __future__ import annotations

import json
from typing import Any, get_args

import msgspec
import pytest
import yaml

from reel.shared.core.errors import InvalidCommand, UnknownEventType, WorkflowInvalid
from reel.shared.core.run.events import (
    SCHEMA_VERSION,
    AgentFinished,
    AnyEvent,
    AttemptCancelled,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    BranchForked,
    Budget,
    CodeIdentity,
    Commit,
    ContextPartition,
    DeclaredStep,
    InputAnswered,
    InputRequested,
    RunAwaitingInput,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunSleeping,
    RunStarted,
    RunVerifying,
    RunWoke,
    StepDecl,
    StepHalted,
    StepsDeclared,
    Usage,
    Verdict,
    VerdictRecorded,
    decode_commit,
    encode_commit,
)
from reel.shared.core.wire.commands import CancelRun, ResumeRun, StartRun, decode_command
from reel.shared.core.workflow.spec import encode_workflow, parse_workflow

REF = BlobRef(sha256="ab" * 32, size_bytes=123, media_type="application/json")
USAGE = Usage(input_tokens=11, output_tokens=7, latency_ms=12.5, cost_usd=0.25)

# One instance of every event type, every optional field set away from its default.
SAMPLES: list[AnyEvent] = [
    RunCreated(run_id="r-1", branch_id="main", workflow_name="wf", workflow_ref=REF,
               steps=(StepDecl(step_id="a", kind="model", max_attempts=3), StepDecl(step_id="b", kind="tool"),
                      StepDecl(step_id="s", kind="agent", max_attempts=2, max_turns=5, max_parallel_tools=3)),
               verifiers=("v1", "v2"), idempotency_key="key-1", created_ms=1, labels={"team": "x"},
               budget=Budget(max_tokens=1000, max_cost_usd=0.5, max_wall_s=60.0, max_tool_calls=4)),
    RunStarted(executor_id="x-1", at_ms=2),
    AttemptDispatched(branch_id="main", step_id="a", attempt=1, executor_id="x-1", at_ms=3, prompt_ref=REF,
                      context=ContextPartition(packed=("c1", "c2"), available=("c3",), dropped=("c4", "c5")),
                      code=CodeIdentity(kind="python", name="t", path="/a/t.py", sha256="cd" * 32, version="t==1",
                                        reel="0.1")),
    AttemptSucceeded(branch_id="main", step_id="a", attempt=1, output_ref=REF, usage=USAGE, at_ms=4,
                     recovered=True),
    AttemptFailed(branch_id="main", step_id="a", attempt=2, error_kind="rate_limited", message="slow down ✋",
                  retryable=False, usage=USAGE, at_ms=5, recovered=True),
    AttemptCancelled(branch_id="main", step_id="s:t1:c0", attempt=3, reason="run cancelled: stop ✋", usage=USAGE,
                     at_ms=5, recovered=True),
    RunVerifying(branch_id="main", at_ms=6),
    VerdictRecorded(verdict=Verdict(run_id="r-1", branch_id="main", snapshot_lsn=9, verifier="v1",
                                    verifier_version="2", step_id="a", attempt=1, status="fail", score=0.5,
                                    reason="no", at_ms=7)),
    RunCompleted(branch_id="main", outcome="failed", snapshot_lsn=9, at_ms=8),
    RunCancelled(reason="because", at_ms=9),
    BranchForked(branch_id="b-1", parent_branch_id="main", fork_lsn=4, from_step="s:t2", at_ms=10),
    StepsDeclared(branch_id="main", parent_step="s", steps=(
        DeclaredStep(step_id="s:t1:c0", kind="tool_call", turn=1, max_attempts=2, call_id="call_✋1",
                     tool_name="read_file", arguments='{"path": "a.py"}', retry_safe=True, fatal=True),
        DeclaredStep(step_id="s:t1:c1", kind="tool_call", turn=1, call_id="", tool_name="big", arguments_ref=REF),
        DeclaredStep(step_id="s:t2", kind="turn", turn=2, max_attempts=3))),
    AgentFinished(branch_id="main", step_id="s", status="failed", output_ref=REF, turns=12, error_kind="max_turns",
                  message="12 turns", at_ms=11),
    InputRequested(branch_id="main", request_id="q-1", step_id="s:t1:c0", kind="question", tool_name="ask_user",
                   call_id="call_✋1", asked="ops", question="Which file?", deadline_ms=99, default="answer",
                   default_note="any", at_ms=12),
    InputAnswered(branch_id="main", request_id="q-1", step_id="s:t1:c0", decision="approve",
                  arguments='{"path": "b.py"}', note="n", text="t", source="deadline", by="ana ✋", at_ms=13),
    RunAwaitingInput(branch_id="main", at_ms=14),
    StepHalted(branch_id="main", step_id="s:t2", reason="budget_exhausted", message="max_cost_usd 0.5: ✋",
               budget="max_cost_usd", limit=0.5, spent=0.25, needed=0.3, at_ms=15),
    RunSleeping(branch_id="main", step_id="nap", wake_ms=60_015, reason="sleep", at_ms=15),
    RunWoke(branch_id="main", step_id="nap", at_ms=60_016),
]


def _tag(event_type: type) -> str:
    return str(event_type.__struct_config__.tag)  # type: ignore[attr-defined]


def test_samples_cover_every_event_type() -> None:
    """A new event type without a sample here fails this test (STYLE habit 8)."""
    assert {type(e) for e in SAMPLES} == set(get_args(AnyEvent))
    assert len(SAMPLES) == len(get_args(AnyEvent))


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: _tag(type(e)))
def test_every_event_round_trips(event: AnyEvent) -> None:
    commit = Commit(commit_id="c-1", run_id="r-1", writer="x-1", events=(event,))
    body = encode_commit(commit)
    assert json.loads(body)["events"][0]["type"] == _tag(type(event))
    assert json.loads(body)["v"] == SCHEMA_VERSION
    back = decode_commit(body)
    assert back == commit
    assert encode_commit(back) == body


def test_multi_event_commit_round_trips_in_order() -> None:
    commit = Commit(commit_id="c-2", run_id="r-1", events=tuple(SAMPLES))
    assert decode_commit(encode_commit(commit)).events == tuple(SAMPLES)


def _with_event(event: dict[str, Any], position: int = 1) -> bytes:
    body = json.loads(encode_commit(Commit(commit_id="c", run_id="r-1", events=(SAMPLES[1], SAMPLES[5]))))
    body["events"].insert(position, event)
    return json.dumps(body).encode()


@pytest.mark.parametrize("position", [0, 1, 2])
def test_unknown_event_type_is_an_error_naming_it(position: int) -> None:
    data = _with_event({"type": "run_teleported", "at_ms": 1}, position)
    with pytest.raises(UnknownEventType, match="run_teleported") as info:
        decode_commit(data)
    assert info.value.code == "unknown_event_type"


def test_future_schema_version_is_refused() -> None:
    body = json.loads(encode_commit(Commit(commit_id="c", run_id="r-1", events=(SAMPLES[1],))))
    body["v"] = SCHEMA_VERSION + 1
    with pytest.raises(UnknownEventType, match=f"v{SCHEMA_VERSION + 1}"):
        decode_commit(json.dumps(body).encode())


def test_step_decls_of_model_and_tool_steps_encode_as_before() -> None:
    """The agent-only fields of StepDecl are unset elsewhere and absent from the body (old logs stay byte-equal)."""
    body = msgspec.json.encode(StepDecl(step_id="a", kind="model", max_attempts=3))
    assert body == b'{"step_id":"a","kind":"model","max_attempts":3}'
    agent = msgspec.json.decode(msgspec.json.encode(SAMPLES[0]), type=RunCreated).steps[2]
    assert (agent.max_turns, agent.max_parallel_tools) == (5, 3)


def test_declared_step_omits_its_defaults() -> None:
    turn = DeclaredStep(step_id="s:t1", kind="turn", turn=1)
    assert msgspec.json.encode(turn) == b'{"step_id":"s:t1","kind":"turn","turn":1}'


def test_older_body_without_defaulted_fields_still_decodes() -> None:
    """Schema evolution: fields added with defaults must not break old logs."""
    old = {"commit_id": "c", "run_id": "r-1", "events": [
        {"type": "attempt_succeeded", "branch_id": "main", "step_id": "a", "attempt": 1,
         "output_ref": {"sha256": "ab" * 32, "size_bytes": 1}, "at_ms": 5}]}
    event = decode_commit(json.dumps(old).encode()).events[0]
    assert isinstance(event, AttemptSucceeded)
    assert (event.usage, event.recovered, event.output_ref.media_type) == (Usage(), False, "text/plain")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        pytest.param(b"{not json", msgspec.DecodeError, id="not-json"),
        pytest.param(b'{"commit_id": "c", "run_id": "r", "events": [{"type": "run_started"}]}',
                     msgspec.ValidationError, id="missing-field"),
        pytest.param(b'{"commit_id": "c", "run_id": "r", "events": [{"at_ms": 1}]}', msgspec.ValidationError,
                     id="missing-tag"),
        pytest.param(b'{"commit_id": "c", "run_id": "r", "events": [{"type": "run_completed", "branch_id": "m",'
                     b' "outcome": "bogus", "at_ms": 1}]}', msgspec.ValidationError, id="bad-literal"),
    ],
)
def test_other_malformed_bodies_are_not_unknown_event_types(body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        decode_commit(body)
    assert not isinstance(info.value, UnknownEventType)


# ---- workflow specs ------------------------------------------------------------------------------


def _tool(step_id: str, **kw: Any) -> dict[str, Any]:
    return {"kind": "tool", "id": step_id, "tool": {"type": "recorded", "output": "ok"}, **kw}


def _model(step_id: str, **kw: Any) -> dict[str, Any]:
    return {"kind": "model", "id": step_id, "model": {"adapter": "scripted", "outputs": ["hi"]}, **kw}


VALID = {"name": "wf", "budget_tokens": 100,
         "steps": [_model("plan", context=[{"id": "c1", "text": "hello"}]),
                   _tool("act", max_attempts=2),
                   _model("review", context=[{"id": "out", "from_step": "plan"}])]}

BAD_WORKFLOWS: dict[str, tuple[dict[str, Any], str, str]] = {
    # name: (workflow, path the message must name, another word it must contain)
    "wrong-type": ({"name": "wf", "steps": [_tool("a", max_attempts="three")]}, "$.steps[0].max_attempts", "int"),
    "wrong-type-top": ({"name": 5, "steps": [_tool("a")]}, "$.name", "str"),
    "unknown-kind": ({"name": "wf", "steps": [_tool("a"), {"kind": "robot", "id": "b"}]}, "$.steps[1].kind",
                     "robot"),
    "missing-kind": ({"name": "wf", "steps": [{"id": "a"}]}, "$.steps[0]", "kind"),
    "unknown-field": ({"name": "wf", "steps": [_tool("a", colour="red")]}, "$.steps[0]", "colour"),
    "duplicate-ids": ({"name": "wf", "steps": [_tool("a"), _tool("b"), _tool("a")]}, "$.steps[2].id", "duplicate"),
    "forward-ref": ({"name": "wf", "steps": [_model("a", context=[{"id": "c", "from_step": "b"}]), _tool("b")]},
                    "$.steps[0].context[0].from_step", "'b'"),
    "self-ref": ({"name": "wf", "steps": [_model("a", context=[{"id": "c", "from_step": "a"}])]},
                 "$.steps[0].context[0].from_step", "'a'"),
    "unknown-adapter": ({"name": "wf", "steps": [_tool("a"), {"kind": "model", "id": "b",
                                                              "model": {"adapter": "gpt-9000"}}]},
                        "$.steps[1].model.adapter", "gpt-9000"),
    "no-steps": ({"name": "wf", "steps": []}, "$.steps", "no steps"),
    "bad-step-id": ({"name": "wf", "steps": [_tool("a.b")]}, "$.steps[0].id", "a.b"),
    "zero-attempts": ({"name": "wf", "steps": [_tool("a", max_attempts=0)]}, "$.steps[0].max_attempts", ">= 1"),
    "stdin-forward": ({"name": "wf", "steps": [{"kind": "tool", "id": "a", "tool": {
        "type": "command", "argv": ["cat"], "stdin_from": "z"}}]}, "$.steps[0].tool.stdin_from", "'z'"),
}


def _render(workflow: dict[str, Any], fmt: str) -> str:
    return json.dumps(workflow) if fmt == "json" else yaml.safe_dump(workflow)


def test_valid_workflow_parses_the_same_from_json_yaml_and_dict() -> None:
    from_json = parse_workflow(_render(VALID, "json"))
    assert parse_workflow(_render(VALID, "yaml")) == from_json
    assert parse_workflow(VALID) == from_json
    assert parse_workflow(encode_workflow(from_json)) == from_json  # the canonical blob round-trips
    assert [d.step_id for d in from_json.decls()] == ["plan", "act", "review"]
    assert from_json.decls()[1].max_attempts == 2


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("case", sorted(BAD_WORKFLOWS))
def test_workflow_errors_name_the_field(case: str, fmt: str) -> None:
    workflow, path, word = BAD_WORKFLOWS[case]
    with pytest.raises(WorkflowInvalid) as info:
        parse_workflow(_render(workflow, fmt))
    message = info.value.message
    assert info.value.code == "workflow_invalid"
    assert path in message.replace("`", ""), message
    assert word in message, message


@pytest.mark.parametrize("text", ["{", "a: [", "\x00", b"\xff\xfe", "- just\n- a list\n", "42"])
def test_unparseable_workflow_text_is_workflow_invalid(text: str | bytes) -> None:
    with pytest.raises(WorkflowInvalid, match="invalid workflow"):
        parse_workflow(text)


# ---- commands ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "kind", "needle"),
    [
        pytest.param(b"", StartRun, "empty", id="empty"),
        pytest.param(b"{nope", StartRun, "not valid JSON", id="not-json"),
        pytest.param(b'{"labels": {"a": 1}}', StartRun, "$.labels[...]", id="wrong-type"),
        pytest.param(b'{"workflow_ref": {"sha256": "x"}}', StartRun, "size_bytes", id="missing-field"),
        pytest.param(b'{"surprise": true}', StartRun, "surprise", id="unknown-field"),
        pytest.param(b'{"run_id": 7}', CancelRun, "$.run_id", id="cancel-wrong-type"),
        pytest.param(b"[]", ResumeRun, "object", id="not-an-object"),
    ],
)
def test_bad_commands_name_the_problem(body: bytes, kind: type, needle: str) -> None:
    with pytest.raises(InvalidCommand) as info:
        decode_command(body, kind)
    assert info.value.code == "invalid_command"
    assert needle in info.value.message.replace("`", ""), info.value.message


@pytest.mark.parametrize(("verifier", "where"), [
    ({"type": "output_regex", "pattern": "("}, "$.verifiers[0].pattern"),
    ({"type": "output_json_schema", "json_schema": {"type": 12}}, "$.verifiers[0].json_schema"),
    ({"type": "output_regex", "pattern": "x", "timeout_s": 0}, "$.verifiers[0].timeout_s"),
])
def test_verifier_parameters_are_checked_when_the_workflow_loads(verifier: dict[str, object], where: str) -> None:
    spec = {"name": "w", "steps": [{"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": "o"}}],
            "verifiers": [verifier]}
    with pytest.raises(WorkflowInvalid) as err:
        parse_workflow(spec)
    assert f"`{where}`" in err.value.message


def test_input_events_omit_their_defaults() -> None:
    body = encode_commit(Commit(commit_id="c", run_id="r", events=(InputAnswered(
        branch_id="main", request_id="q-1", step_id="s:t1:c0", decision="reject", at_ms=1),)))
    assert json.loads(body)["events"][0] == {"type": "input_answered", "branch_id": "main", "request_id": "q-1",
                                             "step_id": "s:t1:c0", "decision": "reject", "at_ms": 1}
