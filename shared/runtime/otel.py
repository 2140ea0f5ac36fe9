"""Export a run's spans (shared/core/run/traces.py) with the OpenTelemetry SDK: OTLP over HTTP, or any SpanExporter.

:func:`sdk_spans` turns :class:`~reel.shared.core.run.traces.SpanRecord` values into the SDK's
``ReadableSpan`` with the records' own ids (no tracer: nothing random, so a re-export of the
same log carries the same trace and span ids, and a collector sees the same spans again);
:func:`export_spans` hands them to an exporter. :func:`trace_run` reads a run's log and
workflow through the ports and exports it. The OTLP endpoint: ``--otlp-endpoint`` of
``reel trace``, else ``$OTEL_EXPORTER_OTLP_ENDPOINT`` (``/v1/traces`` is appended, as the
OTLP exporter specification says), else ``http://localhost:4318``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from reel.shared.application.workflows import WorkflowCache
from reel.shared.core.errors import ReelError
from reel.shared.core.ports import EventLog
from reel.shared.core.run.events import RunCreated
from reel.shared.core.run.traces import SpanRecord, run_spans
from reel.shared.core.workflow.spec import WorkflowSpec

SCOPE = InstrumentationScope("reel", "1")
_KINDS = {"INTERNAL": SpanKind.INTERNAL, "CLIENT": SpanKind.CLIENT}
_STATUS = {"UNSET": StatusCode.UNSET, "OK": StatusCode.OK, "ERROR": StatusCode.ERROR}


def _context(trace_id: int, span_id: int) -> SpanContext:
    return SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def sdk_spans(records: Sequence[SpanRecord], *, service_name: str = "reel") -> list[ReadableSpan]:
    """The SDK spans of ``records`` (resource ``service.name`` = ``service_name``), ids and times as given."""
    resource = Resource.create({"service.name": service_name})
    out = []
    for r in records:
        status = Status(_STATUS[r.status], r.status_description or None) if r.status == "ERROR" \
            else Status(_STATUS[r.status])
        out.append(ReadableSpan(
            name=r.name, context=_context(r.trace_id, r.span_id),
            parent=_context(r.trace_id, r.parent_id) if r.parent_id is not None else None,
            resource=resource, attributes=dict(r.attributes), kind=_KINDS[r.kind], status=status,
            events=[Event(e.name, dict(e.attributes), e.time_ns) for e in r.events],
            start_time=r.start_ns, end_time=r.end_ns, instrumentation_scope=SCOPE))
    return out


def export_spans(records: Sequence[SpanRecord], exporter: SpanExporter) -> SpanExportResult:
    """Export ``records`` in one batch; the exporter's result (``SUCCESS`` or ``FAILURE``)."""
    return exporter.export(sdk_spans(records))


def otlp_exporter(endpoint: str | None = None, *, timeout_s: float = 10.0) -> SpanExporter:
    """An OTLP/HTTP (protobuf) span exporter to ``endpoint`` (a base URL, see module doc), or to
    ``$OTEL_EXPORTER_OTLP_ENDPOINT``; ``endpoint`` may also be the full ``…/v1/traces`` URL."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    base = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
    url = base if base.rstrip("/").endswith("/v1/traces") else base.rstrip("/") + "/v1/traces"
    return OTLPSpanExporter(endpoint=url, timeout=timeout_s)


async def run_trace(log: EventLog, workflows: WorkflowCache | None, run_id: str) -> list[SpanRecord]:
    """The spans of ``run_id``: its whole log read through ``log``, its workflow from ``workflows`` (the model
    names; without it, or if the blob is missing or invalid, step ids stand in).

    Raises:
        RunNotFound: no such run. RunCorrupt: a bad commit in its log.
    """
    commits = await log.read(run_id)
    workflow: WorkflowSpec | None = None
    created = next((e for _, c in commits[:1] for e in c.events if isinstance(e, RunCreated)), None)
    if workflows is not None and created is not None:
        try:
            workflow = await workflows.load(created.workflow_ref)
        except ReelError:
            workflow = None
    return run_spans(commits, workflow)
