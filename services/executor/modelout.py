"""A model attempt (a ``kind: model`` step's — one turn with no tools — or an agent turn's): the call, and its
outcome recorded honestly.

* The prompt blob is the exact wire request, secrets scrubbed (:func:`request_body`).

* One call (:func:`ask`): the step's chat model (the one model port), streamed when asked; an adapter's own
  bug (any exception but a :class:`~reel.shared.core.errors.ModelError`) is a failed attempt
  ``adapter_error`` (not retryable), never an executor crash.

* The finish reason goes on the outcome exactly as the server sent it (``None``: it sent none).
* An answer the server cut (``length``, ``content_filter``: :mod:`reel.shared.core.chat.finish`) is
  never recorded as a plain success: with the step's ``on_truncated`` ``fail`` or ``retry`` the
  attempt fails ``truncated`` (its cut answer kept as the ``error_ref`` blob), with ``continue``
  it succeeds marked ``truncated: true``.
* Usage says its source (``reported``, ``estimated``, ``recorded``, ``none``); a failed call records
  only what it reported — by default ``none`` and 0 tokens (a refused connection processed nothing).
* A failed call's whole error body (a server's error response) becomes the ``error_ref`` blob, and its
  one-line message keeps the server's own message (head and tail when long: :func:`one_line`).
* A failed tool attempt (:func:`tool_failure`) is recorded the same way whether a tool step's or an agent's call.
* A retry waits (:func:`retry_delay_s`): the server's ``Retry-After`` when it sent one, else full jitter —
  before its intent is committed (:class:`RetryWaits`), for a model step as for an agent turn.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import structlog
import tenacity

from reel.shared.auth import secrets
from reel.shared.core.chat.finish import TRUNCATED, OnTruncated, is_truncated, truncation_message
from reel.shared.core.chat.messages import ChatRequest, ChatResponse, wire_request
from reel.shared.core.errors import ModelError, ToolError
from reel.shared.core.pack.tokencount import TokenCounter
from reel.shared.core.run import timers
from reel.shared.core.run.eventfields import UsageSource
from reel.shared.core.run.events import AttemptFailed, AttemptSucceeded, BlobRef, Usage
from reel.shared.core.run.ids import AttemptNo, BranchId, StepId
from reel.shared.core.workflow.modelspec import ModelSpec
from reel.shared.models import make_chat_model
from reel.shared.nats.blobstore import ref_for
from reel.shared.nats.control import Interrupt
from reel.shared.runtime.clock import now_ms

from .interrupts import Interrupted, stopped_within
from .streaming import StreamOut, streamed

log = structlog.get_logger("reel.executor")

JSON = "application/json"
"""The media type of a prompt body (the wire request) and of an agent turn's output (the response message)."""

MAX_ERROR_CHARS = 4000
"""The longest one-line error message recorded (characters); the whole body is the ``error_ref`` blob."""

Where = tuple[BranchId, StepId, AttemptNo]


async def ask(spec: ModelSpec, request: ChatRequest, counter: TokenCounter, out: StreamOut | None = None
              ) -> ChatResponse:
    """One attempt's call of the chat model ``spec`` names; ``out``: where a streamed response's fragments go
    (services/executor/streaming.py).

    Raises:
        ModelError: the call failed (an adapter's own exception: kind ``adapter_error``, not retryable).
    """
    try:
        model = make_chat_model(spec, counter)
        call: Any = model.complete_chat(request) if out is None else model.complete_chat(
            request, on_delta=out)  # type: ignore[call-arg]  # a streaming adapter takes it (models/base.py)
        response: ChatResponse = await streamed(call, out, lambda r: r.finish_reason)
    except ModelError:
        raise
    except Exception as exc:  # a custom adapter's bug: a failed attempt, never an executor crash
        raise ModelError(f"adapter raised {type(exc).__name__}: {exc}", kind="adapter_error",
                         retryable=False) from exc
    return response


def request_body(request: ChatRequest) -> tuple[ChatRequest, bytes]:
    """The request to send and its prompt body (the exact wire request, JSON), with any secret in it (a workflow's
    text) scrubbed from both: it is neither sent nor recorded."""
    body = msgspec.json.encode(wire_request(request))
    if secrets.scrub_bytes(body) != body:
        request = msgspec.convert(secrets.current().scrub_value(msgspec.to_builtins(request)), type(request))
        body = msgspec.json.encode(wire_request(request))
    return request, body


