"""The published JSON Schemas (docs/schemas/) match the msgspec types and validate real payloads."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest

from reel.shared.core.run.events import (
    AttemptCancelled,
    AttemptDispatched,
    AttemptSucceeded,
    BlobRef,
    BranchForked,
    Commit,
    ContextPartition,
    InputAnswered,
    InputRequested,
    RunAwaitingInput,
    RunCreated,
    RunVerifying,
    StepDecl,
    Verdict,
    VerdictRecorded,
    encode_commit,
)
from reel.shared.core.run.ids import LSN, RunId
from reel.shared.core.wire.commands import CancelRun, Reply, RespondRun, RewindRun, StartRun, encode
from reel.shared.core.wire.livemessages import RunControl, StreamChunk, ToolCallDelta, encode_live
from reel.shared.core.workflow.spec import encode_workflow, parse_workflow

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "docs" / "schemas"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_schemas", REPO / "scripts" / "gen_schemas.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_schemas_have_not_drifted() -> None:
    rendered = _generator().render()
    committed = {p.name: p.read_text() for p in SCHEMAS.glob("*.json")}
    assert set(committed) == set(rendered), "docs/schemas/ holds other files than the generator makes"
    stale = sorted(n for n, text in rendered.items() if committed[n] != text)
    assert not stale, f"schemas drifted from the msgspec types: {stale}; run python scripts/gen_schemas.py"


def test_schemas_are_valid_2020_12() -> None:
    for path in sorted(SCHEMAS.glob("*.json")):
        schema = json.loads(path.read_text())
        assert schema["$schema"].endswith("2020-12/schema"), path.name
        jsonschema.Draft202012Validator.check_schema(schema)


REF = BlobRef(sha256="ab" * 32, size_bytes=12, media_type="application/json")
VERDICT = Verdict(run_id="r-1", branch_id="main", snapshot_lsn=9, verifier="greeting", step_id="run", attempt=2,
                  status="pass", score=1.0, reason="ok", at_ms=1)
WORKFLOW = {"name": "w", "steps": [{"kind": "tool", "id": "run", "tool": {"type": "recorded", "output": "hi"}}],
            "verifiers": [{"type": "output_regex", "pattern": "hi"}]}


def _payloads() -> list[tuple[str, bytes]]:
    commit = Commit(commit_id="c1", run_id="r-1", writer="x-1", events=(
        RunCreated(run_id="r-1", branch_id="main", workflow_name="w", workflow_ref=REF,
                   steps=(StepDecl(step_id="run", kind="model"),), verifiers=("greeting",), created_ms=1),
        AttemptDispatched(branch_id="main", step_id="run", attempt=1, executor_id="x-1", at_ms=2, prompt_ref=REF,
                          context=ContextPartition(packed=("a",), available=("b",), dropped=())),
        AttemptSucceeded(branch_id="main", step_id="run", attempt=1, output_ref=REF, at_ms=3),
        RunVerifying(branch_id="main", at_ms=4),
        VerdictRecorded(verdict=VERDICT),
        BranchForked(branch_id="b-1", parent_branch_id="main", fork_lsn=3, at_ms=5),
        AttemptCancelled(branch_id="b-1", step_id="run", attempt=2, reason="run cancelled", at_ms=6),
        InputRequested(branch_id="b-1", request_id="q-1", step_id="s:t1:c0", kind="approval", tool_name="deploy",
                       deadline_ms=9, default="reject", at_ms=6),
        RunAwaitingInput(branch_id="b-1", at_ms=7),
        InputAnswered(branch_id="b-1", request_id="q-1", step_id="s:t1:c0", decision="approve", arguments="{}",
                      at_ms=8),
    ))
    return [
        ("start_run.json", encode(StartRun(workflow=parse_workflow(WORKFLOW), idempotency_key="k"))),
        ("start_run.json", json.dumps({"workflow": WORKFLOW}).encode()),  # what a plain client sends
        ("cancel_run.json", encode(CancelRun(run_id="r-1", reason="why"))),
        ("rewind_run.json", encode(RewindRun(run_id="r-1", at_step="run"))),
        ("respond_run.json", encode(RespondRun(run_id="r-1", request_id="q-1", decision="approve",
                                               arguments={"path": "a"}, by="ana"))),
        ("respond_run.json", json.dumps({"run_id": "r-1", "request_id": "q-1", "decision": "reject",
                                         "note": "no"}).encode()),
        ("reply.json", encode(Reply(ok=True, run_id="r-1", status="pending", created=True, lsn=3))),
        ("commit.json", encode_commit(commit)),
        ("verdict.json", encode(VERDICT)),
        ("workflow.json", encode_workflow(parse_workflow(WORKFLOW))),
        ("run_control.json", encode_live(RunControl(run_id=RunId("r-1"), signal="cancelled", lsn=LSN(57)))),
        ("stream_chunk.json", encode_live(StreamChunk(seq=3, content="He", tool_calls=(
            ToolCallDelta(index=0, id="c1", name="f", arguments='{"a'),)))),
        ("stream_chunk.json", encode_live(StreamChunk(seq=4, done=True, error="stream_broken"))),
    ]


@pytest.mark.parametrize(("schema", "body"), _payloads())
def test_real_payloads_validate(schema: str, body: bytes) -> None:
    _validator(schema).validate(json.loads(body))


@pytest.mark.parametrize(("schema", "doc"), [
    ("verdict.json", {**json.loads(encode(VERDICT)), "status": "maybe"}),
    ("verdict.json", {k: v for k, v in json.loads(encode(VERDICT)).items() if k != "snapshot_lsn"}),
    ("cancel_run.json", {"run_id": "r-1", "unknown": 1}),
    ("run_control.json", {"run_id": "r-1", "signal": "paused", "lsn": 3}),
    ("stream_chunk.json", {"content": "no seq"}),
    ("respond_run.json", {"run_id": "r-1", "request_id": "q-1", "decision": "maybe"}),
    ("commit.json", {"commit_id": "c", "run_id": "r", "events": [{"type": "run_exploded"}]}),
    ("start_run.json", {"workflow": {"name": "w", "steps": [{"kind": "robot", "id": "x"}]}}),
])
def test_bad_payloads_are_rejected(schema: str, doc: dict[str, Any]) -> None:
    assert not _validator(schema).is_valid(doc)
