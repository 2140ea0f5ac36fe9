"""Prometheus metrics of a Reel process, and the opt-in ``/metrics`` endpoint (docs/operations.md "Metrics").

Counted in two places only: every commit a process appends (``JetStreamEventLog.commit_async``
calls :func:`observe_commit` once JetStream acked it), and the consumer shell's queue depths
(:func:`set_consumer_depth`, from each delivery's metadata and a poll every
:data:`DEPTH_POLL_S` seconds while the endpoint is on). From the commits:

==================================  =========  =============================================================
metric                              type       labels / meaning
==================================  =========  =============================================================
``reel_commits_total``              counter    commits appended (``rate()`` = commits/s)
``reel_attempts_total``             counter    ``kind`` (model, tool), ``outcome`` (succeeded, failed, cancelled)
``reel_attempt_duration_seconds``   histogram  ``kind``: dispatch → outcome, from the events' ``at_ms`` (s)
``reel_verdicts_total``             counter    ``verifier``, ``status`` (pass, fail, error)
``reel_spend_tokens_total``         counter    ``source`` (reported, estimated, recorded, none): model tokens
``reel_spend_usd_total``            counter    ``source``: USD of model outcomes (what budgets count)
``reel_halts_total``                counter    ``reason`` (budget_exhausted, code_changed), ``budget`` (the limit,
                                               or ``-``): runs stopped before a call (``step_halted``)
``reel_budget_spent_ratio``         histogram  ``budget``: at a ``budget_exhausted`` halt, spent ÷ limit
``reel_consumer_pending``           gauge      ``durable``: commands queued, not yet delivered
``reel_consumer_ack_pending``       gauge      ``durable``: delivered, not yet acked (in flight)
==================================  =========  =============================================================

An attempt's kind is read from its ``attempt_dispatched``: a model attempt records its prompt or
context partition, a tool attempt neither (an agent's turns are model attempts, its tool calls tool
attempts). Its duration is known when this process appended the dispatch too (else the outcome's
recorded ``latency_ms`` if any); the counters count every outcome.

The endpoint is off by default: ``REEL_METRICS_PORT`` (``0``: any free port, logged) makes a
service serve ``http://<REEL_METRICS_ADDR or 0.0.0.0>:<port>/metrics`` with prometheus_client's
own HTTP server (a thread).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from reel.shared.core.run.eventfields import usage_source
from reel.shared.core.run.events import (
    AnyEvent,
    AttemptCancelled,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    StepHalted,
    VerdictRecorded,
)

log = structlog.get_logger(__name__)

PORT_ENV = "REEL_METRICS_PORT"
ADDR_ENV = "REEL_METRICS_ADDR"
DEPTH_POLL_S = 5.0
_OPEN_MAX = 10_000  # dispatches remembered for their duration (oldest forgotten first)

REGISTRY = CollectorRegistry()
COMMITS = Counter("reel_commits", "Commits appended by this process", registry=REGISTRY)
ATTEMPTS = Counter("reel_attempts", "Attempt outcomes recorded by this process", ["kind", "outcome"],
                   registry=REGISTRY)
DURATION = Histogram("reel_attempt_duration_seconds", "Attempt latency, dispatch to outcome (s)", ["kind"],
                     buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900), registry=REGISTRY)
VERDICTS = Counter("reel_verdicts", "Verdicts recorded by this process", ["verifier", "status"], registry=REGISTRY)
SPEND_TOKENS = Counter("reel_spend_tokens", "Tokens of model outcomes recorded by this process", ["source"],
                       registry=REGISTRY)
SPEND_USD = Counter("reel_spend_usd", "USD of model outcomes recorded by this process", ["source"], registry=REGISTRY)
HALTS = Counter("reel_halts", "Runs stopped before a call (step_halted)", ["reason", "budget"], registry=REGISTRY)
SPENT_RATIO = Histogram("reel_budget_spent_ratio", "At a budget_exhausted halt: spent / limit", ["budget"],
                        buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0, 1.5), registry=REGISTRY)
PENDING = Gauge("reel_consumer_pending", "Commands queued on the durable consumer, not yet delivered", ["durable"],
                registry=REGISTRY)
ACK_PENDING = Gauge("reel_consumer_ack_pending", "Commands delivered, not yet acked", ["durable"], registry=REGISTRY)

_dispatched: dict[tuple[str, str, str, int], tuple[str, int]] = {}  # (run, branch, step, attempt) → (kind, at_ms)
_serving: list[int] = []


def _kind(ev: AttemptDispatched) -> str:
    return "model" if ev.context is not None or ev.prompt_ref is not None else "tool"


def observe_commit(run_id: str, events: Sequence[AnyEvent]) -> None:
    """Count one appended commit and the attempt outcomes and verdicts in it (see module doc)."""
    COMMITS.inc()
    for ev in events:
        if isinstance(ev, AttemptDispatched):
            if len(_dispatched) >= _OPEN_MAX:
                _dispatched.pop(next(iter(_dispatched)))
            _dispatched[(run_id, ev.branch_id, ev.step_id, ev.attempt)] = (_kind(ev), ev.at_ms)
        elif isinstance(ev, AttemptSucceeded | AttemptFailed | AttemptCancelled):
            outcome = {AttemptSucceeded: "succeeded", AttemptFailed: "failed"}.get(type(ev), "cancelled")
            kind, at_ms = _dispatched.pop((run_id, ev.branch_id, ev.step_id, ev.attempt), (None, None))
            if kind is None:
                model = ev.usage.source is not msgspec.UNSET or ev.usage.input_tokens or ev.usage.output_tokens
                kind = "model" if model else "tool"  # a failed model call has 0 tokens but names its source
            ATTEMPTS.labels(kind=kind, outcome=outcome).inc()
            seconds = (ev.at_ms - at_ms) / 1000 if at_ms is not None else ev.usage.latency_ms / 1000
            if seconds > 0 or at_ms is not None:
                DURATION.labels(kind=kind).observe(max(0.0, seconds))
            if kind == "model":
                source = usage_source(ev.usage)
                SPEND_TOKENS.labels(source=source).inc(ev.usage.input_tokens + ev.usage.output_tokens)
                SPEND_USD.labels(source=source).inc(max(0.0, ev.usage.cost_usd))
        elif isinstance(ev, StepHalted):
            limit = ev.budget if isinstance(ev.budget, str) else "-"
            HALTS.labels(reason=ev.reason, budget=limit).inc()
            if isinstance(ev.limit, float | int) and isinstance(ev.spent, float | int) and ev.limit > 0:
                SPENT_RATIO.labels(budget=limit).observe(ev.spent / ev.limit)
        elif isinstance(ev, VerdictRecorded):
            VERDICTS.labels(verifier=ev.verdict.verifier, status=ev.verdict.status).inc()


def set_consumer_depth(durable: str, pending: int | None, ack_pending: int | None = None) -> None:
    """Set the queue-depth gauges of ``durable`` (``None``: leave that one as it is)."""
    if pending is not None:
        PENDING.labels(durable=durable).set(pending)
    if ack_pending is not None:
        ACK_PENDING.labels(durable=durable).set(ack_pending)


def enabled() -> bool:
    """True if this process serves ``/metrics`` (:func:`serve_from_env` started it)."""
    return bool(_serving)


def serve_from_env(env: dict[str, str] | None = None) -> int | None:
    """Start the ``/metrics`` endpoint if ``REEL_METRICS_PORT`` is set (once per process); the port, or ``None``.

    A port that cannot be bound costs a ``metrics.unavailable`` warning, never the service.
    """
    e = os.environ if env is None else env
    raw = e.get(PORT_ENV)
    if not raw:
        return None
    if _serving:
        return _serving[0]
    try:
        server, _ = start_http_server(int(raw), addr=e.get(ADDR_ENV) or "0.0.0.0", registry=REGISTRY)
    except (OSError, ValueError) as exc:
        log.warning("metrics.unavailable", port=raw, error=str(exc))
        return None
    port = int(server.server_port)
    _serving.append(port)
    log.info("metrics.listening", port=port, path="/metrics")
    return port
