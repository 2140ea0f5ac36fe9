"""``reel mcp`` answers the ``mcp`` SDK's own client (``stdio_client`` + ``ClientSession``): a real ``reel mcp``
process over stdio, against the test server with the services running in this process, lists its tools, starts
workflows, follows runs to their verdicts and answers their input requests; and the same over streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[2]

TOOLS = {"list_workflows", "list_runs", "start_workflow", "follow_run", "read_timeline", "get_verdicts",
         "list_pending", "answer_request", "rewind_run", "fork_run", "compare_branches", "cancel_run"}


@pytest.fixture
async def services(infra: Infra, cfg: Config) -> AsyncIterator[None]:
    from reel.services.cancel.app import serve as cancel
    from reel.services.executor.app import serve as executor
    from reel.services.rewind.app import serve as rewind
    from reel.services.verifier.app import serve as verifier

    async with running(executor, infra, cfg), running(verifier, infra, cfg), running(cancel, infra, cfg), \
            running(rewind, infra, cfg):
        yield


def _args(cfg: Config, *more: str) -> list[str]:
    return ["-m", "reel.services.cli", "mcp", "--nats-url", cfg.nats_url, "--namespace", cfg.names.namespace,
            "--workflows", str(REPO / "examples"), *more]


@contextlib.asynccontextmanager
async def stdio_session(cfg: Config) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=_args(cfg), cwd=str(REPO),
                                   env={k: v for k, v in os.environ.items() if k not in ("NATS_URL",)})
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, name: str, progress: list[Any] | None = None, **arguments: Any
               ) -> dict[str, Any]:
    """The tool's structured result (its one text block, JSON); an error result raises AssertionError."""
    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        assert progress is not None
        progress.append((p, message))

    result = await session.call_tool(name, arguments, progress_callback=on_progress if progress is not None
                                     else None)
    assert not result.is_error, (name, result.content)
    assert isinstance(result.content[0], types.TextContent)
    doc: dict[str, Any] = json.loads(result.content[0].text)
    return doc


async def test_the_sdks_client_lists_starts_and_follows_a_run_to_its_verdicts(cfg: Config, services: None) -> None:
    async with stdio_session(cfg) as session:
        listed = await session.list_tools()
        assert {t.name for t in listed.tools} == TOOLS
        schemas = {t.name: t.input_schema for t in listed.tools}
        assert schemas["start_workflow"]["type"] == "object"
        assert set(schemas["start_workflow"]["properties"]) == {"path", "yaml", "key", "labels"}
        assert schemas["follow_run"]["required"] == ["run_id"]
        assert schemas["answer_request"]["properties"]["decision"]["enum"] == ["approve", "reject", "answer"]
        read_only = {t.name for t in listed.tools if t.annotations and t.annotations.read_only_hint}
        assert read_only == {"list_workflows", "list_runs", "follow_run", "read_timeline", "get_verdicts",
                             "list_pending", "compare_branches"}

        workflows = await call(session, "list_workflows")
        assert {"path": "hello.yaml", "name": "hello-reel"}.items() <= next(
            w for w in workflows["workflows"] if w["path"] == "hello.yaml").items()

        started = await call(session, "start_workflow", path="hello.yaml", key="mcp-1", labels={"from": "mcp"})
        run_id = started["run_id"]
        assert started["created"] is True and run_id.startswith("r-")
        progress: list[Any] = []
        followed = await call(session, "follow_run", progress, run_id=run_id, timeout_s=120)
        assert followed["status"] == "completed" and followed["rested"] is True, followed
        assert followed["result"]["outcome"] == "passed", followed["result"]
        assert {v["verifier"] for v in followed["result"]["verdicts"]} and \
            all(v["status"] == "pass" for v in followed["result"]["verdicts"])
        lsns = [c["lsn"] for c in followed["commits"]]
        assert lsns == list(range(1, followed["head_lsn"] + 1)), lsns  # every commit once, in order
        assert any("run created: hello-reel" in e for e in followed["commits"][0]["events"])
        assert progress and progress[-1][0] == followed["head_lsn"], progress  # a notification per batch

        again = await call(session, "follow_run", run_id=run_id, since_lsn=followed["head_lsn"], timeout_s=5)
        assert (again["commits"], again["status"]) == ([], "completed")  # a finished run: at once, nothing new

        timeline = await call(session, "read_timeline", run_id=run_id)
        assert [s["step_id"] for s in timeline["steps"]] == ["plan", "run", "summarize"]
        assert "summarize" in timeline["text"] and "rate_limited" in timeline["text"]
        verdicts = await call(session, "get_verdicts", run_id=run_id)
        assert verdicts["outcome"] == "passed" and verdicts["verdicts"] == followed["result"]["verdicts"]
        runs = await call(session, "list_runs")
        assert [(r["run_id"], r["labels"]) for r in runs["runs"]] == [(run_id, {"from": "mcp"})]

        rewound = await call(session, "rewind_run", run_id=run_id, at_step="summarize", key="k")
        assert rewound["created"] is True and rewound["branch_id"].startswith("b-")
        after = await call(session, "follow_run", run_id=run_id, since_lsn=followed["head_lsn"], timeout_s=120)
        assert after["status"] == "completed" and after["result"]["branch_id"] == rewound["branch_id"], after

        refused = await session.call_tool("get_verdicts", {"run_id": "r-00000000000000000000"})
        assert refused.is_error and "run_not_found" in str(refused.content[0]), refused
        outside = await session.call_tool("start_workflow", {"path": "/etc/passwd"})
        assert outside.is_error and "no workflow file" in str(outside.content[0]), outside