def answer_outcome(where: Where, *, body: bytes, media_type: str, finish_reason: str | None, usage: Usage,
                   policy: OnTruncated, inline_max: int = 0) -> tuple[AttemptSucceeded | AttemptFailed, BlobRef]:
    """The outcome of an answer whose output is ``body`` (the text, or the exact response message): a
    success (``truncated`` when cut and ``policy`` is ``continue``), or a ``truncated`` failure (``policy``
    ``fail``: not retryable; ``retry``: retryable) whose ``error_ref`` is ``body``. Also the body's ref."""
    branch_id, step_id, attempt = where
    ref = ref_for(body, media_type, inline_max=inline_max)
    cut = is_truncated(finish_reason)
    if cut and policy != "continue":
        assert finish_reason is not None
        return AttemptFailed(branch_id=branch_id, step_id=step_id, attempt=attempt, error_kind=TRUNCATED,
                             message=truncation_message(finish_reason), retryable=policy == "retry", usage=usage,
                             at_ms=now_ms(), finish_reason=finish_reason, error_ref=ref), ref
    return AttemptSucceeded(branch_id=branch_id, step_id=step_id, attempt=attempt, output_ref=ref, usage=usage,
                            at_ms=now_ms(), finish_reason=finish_reason,
                            truncated=True if cut else msgspec.UNSET), ref


def answer_usage(input_tokens: int, output_tokens: int, latency_ms: float, cost_usd: float,
                 source: UsageSource) -> Usage:
    """A model answer's usage, labelled with where its counts come from."""
    return Usage(input_tokens=input_tokens, output_tokens=output_tokens, latency_ms=latency_ms, cost_usd=cost_usd,
                 source=source)


def failure_usage(exc: BaseException, latency_ms: float) -> Usage:
    """A failed model call's usage: only what it reported (``exc``'s tokens when its ``usage_source`` is
    ``reported``), else 0 tokens, ``none``; its billed cost either way."""
    source = getattr(exc, "usage_source", "none")
    cost = float(getattr(exc, "cost_usd", 0.0))
    if source == "reported":
        return Usage(input_tokens=int(getattr(exc, "input_tokens", 0)), output_tokens=int(getattr(exc, "output_tokens",
                     0)), latency_ms=latency_ms, cost_usd=cost, source="reported")
    return Usage(latency_ms=latency_ms, cost_usd=cost, source="none")


def failure(where: Where, exc: ModelError | BaseException, usage: Usage, *, inline_max: int = 0
            ) -> tuple[AttemptFailed, bytes | None]:
    """A failed model attempt: kind, the one-line message (scrubbed, at most :data:`MAX_ERROR_CHARS`), and
    the whole error body as ``error_ref`` (returned too, to store with the commit) when ``exc`` carries one."""
    branch_id, step_id, attempt = where
    body = secrets.scrub_bytes(exc.body) if isinstance(exc, ModelError) and exc.body else None
    ref: BlobRef | msgspec.UnsetType = msgspec.UNSET
    if body is not None:
        assert isinstance(exc, ModelError)
        ref = ref_for(body, exc.body_media_type, inline_max=inline_max)
    message = one_line(secrets.scrub(str(getattr(exc, "message", str(exc)))))
    return AttemptFailed(branch_id=branch_id, step_id=step_id, attempt=attempt,
                         error_kind=str(getattr(exc, "kind", "model_error")), message=message,
                         retryable=bool(getattr(exc, "retryable", True)), usage=usage, at_ms=now_ms(),
                         error_ref=ref), body


def tool_failure(where: Where, exc: ToolError | Interrupted, latency_ms: float) -> AttemptFailed:
    """A failed tool attempt (a tool step's, or an agent's tool call): its kind and retryability as the tool
    runner said (:func:`reel.shared.proc.tools.run_command`'s vocabulary, an agent tool's own kinds, or
    ``interrupted``), the message scrubbed and cut at :data:`MAX_ERROR_CHARS`. A tool that asked to be run again
    later (:class:`~reel.shared.core.run.timers.ResumeRequested`) gets its ``resume_at_ms``."""
    branch_id, step_id, attempt = where
    at = now_ms()
    return AttemptFailed(branch_id=branch_id, step_id=step_id, attempt=attempt, error_kind=exc.kind,
                         message=secrets.scrub(exc.message)[:MAX_ERROR_CHARS], retryable=exc.retryable,
                         usage=Usage(latency_ms=latency_ms), at_ms=at,
                         resume_at_ms=at + round(exc.seconds * 1000) if isinstance(exc, timers.ResumeRequested)
                         else msgspec.UNSET)


