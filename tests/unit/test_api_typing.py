"""A user's script using the Python API passes ``mypy --strict`` — and a wrong use of it does not (the types are
real: ``py.typed``, a typed decorator, typed replies)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

USER_SCRIPT = '''
from __future__ import annotations

import asyncio

import reel


@reel.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@reel.tool(name="lookup", retry_safe=True, timeout_s=5.0, max_output_bytes=4096)
async def lookup(key: str, *, idempotency_key: str, attempt: int) -> str:
    """Look a key up."""
    return f"{key}@{attempt}:{idempotency_key}"


total: int = add(2, 3)
tools: list[reel.Tool] = [add, lookup, reel.command_tool("ls", ["ls"]), reel.ask_user()]
agent = reel.Agent(name="a", instructions="i", tools=tools,
                   model=reel.ScriptedModel(turns=[{"text": "hi"}]),
                   verifiers=[reel.Verifier(type="output_regex", pattern="hi")])
live = reel.Agent(name="b", instructions="i",
                  model=reel.OpenAIModel(base_url="http://127.0.0.1:8000/v1", model="m", api_key_env="KEY"))
spec: reel.Workflow = agent.workflow("task")


async def main() -> None:
    async with reel.local() as client:
        handle: reel.RunHandle = await client.start(agent, input="say hi", key="k")
        result: reel.RunResult = await handle.result(timeout_s=60.0)
        outcome: reel.Outcome | None = result.outcome
        passed: bool = result.passed
        verdicts: list[tuple[str, str]] = [(v.verifier, v.status) for v in result.verdicts]
        tokens: int = result.usage.input_tokens + result.usage.output_tokens
        async for commit in handle.events(follow=False):
            lsn: int = commit.lsn
        for request in await handle.pending():
            reply: reel.RespondReply = await handle.approve(request.request_id, arguments={"a": 1})
        rewound: reel.RewindReply = await handle.rewind(at="a")
        cancelled: reel.CancelReply = await handle.cancel("done")
        again: reel.RunHandle = client.get(handle.run_id)
        print(outcome, passed, verdicts, tokens, rewound.branch_id, cancelled.cancelled, again.run_id)
    try:
        remote = await reel.Client.connect("nats://127.0.0.1:4222", namespace="reel")
    except reel.ReelError as exc:
        code: str = exc.code
        retryable: bool = exc.retryable
        print(code, retryable)
    else:
        worker = reel.Worker(remote, tools=[add], agents=[agent])
        await worker.run()


asyncio.run(main())
result: reel.RunResult = reel.run_sync(agent, input="say hi")
'''

WRONG = '''
import reel


@reel.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


add("two", 3)
reel.Agent(name="a", instructions="i")
'''


@pytest.mark.slow
def test_a_users_script_passes_mypy_strict_and_a_wrong_use_does_not(tmp_path: Path) -> None:
    """One ``mypy --strict`` over two user scripts in a folder of their own; ``reel`` found as installed
    (``MYPYPATH`` = the repository: the editable install's import hook is invisible to mypy), its own modules
    checked silently as an installed package's are."""
    (tmp_path / "user_script.py").write_text(textwrap.dedent(USER_SCRIPT))
    (tmp_path / "wrong_use.py").write_text(textwrap.dedent(WRONG))
    env = {**os.environ, "MYPYPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
                           "user_script.py", "wrong_use.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert not [e for e in errors if e.startswith("user_script.py")], done.stdout + done.stderr
    assert any('Argument 1 to "__call__" of "FunctionTool" has incompatible type "str"; expected "int"' in e
               for e in errors), done.stdout
    assert any('Missing named argument "model" for "Agent"' in e for e in errors), done.stdout
    assert len(errors) == 2, done.stdout
