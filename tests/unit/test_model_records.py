"""What a model answer says about itself, read purely: finish reasons as sent, usage sources, cut answers."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from reel.services.executor.modelout import (
    MAX_RETRY_AFTER_S,
    RETRY_BASE_S,
    RETRY_MAX_S,
    one_line,
    retry_delay_s,
)
from reel.services.timeline import rows
from reel.shared.core.chat.finish import is_truncated, truncation_message
from reel.shared.core.chat.messages import ChatRequest, prompt_request, response_from_wire
from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.run.eventfields import Usage, usage_source
from reel.shared.core.run.events import AttemptFailed
from reel.shared.core.run.ids import LSN, AttemptNo, BranchId, ExecutorId, StepId
from reel.shared.core.run.state import AttemptStatus
from reel.shared.core.run.views import AttemptView, usage_by_source
from reel.shared.core.workflow.modelspec import ModelSpec
from reel.shared.core.workflow.spec import AgentStep, parse_workflow
from reel.shared.models import make_chat_model
from reel.shared.models.openai import retry_after_s, server_message

SPEC = ModelSpec(adapter="openai", base_url="http://127.0.0.1:1/v1", model="m")


def _body(choice: dict[str, object], usage: bool = True) -> dict[str, object]:
    body: dict[str, object] = {"model": "m", "choices": [{"message": {"role": "assistant", "content": "hi"}, **choice}]}
    if usage:
        body["usage"] = {"prompt_tokens": 3, "completion_tokens": 1}
    return body


@pytest.mark.parametrize(("choice", "expected"), [
    ({"finish_reason": "stop"}, "stop"), ({"finish_reason": "length"}, "length"),
    ({"finish_reason": "eos"}, "eos"), ({"finish_reason": None}, None), ({}, None), ({"finish_reason": 1}, "1"),
])
def test_the_finish_reason_is_kept_exactly_as_sent(choice: dict[str, object], expected: str | None) -> None:
    assert response_from_wire(_body(choice), turn=1, spec=SPEC).finish_reason == expected


def test_usage_says_whether_the_server_reported_it() -> None:
    assert response_from_wire(_body({}), turn=1, spec=SPEC).usage_source == "reported"
    none = response_from_wire(_body({}, usage=False), turn=1, spec=SPEC)
    assert (none.usage_source, none.input_tokens) == ("none", 0)


def test_cut_answers_are_named() -> None:
    assert is_truncated("length") and is_truncated("content_filter")
    assert not is_truncated("stop") and not is_truncated(None) and not is_truncated("tool_calls")
    assert truncation_message("length") == "the model's answer was cut at max_tokens (finish_reason length)"
    assert "content filter" in truncation_message("content_filter")


def test_on_truncated_is_validated_and_defaults_to_fail() -> None:
    base = {"kind": "agent", "id": "a", "context": [{"id": "t", "kind": "task", "text": "x"}],
            "model": {"adapter": "scripted", "turns": [{"text": "y"}]}}
    step = parse_workflow({"name": "w", "steps": [base]}).steps[0]
    assert isinstance(step, AgentStep) and step.truncation_policy == "fail" and step.on_truncated is msgspec.UNSET
    with pytest.raises(WorkflowInvalid, match="on_truncated"):
        parse_workflow({"name": "w", "steps": [{**base, "on_truncated": "ignore"}]})


def test_scripted_and_replayed_usage_say_what_they_are() -> None:
    req = ChatRequest(run_id="r", step_id="s:t1", messages=())
    counted = ModelSpec(adapter="scripted", turns=({"text": "hi"},))  # type: ignore[arg-type]
    recorded = ModelSpec(adapter="replay", turns=(  # type: ignore[arg-type]
        {"text": "hi", "usage": {"input_tokens": 5, "output_tokens": 2}, "finish_reason": "length"},))
    a = asyncio.run(make_chat_model(msgspec.convert(msgspec.to_builtins(counted), ModelSpec)).complete_chat(req))
    b = asyncio.run(make_chat_model(msgspec.convert(msgspec.to_builtins(recorded), ModelSpec)).complete_chat(req))
    assert (a.usage_source, a.finish_reason) == ("estimated", "stop")
    assert (b.usage_source, b.finish_reason, b.input_tokens) == ("recorded", "length", 5)
    plain = ModelSpec(adapter="scripted", outputs=("text",))
    resp = asyncio.run(make_chat_model(plain).complete_chat(prompt_request(plain, run_id="r", step_id="s", attempt=1,
                                                                            prompt="p", prompt_tokens=4)))
    assert (resp.usage_source, resp.finish_reason) == ("estimated", "stop")


def _attempt(usage: Usage) -> AttemptView:
    return AttemptView(step_id=StepId("s"), attempt=AttemptNo(1), status=AttemptStatus.SUCCEEDED,
                       executor_id=ExecutorId("x"), dispatched_lsn=LSN(1), usage=usage)


def test_estimates_are_summed_apart_from_reported_usage() -> None:
    views = [_attempt(Usage(input_tokens=984, output_tokens=120, source="reported")),
             _attempt(Usage(input_tokens=204, output_tokens=31, source="estimated")),
             _attempt(Usage(latency_ms=3.0, source="none")), _attempt(Usage(input_tokens=1))]  # unlabelled: reported
    split = usage_by_source(views)
    assert isinstance(split, dict) and list(split) == ["reported", "estimated", "none"]
    assert (split["reported"].input_tokens, split["estimated"].input_tokens, split["none"].input_tokens) == (985, 204,
                                                                                                             0)
    assert usage_by_source([_attempt(Usage(input_tokens=1))]) is msgspec.UNSET  # an old log: nothing labelled
    assert usage_source(Usage()) == "reported"
    assert rows.tokens_cell(views[1]) == "204/31 estimated" and rows.tokens_cell(views[3]) == "1/0"


@pytest.mark.parametrize(("body", "expected"), [
    ({"error": {"message": "bad content", "code": "invalid"}}, ("bad content", "invalid")),
    ({"detail": [{"loc": ["body", "messages", 2, "content"], "msg": "Input should be a valid string"}]},
     ("body.messages.2.content: Input should be a valid string", "")),
    ({"detail": "Not Found"}, ("Not Found", "")),
    ({"message": "model not loaded", "type": "server"}, ("model not loaded", "server")),
    ({"error": "model 'x' not found"}, ("model 'x' not found", "")),  # Ollama
    ({"status": "bad"}, ("", "")), ("plain text", ("", "")),
])
def test_the_server_s_own_message_is_read_from_its_error_body(body: object, expected: tuple[str, str]) -> None:
    assert server_message(body) == expected


def test_a_long_message_keeps_its_head_and_its_tail_on_one_line() -> None:
    text = "start\n" + "x" * 5000 + "\nthe cause"
    line = one_line(text, max_chars=100)
    assert len(line) == 100 and line.startswith("start x") and line.endswith("x the cause") and "…" in line
    assert one_line("a\n  b") == "a b"


def _failed(kind: str = "server_error", attempt: int = 1, retryable: bool = True) -> AttemptFailed:
    return AttemptFailed(branch_id=BranchId("main"), step_id=StepId("s"), attempt=AttemptNo(attempt),
                         error_kind=kind, message="m", retryable=retryable, at_ms=0)


def test_retries_back_off_with_full_jitter_and_honour_retry_after_capped() -> None:
    for n in (1, 2, 3, 10):
        delays = [retry_delay_s(_failed(attempt=n), None, "openai") for _ in range(200)]
        high = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (n - 1))
        assert all(0 <= d <= high for d in delays) and max(delays) > high / 2 and len(set(delays)) > 100
    assert retry_delay_s(_failed(), 1.0, "openai") == 1.0
    assert retry_delay_s(_failed(), 10_000.0, "openai") == MAX_RETRY_AFTER_S
    assert retry_delay_s(_failed(retryable=False), 5.0, "openai") == 0.0
    assert retry_delay_s(_failed("truncated"), None, "openai") == 0.0  # a cut answer: the server is fine
    assert retry_delay_s(_failed(), None, "scripted") == 0.0


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_s({"retry-after": "1"}) == 1.0
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now_s=1445412470.0) == 10.0
    assert retry_after_s({"retry-after-ms": "250"}) == 0.25 and retry_after_s({}) is None
