"""Helpers of the live agent tests (test_agent_live.py, test_agent_takeover.py): the workflow, its tools, and
readers of everything a run wrote (to grep it for the API key).

The tools themselves are in agent_tools.py (python) and agent_cmd.py (command).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

from reel.shared.core.agent.turncontext import tool_schemas, tools_tokens
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.run.events import Commit
from reel.shared.core.run.planning import TextFacts
from reel.shared.core.run.state import RunState
from reel.shared.core.workflow.spec import AgentStep, WorkflowSpec, parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import REPO
from tests.support.chat_server import ChatServer

KEY_ENV = "REEL_TEST_AGENT_KEY"
KEY = f"sk-reel-secret-{uuid.uuid4().hex}"
CMD = REPO / "tests" / "integration" / "agent_cmd.py"
BACKGROUND = "background " * 700  # 1400 tokens: fits turn 1's budget, not beside turn 1's results in turn 2

LOOKUP = {"name": "lookup", "description": "Look a key up.", "python": "tests.integration.agent_tools:lookup",
          "parameters": {"type": "object", "properties": {"key": {"type": "string"}, "meet_in": {"type": "string"}},
                         "required": ["key"]}}


def checks_tool(log_dir: Path, *, exit_code: int = 0, name: str = "run_checks") -> dict[str, Any]:
    return {"name": name, "description": "Run the checks.", "retry_safe": True, "timeout_s": 30,
            "command": [sys.executable, str(CMD), str(log_dir), str(exit_code)],
            "pass_env": ["REEL_TEST_HOLD_DIR"],  # set only in a doomed executor's environment (agent_cmd.py)
            "parameters": {"type": "object",
                           "properties": {"suite": {"type": "string"}, "meet_in": {"type": "string"}}}}


ITEMS_BUDGET = 1500
"""The tokens a live agent's items may take (the background fits turn 1, not beside turn 1's results in turn 2);
the step's budget is this plus its tools' schemas (counted first: docs/context.md)."""


def agent_workflow(server: ChatServer, tools: list[dict[str, Any]], **agent: Any) -> WorkflowSpec:
    def spec(budget: int) -> WorkflowSpec:
        return parse_workflow({"name": "live-agent", "steps": [{
            "kind": "agent", "id": "solve", "max_turns": 4, "max_attempts": 2, "max_parallel_tools": 4,
            "instructions": "You are a careful agent. Use the tools, then answer.",
            "context": [{"id": "task", "kind": "task", "text": "Find the answer and run the checks."},
                        {"id": "notes", "kind": "scratch", "text": "private scratch notes"},
                        {"id": "background", "kind": "doc", "text": BACKGROUND, "priority": -1.0}],
            "policy": {"budget_tokens": budget, "exclude_kinds": ["scratch"]},
            "model": {"adapter": "openai", "base_url": server.url, "model": "loopback-1", "api_key_env": KEY_ENV,
                      "timeout_s": 10, "params": {"temperature": 0},
                      "price": {"input_usd_per_mtok": 0.15, "output_usd_per_mtok": 0.60}},
            "tools": tools, **agent}]})
    step = spec(ITEMS_BUDGET).steps[0]
    assert isinstance(step, AgentStep)
    return spec(ITEMS_BUDGET + tools_tokens(tool_schemas(step), TextFacts(DEFAULT_COUNTER)))


def runs_of(log_dir: Path) -> list[dict[str, Any]]:
    path = log_dir / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def start_and_rest(client: ReelClient, spec: WorkflowSpec, timeout_s: float = 60) -> RunState:
    started = await client.start(spec)
    assert started.ok and started.run_id, started
    return await client.wait_for(started.run_id, ("verifying", "completed", "cancelled"), timeout_s=timeout_s)


def turn_partition_ok(state: RunState, step_id: str, candidates: set[str], *, branch: str | None = None) -> None:
    """The context partition over one turn: every attempt has a partition, disjoint, whose union is the candidates."""
    attempts = state.branches[branch or state.active_branch].attempts[step_id]
    for a in attempts:
        c = a.context
        assert c is not None, f"{step_id}#{a.attempt} has no partition"
        packed, available, dropped = set(c.packed), set(c.available), set(c.dropped)
        assert not (packed & available) and not (packed & dropped) and not (available & dropped)
        assert len(packed) + len(available) + len(dropped) == len(c.packed + c.available + c.dropped)
        assert packed | available | dropped == candidates, (step_id, c)
        assert dropped, "a capture that only records packed is the half-implementation"


async def stream_bytes(infra: Infra, cfg: Config) -> bytes:
    """Every message of the namespace's events stream, raw."""
    info = await infra.js.stream_info(cfg.names.events_stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await infra.js.get_msg(cfg.names.events_stream, seq)
        out.append(msg.data or b"")
    return b"\n".join(out)


async def all_blobs(infra: Infra) -> list[bytes]:
    return [bytes((await infra.blobs.get(o.name)).data or b"") for o in await infra.blobs.list()]


async def commits_of(event_log: JetStreamEventLog, run_id: str) -> list[Commit]:
    return [c for _, c in await event_log.read(run_id)]
