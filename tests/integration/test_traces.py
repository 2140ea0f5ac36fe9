"""OpenTelemetry GenAI traces of a real agent run (shared/core/run/traces.py, shared/runtime/otel.py): the shipped
scripted
agent example (examples/agent/fix_typo.yaml) run by an in-process executor and verifier, exported with the SDK's
in-memory exporter — the spans, their parentage and ``gen_ai.*`` attributes, and the same ids on a re-export."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reel.services.executor.app import serve as executor_serve
from reel.services.verifier.app import serve as verifier_serve
from reel.shared.application.workflows import WorkflowCache
from reel.shared.core.run.traces import run_spans, trace_id_of
from reel.shared.core.workflow.spec import load_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from reel.shared.runtime.otel import export_spans, run_trace
from tests.conftest import REPO, running

EXAMPLE = REPO / "examples" / "agent" / "fix_typo.yaml"


@pytest.fixture
async def agent_run(infra: Infra, cfg: Config, client: ReelClient, tmp_path: Path,
                    monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """The agent example, completed (its scratch copy under ``tmp_path``)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the command tools' scratch copy …
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # … is the python tools' (gettempdir is cached)
    spec = load_workflow(EXAMPLE)
    async with running(executor_serve, infra, cfg), running(verifier_serve, infra, cfg):
        reply = await client.start(spec, source_dir=str(EXAMPLE.parent))  # its workspace's `from` is relative
        assert reply.ok, reply
        state = await client.wait_for(reply.run_id, ("completed", "cancelled"), timeout_s=120)
    assert state.status == "completed", state.status
    yield reply.run_id


def _export(records: list) -> list[ReadableSpan]:  # type: ignore[type-arg]
    exporter = InMemorySpanExporter()
    assert export_spans(records, exporter).name == "SUCCESS"
    return list(exporter.get_finished_spans())


async def test_an_agent_run_exports_genai_spans(agent_run: str, event_log: JetStreamEventLog,
                                                blobs: JetStreamBlobStore) -> None:
    spans = _export(await run_trace(event_log, WorkflowCache(blobs), agent_run))
    by_id = {s.context.span_id: s for s in spans}
    assert {s.context.trace_id for s in spans} == {trace_id_of(agent_run)}

    [root] = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent fix-typo" and root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.conversation.id"] == agent_run and root.attributes["reel.outcome"] == "passed"
    evals = [e for e in root.events if e.name == "gen_ai.evaluation.result"]
    assert [(e.attributes["gen_ai.evaluation.name"], e.attributes["gen_ai.evaluation.score.label"])
            for e in evals] == [("tests-pass", "pass")]

    [agent] = [s for s in spans if s.name == "invoke_agent fix"]
    assert agent.parent is not None and agent.parent.span_id == root.context.span_id
    assert agent.attributes["reel.agent.status"] == "succeeded" and agent.attributes["reel.agent.turns"] == 4

    chats = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert [s.name for s in chats] == ["chat scripted-typo-fixer"] * 4
    assert [s.attributes["reel.step_id"] for s in chats] == ["fix:t1", "fix:t2", "fix:t3", "fix:t4"]
    for s in chats:
        assert s.parent is not None and s.parent.span_id == agent.context.span_id
        assert s.attributes["gen_ai.request.model"] == "scripted-typo-fixer"
        assert s.attributes["gen_ai.provider.name"] == "scripted"
        assert int(s.attributes["gen_ai.usage.input_tokens"]) > 0  # type: ignore[arg-type]
        assert int(s.attributes["gen_ai.usage.output_tokens"]) > 0  # type: ignore[arg-type]
        assert s.start_time is not None and s.end_time is not None and s.start_time <= s.end_time
        assert s.status.is_ok

    tools = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    assert [(s.name, s.attributes["gen_ai.tool.call.id"]) for s in tools] == [
        ("execute_tool read_file", "call_t1_0"), ("execute_tool run_tests", "call_t1_1"),
        ("execute_tool write_file", "call_t2_0"), ("execute_tool run_tests", "call_t3_0")]
    for s in tools:
        assert s.parent is not None and by_id[s.parent.span_id] is agent
        assert s.attributes["gen_ai.tool.name"] == s.name.removeprefix("execute_tool ")
    failing = tools[1]  # the first run of the tests fails: an error observation, recorded as a failed attempt
    assert failing.attributes["reel.attempt.status"] == "failed" and failing.attributes["error.type"] == "exit_1"
    assert not failing.status.is_ok
    assert len(spans) == 1 + 1 + 4 + 4


async def test_a_second_export_has_the_same_ids(agent_run: str, event_log: JetStreamEventLog,
                                                blobs: JetStreamBlobStore) -> None:
    first = _export(await run_trace(event_log, WorkflowCache(blobs), agent_run))
    again = _export(await run_trace(event_log, WorkflowCache(blobs), agent_run))

    def ids(spans: list[ReadableSpan]) -> list[tuple[int, int, int | None, str]]:
        return [(s.context.trace_id, s.context.span_id, s.parent.span_id if s.parent else None, s.name)
                for s in spans]

    assert ids(first) == ids(again) and len({s.context.span_id for s in first}) == len(first)
    assert [json.loads(s.to_json())["attributes"] for s in first] == [json.loads(s.to_json())["attributes"]
                                                                     for s in again]
    # a prefix of the log yields a prefix-compatible trace: every span of it keeps its id
    commits = await event_log.read(agent_run)
    partial = {r.span_id for r in run_spans(commits[: len(commits) // 2])}
    assert partial and partial <= {s.context.span_id for s in first}


async def test_reel_trace_prints_the_spans(agent_run: str, cfg: Config, tmp_path: Path) -> None:
    env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.cli", "trace", agent_run, "--json",
                                                cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    lines = [json.loads(x) for x in out.decode().splitlines()]
    assert [x["name"] for x in lines][:2] == ["invoke_agent fix-typo", "invoke_agent fix"]
    assert len(lines) == 10 and {x["trace_id"] for x in lines} == {f"{trace_id_of(agent_run):032x}"}
    assert all(len(x["span_id"]) == 16 for x in lines) and lines[0]["parent_id"] is None
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.cli", "trace", agent_run, cwd=REPO,
                                                env={k: v for k, v in env.items()
                                                     if k != "OTEL_EXPORTER_OTLP_ENDPOINT"},
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and "--otlp-endpoint" in err.decode()


async def test_reel_trace_exports_over_otlp_http(agent_run: str, cfg: Config) -> None:
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[ExportTraceServiceRequest] = []

    async def collect(request: web.Request) -> web.Response:
        body = ExportTraceServiceRequest()
        body.ParseFromString(await request.read())
        received.append(body)
        return web.Response(content_type="application/x-protobuf", body=b"")

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace}
        for _ in range(2):  # exported twice: the collector gets the same ids again
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "reel.services.cli", "trace", agent_run, "--otlp-endpoint", f"http://127.0.0.1:{port}",
                cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            assert f"exported 10 spans of run {agent_run} (trace {trace_id_of(agent_run):032x})" in out.decode()
    finally:
        await runner.cleanup()
    batches = [[(sp.trace_id, sp.span_id, sp.name) for rs in r.resource_spans for ss in rs.scope_spans
                for sp in ss.spans] for r in received]
    assert len(batches) == 2 and batches[0] == batches[1] and len(batches[0]) == 10
    assert {t for t, _, _ in batches[0]} == {trace_id_of(agent_run).to_bytes(16, "big")}
    assert sorted(n for _, _, n in batches[0] if n.startswith("chat ")) == ["chat scripted-typo-fixer"] * 4
