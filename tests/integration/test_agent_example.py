"""The shipped agent example (examples/agent), run as the README runs it: the ``reel`` command in a real process.

* the README's main job — ``reel run examples/agent/fix_typo.yaml`` on the embedded default (no server
  given): the scripted agent fixes the typo in its branch's working copy, its tests pass there, the shipped files
  are untouched; turns, tool calls and partitions are printed and in ``reel show --json``;
* the same agent against an OpenAI-compatible endpoint by setting two environment variables
  (fix_typo_live.yaml), here the loopback chat-completions server over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

from reel.shared.core.workflow.spec import AgentStep, load_workflow
from tests.support.chat_server import ChatServer, call, reply

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "agent"
SHIPPED = (EXAMPLE / "project" / "wordfreq" / "__init__.py").read_text()


async def reel(*args: str, env: dict[str, str], timeout_s: float = 120) -> tuple[int, str, str]:
    """``python -m reel.services.cli ARGS`` from the repository root (as ``.venv/bin/reel`` there)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.cli", *args, cwd=REPO, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The user's environment with no server named: the embedded default, its store and the scratch copies
    under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REEL_NAMESPACE")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**env, "REEL_HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp"), "COLUMNS": "200", **extra}


def _scratch(tmp_path: Path, run_id: str) -> Path:
    """The main branch's working copy of the example's workspace (docs/workspaces.md)."""
    return tmp_path / "tmp" / "reel-workspaces" / run_id / "main"


def _tests_pass(project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "unittest"], cwd=project, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def _shipped_untouched() -> None:
    assert (EXAMPLE / "project" / "wordfreq" / "__init__.py").read_text() == SHIPPED
    assert "most_comon(" in SHIPPED
    assert not list((EXAMPLE / "project").rglob("__pycache__"))


async def test_readme_main_job_runs_the_agent_example(tmp_path: Path) -> None:
    env = _env(tmp_path)
    code, out, err = await reel("run", "examples/agent/fix_typo.yaml", env=env)
    assert code == 0, (out, err)
    run_id = re.search(r"run (r-[0-9a-f]{20}) created", out).group(1)  # type: ignore[union-attr]
    assert "outcome passed" in out and "tests-pass" in out
    # progress as the commits land: each turn with its partition, each tool call with its tool and id
    for t in (1, 2, 3, 4):
        assert re.search(rf"turn {t} of fix: fix:t{t}\n.*fix:t{t}#1 dispatched  context packed=\d+ available=\d+ "
                         rf"dropped=1", out), out
    assert re.search(r"fix:t1:c0 tool call read_file\(\{\"path\":\"wordfreq/__init__.py\"\}\)  id call_t1_0\n"
                     r"\s+fix:t1:c1 tool call run_tests\(\{\}\)  id call_t1_1", out), out
    assert "fix:t1:c1#1 failed: exit_1: run_tests exited 1" in out  # the failing test: an error observation
    assert "fix:t2:c0 tool call write_file(" in out and "agent fix succeeded after 4 turns" in out
    assert "agent fix: succeeded, 4 turns, 4 tool calls (1 error observation)" in out

    # the scratch copy is fixed and its tests pass; the shipped files are not
    scratch = _scratch(tmp_path, run_id)
    assert (scratch / "wordfreq" / "__init__.py").read_text() == SHIPPED.replace("most_comon(", "most_common(")
    done = _tests_pass(scratch)
    assert done.returncode == 0 and "OK" in done.stderr, done.stderr
    _shipped_untouched()

    # reel show --json: every turn with its partition, every call with tool, call id, status, is_error
    code, out, err = await reel("show", run_id, "--json", env=env)
    assert code == 0, err
    view = json.loads(out)
    steps = {s["step_id"]: s for s in view["steps"]}
    assert [s["step_id"] for s in view["steps"]] == [
        "fix", "fix:t1", "fix:t1:c0", "fix:t1:c1", "fix:t2", "fix:t2:c0", "fix:t3", "fix:t3:c0", "fix:t4"]
    for t in ("fix:t1", "fix:t2", "fix:t3", "fix:t4"):
        part = steps[t]["attempts"][-1]["context"]
        assert steps[t]["kind"] == "model" and steps[t]["parent_step"] == "fix"
        assert "instructions" in part["packed"] and "task" in part["packed"] and part["dropped"] == ["old-notes"]
    assert steps["fix:t3"]["attempts"][-1]["context"]["available"] == ["fix:t1:msg", "fix:t1:c0:obs",
                                                                       "fix:t1:c1:obs"]  # the oldest turn's group
    calls = [(s["step_id"], s["tool_name"], s["call_id"], s["status"], s["is_error"]) for s in view["steps"]
             if s["kind"] == "tool"]
    assert calls == [("fix:t1:c0", "read_file", "call_t1_0", "succeeded", False),
                     ("fix:t1:c1", "run_tests", "call_t1_1", "failed", True),
                     ("fix:t2:c0", "write_file", "call_t2_0", "succeeded", False),
                     ("fix:t3:c0", "run_tests", "call_t3_0", "succeeded", False)]