def one_line(message: str, max_chars: int = MAX_ERROR_CHARS) -> str:
    """``message`` on one line (whitespace runs as one space), and when longer than ``max_chars`` its head and
    its tail with ``…`` between: a server's message often ends with its cause."""
    flat = " ".join(message.split())
    if len(flat) <= max_chars:
        return flat
    half = (max_chars - 1) // 2
    return flat[:half] + "…" + flat[len(flat) - (max_chars - 1 - half):]


RETRY_BASE_S = 0.5
"""Full-jitter backoff of a model call's retry: attempt *n+1* waits a random time in [0, min(cap, base·2^(n-1))] s."""
RETRY_MAX_S = 30.0
"""The cap of the jittered backoff (s)."""
MAX_RETRY_AFTER_S = 600.0
"""The longest a server's ``Retry-After`` delays a model call's next attempt (s)."""
NO_BACKOFF_ADAPTERS = frozenset({"scripted", "replay"})
"""Adapters with no server to spare: their retries go at once."""
_JITTER = tenacity.wait_random_exponential(multiplier=RETRY_BASE_S, max=RETRY_MAX_S)


def retry_delay_s(failure: AttemptFailed, retry_after_s: float | None, adapter: str) -> float:
    """How long (s) the next attempt after ``failure`` waits: 0 when it is not retried, for a cut answer
    (``truncated``: the server is fine) and for :data:`NO_BACKOFF_ADAPTERS`; the server's ``Retry-After``
    when it sent one (capped at :data:`MAX_RETRY_AFTER_S`); else full jitter over the attempts so far
    (``tenacity.wait_random_exponential``, :data:`RETRY_BASE_S`, :data:`RETRY_MAX_S`)."""
    if not failure.retryable or failure.error_kind == TRUNCATED or adapter in NO_BACKOFF_ADAPTERS:
        return 0.0
    if retry_after_s is not None:
        return min(max(0.0, retry_after_s), MAX_RETRY_AFTER_S)
    state = tenacity.RetryCallState(None, None, (), {})  # type: ignore[arg-type]  # only attempt_number is read
    state.attempt_number = int(failure.attempt)
    return float(_JITTER(state))


class RetryWaits:
    """When each step's next model attempt may go (one per drive, or per executor for plain steps): a failed
    attempt's wait (:func:`retry_delay_s`), kept per ``(branch, step)`` as a monotonic time and waited out
    before the next attempt's intent is committed — a ``kind: model`` step's and an agent turn's alike."""

    def __init__(self) -> None:
        self._due: dict[tuple[str, str], float] = {}

    def failed(self, failure: AttemptFailed, exc: BaseException, adapter: str) -> float:
        """Note ``failure`` (its call raised ``exc``; ``adapter``: the step's): how long (s) its step's next
        attempt waits."""
        delay = retry_delay_s(failure, getattr(exc, "retry_after_s", None), adapter)
        if delay > 0:
            self._due[(failure.branch_id, failure.step_id)] = time.monotonic() + delay
        return delay

    def pending(self, branch_id: str, step_id: str) -> bool:
        """True while ``(branch, step)``'s next attempt must still wait."""
        due = self._due.get((branch_id, step_id))
        return due is not None and due > time.monotonic()

    async def wait(self, branch_id: str, step_id: str, attempt: int, stopping: asyncio.Event | None,
                   interrupt: Interrupt | None) -> bool:
        """Wait until ``(branch, step)``'s attempt ``attempt`` may go, unless ``stopping`` is set or ``interrupt``
        fires first: then ``True`` (the attempt must not start; the driver plans again). Forgets the wait."""
        due = self._due.pop((branch_id, step_id), None)
        left = 0.0 if due is None else due - time.monotonic()
        if left <= 0:
            return False
        log.info("attempt.backoff", step_id=step_id, attempt=attempt, delay_s=round(left, 3))
        return await stopped_within(left, stopping, interrupt)
