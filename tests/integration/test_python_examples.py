"""The shipped YAML examples and their Python twins (examples/python/) are the same workflow and log the same
commits: each pair is run on one ``reel.local()`` — the YAML file by path, the twin's agent or workflow object —
and the two logs compared commit by commit, event by event, modulo ids and times (:func:`normalised`). The approval
example is compared up to where it rests awaiting its two answers (how the answers' commits group depends on
when each arrives); both are then answered alike and must end alike.

What differs between two runs of one workflow and is replaced before comparing: the run id, commit ids, request
ids and executor ids (each by a placeholder in order of appearance, wherever they occur, so which commit names which
id still has to agree), every ``*_ms`` time and latency, LSNs (the stream sequence is shared by every run: by
their ordinal in the run's log), a command's own timing in its output (``Ran 2 tests in 0.001s``; with the
sha256 of a body carried inline, which hashes it), and ``run_created.source_dir`` (where the YAML file is; a
Python object has none).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

import reel
from examples.python import approval, fix_typo, fix_typo_live, hello
from reel.shared.core.run.events import BlobRef
from reel.shared.core.workflow.spec import AgentStep, encode_workflow, load_workflow
from tests.support.chat_server import Behaviour, ChatServer, call, reply

REPO = Path(__file__).resolve().parents[2]
IDS = ("run_id", "commit_id", "executor_id", "writer", "request_id")
TIMING = re.compile(r"\b\d+\.\d+s\b")


def _twin(name: str) -> reel.Workflow:
    """The twin's workflow as the executor receives it (decoded from the start command's JSON)."""
    target: Any = {"hello": lambda: hello.workflow, "approval": lambda: approval.agent.workflow(approval.TASK),
                   "fix_typo": lambda: fix_typo.agent.workflow(fix_typo.TASK),
                   "fix_typo_live": lambda: fix_typo_live.live_agent().workflow(fix_typo.TASK)}[name]()
    return msgspec.json.decode(msgspec.json.encode(target), type=reel.Workflow)


PAIRS = {"hello": "examples/hello.yaml", "approval": "examples/agent/approval.yaml",
         "fix_typo": "examples/agent/fix_typo.yaml", "fix_typo_live": "examples/agent/fix_typo_live.yaml"}


def normalised(commits: list[reel.CommitEvent], bodies: dict[str, bytes], tmp: Path) -> list[Any]:
    """The commits as builtins with ids, times, LSNs and command timings replaced, each blob ref by its body
    (``bodies``: sha256 → body) with ``tmp`` (the run's temporary folder) and timings replaced; see the module
    docstring."""
    ordinal = {c.lsn: i for i, c in enumerate(commits, 1)}
    seen: dict[str, str] = {}

    def ident(kind: str, value: str) -> str:
        return seen.setdefault(value, f"<{kind}:{sum(1 for v in seen.values() if v.startswith(f'<{kind}:'))}>")

    def text(t: str) -> str:
        # a file's workspace `from:` is relative to its folder, an agent's to the cwd: the same folder
        return TIMING.sub("<t>s", t.replace(str(tmp), "<tmp>")).replace(
            '\\"from\\":\\"examples/agent/project\\"', '\\"from\\":\\"project\\"').replace(
            '"from":"examples/agent/project"', '"from":"project"')

    def walk(v: Any, key: str = "") -> Any:
        if isinstance(v, dict):
            if "sha256" in v and "media_type" in v:  # a blob ref: what it holds, not its hash
                body = v["inline"] if "inline" in v else bodies[v["sha256"]].decode(errors="replace")
                return {"media_type": v["media_type"], "body": text(body)}
            return {k: walk(x, k) for k, x in v.items() if k != "source_dir"}
        if isinstance(v, list | tuple):  # to_builtins keeps tuples
            return [walk(x, key) for x in v]
        if key.endswith("_ms") and isinstance(v, int | float):
            return 0
        if "lsn" in key and isinstance(v, int):
            return f"<lsn {ordinal.get(v, v)}>"
        if key in IDS and isinstance(v, str):
            return ident(key.removesuffix("_id"), v)
        return text(v) if isinstance(v, str) else v

    raw = [{"lsn": c.lsn, "writer": c.writer, "commit_id": c.commit_id, "events": msgspec.to_builtins(c.events)}
           for c in commits]
    return walk(raw)  # type: ignore[no-any-return]


def _refs(v: Any) -> list[BlobRef]:
    """Every blob ref held (not inline) in ``v`` (events, recursively)."""
    if isinstance(v, BlobRef):
        return [] if isinstance(v.inline, str) else [v]
    if isinstance(v, msgspec.Struct):
        return [r for f in v.__struct_fields__ for r in _refs(getattr(v, f))]
    if isinstance(v, list | tuple):
        return [r for x in v for r in _refs(x)]
    return []


async def _log(handle: reel.RunHandle) -> list[reel.CommitEvent]:
    return [c async for c in handle.events(follow=False)]


async def _answer_all(handle: reel.RunHandle) -> None:
    for request in sorted(await handle.pending(), key=lambda r: r.call_id):
        if request.kind == "question":
            await handle.answer(request.request_id, "v2", by="test")
        else:
            await handle.approve(request.request_id, arguments={"env": "staging", "version": "v2"}, by="test")


def _live_turns() -> list[Behaviour]:
    """The scripted example's turns as a chat-completions server answers them."""
    step = load_workflow(REPO / PAIRS["fix_typo"]).steps[0]
    assert isinstance(step, AgentStep)
    return [reply(t.text, [call(c.name, c.arguments, id=f"call_{i}_{j}") for j, c in enumerate(t.tool_calls)])
            for i, t in enumerate(step.model.scripted_turns)]


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_each_twin_is_its_yaml_on_the_wire(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REEL_AGENT_BASE_URL", "http://127.0.0.1:9/v1")  # the live pair: one endpoint for both
    twin, yaml = _twin(name), load_workflow(REPO / PAIRS[name], env=os.environ)
    if isinstance(yaml.workspace, reel.Workspace):  # a file's `from:` is relative to its folder, an agent's to the cwd
        assert isinstance(twin.workspace, reel.Workspace)
        assert (REPO / twin.workspace.source).resolve() == (REPO / PAIRS[name]).parent.joinpath(
            yaml.workspace.source).resolve()
        twin = msgspec.structs.replace(twin, workspace=yaml.workspace)
    assert encode_workflow(twin) == encode_workflow(yaml)


async def _run(target: reel.Startable, task: str | None, key: str, tmp: Path, monkeypatch: pytest.MonkeyPatch
               ) -> tuple[list[Any], reel.Outcome | None]:
    """``target`` run on a ``reel.local()`` of its own under ``key``, its scratch copies in ``tmp``: its log
    (:func:`normalised`) up to where it rests, and its outcome once at its end (an approval run: both requests
    answered alike, after the log was taken)."""
    await asyncio.to_thread(tmp.mkdir)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the agent example's scratch copies (python tools)
    monkeypatch.setenv("TMPDIR", str(tmp))  # and its run_tests command
    async with reel.local() as client:
        handle = await client.start(target, input=task, key=key)
        result = await handle.result(timeout_s=120)
        commits = [c async for c in handle.events(follow=False)]
        blobs = handle._rc.blobs
        assert blobs is not None
        bodies = {r.sha256: await blobs.get(r) for c in commits for r in _refs(c.events)}
        if result.status == "awaiting_input":
            await _answer_all(handle)
            result = await handle.result(timeout_s=120)
    return normalised(commits, bodies, tmp), result.outcome


@pytest.mark.parametrize("name", sorted(PAIRS))
async def test_each_twin_logs_the_commits_its_yaml_logs(name: str, tmp_path: Path, chat_server: ChatServer,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the examples' command tools are paths relative to the repository root
    if name == "fix_typo_live":
        chat_server.script(*_live_turns(), *_live_turns())  # the same four answers for each run
        monkeypatch.setenv("REEL_AGENT_BASE_URL", chat_server.url)
        monkeypatch.setenv("REEL_AGENT_MODEL", "loopback-coder")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-example-not-a-real-key")
    twins: dict[str, Callable[[], reel.Agent | reel.Workflow]] = {
        "hello": lambda: hello.workflow, "approval": lambda: approval.agent, "fix_typo": lambda: fix_typo.agent,
        "fix_typo_live": fix_typo_live.live_agent}
    twin = twins[name]()
    task = None if isinstance(twin, reel.Workflow) else approval.TASK if name == "approval" else fix_typo.TASK
    key = f"twin-{name}"  # one key, two servers: the same run id, so text holding it is alike too
    yaml_log, yaml_end = await _run(REPO / PAIRS[name], None, key, tmp_path / "a", monkeypatch)
    python_log, python_end = await _run(twin, task, key, tmp_path / "b", monkeypatch)
    assert len(yaml_log) == len(python_log) > 3 and yaml_end == python_end == "passed"
    for i, (a, b) in enumerate(zip(yaml_log, python_log, strict=True)):
        assert a == b, f"commit {i + 1} differs:\nyaml   {json.dumps(a)[:3000]}\npython {json.dumps(b)[:3000]}"