async def test_an_inline_workflow_waits_for_input_and_is_answered_then_another_is_cancelled(
        cfg: Config, services: None) -> None:
    yaml = (REPO / "examples/agent/approval.yaml").read_text()
    async with stdio_session(cfg) as session:
        run_id = (await call(session, "start_workflow", yaml=yaml))["run_id"]
        waiting = await call(session, "follow_run", run_id=run_id, timeout_s=120)
        assert waiting["status"] == "awaiting_input", waiting
        asks = {r["tool"]: r["request_id"] for r in waiting["pending"]}
        assert set(asks) == {"deploy", "ask_user"}
        assert {r["request_id"] for r in (await call(session, "list_pending"))["requests"]} == set(asks.values())
        await call(session, "answer_request", run_id=run_id, request_id=asks["ask_user"], decision="answer",
                   text="v2", by="ana")
        await call(session, "answer_request", run_id=run_id, request_id=asks["deploy"], decision="approve",
                   arguments={"env": "staging", "version": "v2"})
        done = await call(session, "follow_run", run_id=run_id, since_lsn=waiting["head_lsn"], timeout_s=120)
        assert done["status"] == "completed" and done["result"]["outcome"] == "passed", done
        closed = await session.call_tool("answer_request", {"run_id": run_id, "request_id": asks["deploy"],
                                                            "decision": "reject", "note": "late"})
        assert closed.is_error and "request_answered" in str(closed.content[0])

        other = (await call(session, "start_workflow", yaml=yaml, key="to-cancel"))["run_id"]
        assert (await call(session, "follow_run", run_id=other, timeout_s=120))["status"] == "awaiting_input"
        cancelled = await call(session, "cancel_run", run_id=other, reason="not today", by="ana")
        assert cancelled["cancelled"] is True and cancelled["previous_status"] == "awaiting_input"
        assert (await call(session, "follow_run", run_id=other, timeout_s=30))["status"] == "cancelled"


async def test_a_fork_with_an_edit_then_the_branches_compared(cfg: Config, services: None) -> None:
    async with stdio_session(cfg) as session:
        run_id = (await call(session, "start_workflow", path="agent/fix_typo.yaml"))["run_id"]
        first = await call(session, "follow_run", run_id=run_id, timeout_s=120)
        assert first["status"] == "completed", first
        refused = await session.call_tool("fork_run", {"run_id": run_id, "at": "fix:t1", "restore": ["task"]})
        assert refused.is_error and "invalid_edit" in str(refused.content[0])

        forked = await call(session, "fork_run", run_id=run_id, at="fix:t1", restore=["old-notes"],
                            params={"temperature": 0}, by="ana")
        branch = forked["branch_id"]
        again = await call(session, "follow_run", run_id=run_id, since_lsn=first["head_lsn"], timeout_s=120)
        assert again["status"] == "completed", again

        c = await call(session, "compare_branches", run_id=run_id)
        assert [b["branch_id"] for b in c["branches"]] == ["main", branch] and c["baseline"] == "main"
        diff = next(p for p in c["partitions"] if p["branch_id"] == branch)
        assert diff["step_id"] == "fix:t1" and diff["restored"] == ["old-notes"], diff
        assert "old-notes" in diff["packed_added"]
        unknown = await session.call_tool("compare_branches", {"run_id": run_id, "branches": ["main", "b-nope"]})
        assert unknown.is_error and "branch_not_found" in str(unknown.content[0])


async def test_streamable_http(cfg: Config, services: None) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, *_args(cfg, "--http", "127.0.0.1:0"),
                                                cwd=str(REPO), stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stderr is not None
        while b"streamable HTTP on " not in (line := await asyncio.wait_for(proc.stderr.readline(), 30)):
            assert line, "reel mcp --http exited"
        url = line.decode().split("streamable HTTP on ", 1)[1].strip()  # printed once it listens
        async with streamable_http_client(url) as (read, write, *_), \
                ClientSession(read, write) as session:
            hello = await session.initialize()
            assert hello.server_info.name == "reel" and hello.server_info.version == metadata.version("reel")
            assert {t.name for t in (await session.list_tools()).tools} == TOOLS
            run_id = (await call(session, "start_workflow", path="hello.yaml"))["run_id"]
            followed = await call(session, "follow_run", run_id=run_id, timeout_s=120)
            assert followed["result"]["outcome"] == "passed", followed
    finally:
        proc.terminate()
        await proc.wait()


async def test_with_an_auth_directory_it_needs_only_the_client_role(tmp_path: Path) -> None:
    from tests.integration.authserver import auth_server, services_as_roles

    async with auth_server(tmp_path) as srv, services_as_roles(srv, "executor", "verifier", "cancel", "rewind"):
        only_client = tmp_path / "client-only"  # the client's credentials (and the hashes): no other role's
        only_client.mkdir(mode=0o700)
        for name in ("client.env", "auth.conf"):
            shutil.copy2(srv.dir.path / name, only_client / name)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("REEL_NATS_", "NATS_"))},
               "REEL_AUTH_DIR": str(only_client)}
        params = StdioServerParameters(command=sys.executable, cwd=str(REPO), env=env, args=[
            "-m", "reel.services.cli", "mcp", "--nats-url", srv.base.nats_url, "--namespace",
            srv.base.names.namespace, "--workflows", str(REPO / "examples")])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            run_id = (await call(session, "start_workflow", path="hello.yaml"))["run_id"]
            followed = await call(session, "follow_run", run_id=run_id, timeout_s=120)
            assert followed["result"]["outcome"] == "passed", followed
            timeline = await call(session, "read_timeline", run_id=run_id)
            assert [s["step_id"] for s in timeline["steps"]] == ["plan", "run", "summarize"]