def test_live_file_differs_only_in_its_model() -> None:
    scripted = load_workflow(EXAMPLE / "fix_typo.yaml", env={})
    live = load_workflow(EXAMPLE / "fix_typo_live.yaml", env={})
    a, b = scripted.steps[0], live.steps[0]
    assert isinstance(a, AgentStep) and isinstance(b, AgentStep)
    assert msgspec.structs.replace(b, model=a.model) == a
    assert (b.model.adapter, b.model.base_url, b.model.model) == ("openai", "https://api.openai.com/v1", "gpt-4o-mini")
    mine = load_workflow(EXAMPLE / "fix_typo_live.yaml", env={"REEL_AGENT_BASE_URL": "http://127.0.0.1:11434/v1",
                                                               "REEL_AGENT_MODEL": "qwen2.5-coder:7b"})
    assert (mine.steps[0].model.base_url, mine.steps[0].model.model) == (  # type: ignore[union-attr]
        "http://127.0.0.1:11434/v1", "qwen2.5-coder:7b")


def _scripted_turns() -> list[dict[str, Any]]:
    """The scripted file's turns, as a chat-completions server would answer them."""
    spec = load_workflow(EXAMPLE / "fix_typo.yaml", env={})
    step = spec.steps[0]
    assert isinstance(step, AgentStep)
    return [reply(t.text, [call(c.name, c.arguments, id=f"call_{i}_{j}") for j, c in enumerate(t.tool_calls)])
            for i, t in enumerate(step.model.scripted_turns)]


async def test_two_variables_point_the_example_at_an_endpoint(tmp_path: Path, chat_server: ChatServer) -> None:
    chat_server.script(*_scripted_turns())
    env = _env(tmp_path, REEL_AGENT_BASE_URL=chat_server.url, REEL_AGENT_MODEL="loopback-coder",
               OPENAI_API_KEY="sk-example-not-a-real-key")
    code, out, err = await reel("run", "examples/agent/fix_typo_live.yaml", env=env)
    assert code == 0, (out, err)
    run_id = re.search(r"run (r-[0-9a-f]{20}) created", out).group(1)  # type: ignore[union-attr]
    assert len(chat_server.requests) == 4 and chat_server.unscripted == 0
    first, last = chat_server.requests[0].body, chat_server.requests[-1].body
    assert first["model"] == "loopback-coder" and first["temperature"] == 0
    assert [t["function"]["name"] for t in first["tools"]] == ["read_file", "write_file", "run_tests"]
    assert [m["role"] for m in last["messages"]][:2] == ["system", "user"]
    assert "sk-example-not-a-real-key" not in out + err
    assert (_scratch(tmp_path, run_id) / "wordfreq" / "__init__.py").read_text() == SHIPPED.replace(
        "most_comon(", "most_common(")
    _shipped_untouched()
