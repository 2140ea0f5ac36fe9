"""``reel trace RUN``: export a run as OpenTelemetry GenAI spans (docs/operations.md "Traces").

The spans are a pure function of the run's log (shared/core/run/traces.py), exported with the
OpenTelemetry SDK over OTLP/HTTP (shared/runtime/otel.py) to ``--otlp-endpoint`` or
``$OTEL_EXPORTER_OTLP_ENDPOINT``; ``--json`` prints them instead (one JSON object per span).
Exporting again sends the same trace and span ids.
"""

from __future__ import annotations

import os
import sys

import msgspec
import typer

from reel.services.cli.console import CliError, Namespace, NatsUrl, console, run_async
from reel.services.cli.embed import session
from reel.shared.core.errors import RunNotFound


def trace(
    run_id: str = typer.Argument(..., help="the run id"),
    otlp_endpoint: str | None = typer.Option(None, "--otlp-endpoint", help="OTLP/HTTP base URL, e.g. "
                                             "http://localhost:4318 (default: $OTEL_EXPORTER_OTLP_ENDPOINT)"),
    json_out: bool = typer.Option(False, "--json", help="print the spans as JSON lines instead of exporting"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Export a run's trace: invoke_agent per branch, chat per model attempt, execute_tool per tool attempt."""
    from reel.shared.runtime.otel import otlp_exporter, run_trace, sdk_spans

    endpoint = otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")

    async def body() -> int:
        if not json_out and not endpoint:
            raise CliError("no OTLP endpoint: pass --otlp-endpoint URL or set OTEL_EXPORTER_OTLP_ENDPOINT "
                           "(or --json to print the spans)", 2)
        async with session(nats_url, namespace, services=()) as s:
            if await s.client.log.first_lsn(run_id) is None:  # a typo: say so, never an empty trace and exit 0
                raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
            records = await run_trace(s.client.log, s.workflows, run_id)
        if json_out:
            for r in records:  # ids as OTLP/JSON writes them: lowercase hex (a 128-bit int loses digits in JS)
                span = msgspec.to_builtins(r)
                span.update(trace_id=f"{r.trace_id:032x}", span_id=f"{r.span_id:016x}",
                            parent_id=None if r.parent_id is None else f"{r.parent_id:016x}")
                sys.stdout.write(msgspec.json.encode(span).decode() + "\n")
            return 0
        exporter = otlp_exporter(endpoint)
        try:
            result = exporter.export(sdk_spans(records))
        finally:
            exporter.shutdown()
        if result.name != "SUCCESS":
            raise CliError(f"the OTLP endpoint {endpoint} did not accept the {len(records)} spans")
        trace_id = f"{records[0].trace_id:032x}" if records else "-"
        console.print(f"exported {len(records)} spans of run {run_id} (trace {trace_id}) to {endpoint}", soft_wrap=True)
        return 0

    run_async(body(), json_out=json_out)
