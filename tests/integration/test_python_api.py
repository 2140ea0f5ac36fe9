"""The Python API end to end: ``reel.local()`` (a real nats-server and every service in this process), handles,
typed replies and errors, human input, rewind, cancel, ``reel.Worker`` beside services of the fixtures' server,
and the sync facade inside a running loop."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import reel
from reel.events import AttemptSucceeded, RunCompleted, RunCreated
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.support.chat_server import ChatServer, streamed

CALLS: list[tuple[str, int, int]] = []


@reel.tool(retry_safe=True)
def add(a: int, b: int, *, idempotency_key: str, attempt: int) -> int:
    """Add two integers.

    Args:
        a: the first; b: the second.
    """
    CALLS.append((idempotency_key, attempt, a + b))
    return a + b


def adder(verifier_pattern: str = "= 5") -> reel.Agent:
    return reel.Agent(
        name="adder", instructions="Use the tools to answer.", tools=[add],
        model=reel.ScriptedModel(turns=[
            {"text": "adding", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
            {"text": "2 + 3 = 5"}]),
        verifiers=[reel.Verifier(type="output_regex", name="says-5", pattern=verifier_pattern)])


@pytest.fixture(scope="module")
async def local() -> AsyncIterator[reel.Client]:
    """One in-process Reel for the module (its own nats-server on a free port, a temporary store)."""
    async with reel.local() as client:
        yield client


async def test_an_agent_with_a_function_tool_runs_to_a_verdict(local: reel.Client) -> None:
    CALLS.clear()
    handle = await local.start(adder(), input="What is 2 + 3?", key="adder-1")
    assert handle.started is not None and handle.started.created
    result = await handle.result(timeout_s=60)
    assert (result.status, result.outcome, result.passed) == ("completed", "passed", True)
    assert [(v.verifier, v.status) for v in result.verdicts] == [("says-5", "pass")]
    assert result.output == "2 + 3 = 5"
    assert result.usage.input_tokens > 0
    calls = list(CALLS)
    assert calls == [(f"{handle.run_id}/main/adder:t1:c0", 1, 5)]  # it asked for both: it got both
    assert result.error is None

    commits = [c async for c in handle.events()]
    assert [c.lsn for c in commits] == list(range(1, len(commits) + 1))
    assert isinstance(commits[0].events[0], RunCreated) and isinstance(commits[-1].events[-1], RunCompleted)
    assert any(isinstance(e, AttemptSucceeded) and e.step_id == "adder:t1:c0" for c in commits for e in c.events)

    again = await local.start(adder(), input="What is 2 + 3?", key="adder-1")  # the key's run, not a new one
    assert again.run_id == handle.run_id and again.started is not None and not again.started.created
    with pytest.raises(reel.IdempotencyConflict) as conflict:
        await local.start(adder("= 6"), input="What is 2 + 3?", key="adder-1")
    assert conflict.value.code == "idempotency_conflict" and not conflict.value.retryable


async def test_a_run_that_did_not_pass_says_why(local: reel.Client) -> None:
    judged = await (await local.start(adder("= 6"), input="What is 2 + 3?")).result(timeout_s=60)
    assert (judged.outcome, judged.error) == ("failed", "verdict says-5: fail: " + judged.verdicts[0].reason)
    cut = reel.Agent(name="short", instructions="x", tools=[add], max_turns=1, model=reel.ScriptedModel(turns=[
        {"text": "adding", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}, {"text": "5"}]))
    failed = await (await local.start(cut, input="What is 2 + 3?")).result(timeout_s=60)
    assert failed.outcome == "failed" and failed.error is not None and failed.error.startswith("short failed: "), failed


async def test_a_tool_may_close_over_the_applications_objects(local: reel.Client) -> None:
    db: dict[str, str] = {"alice": "admin"}

    @reel.tool
    async def role_of(user: str) -> str:
        """The role of a user."""
        return db.get(user, "nobody")

    agent = reel.Agent(name="roles", instructions="Look it up.", tools=[role_of],
                       model=reel.ScriptedModel(turns=[{"tool_calls": [{"name": "role_of",
                                                                        "arguments": {"user": "alice"}}]},
                                                       {"text": "done"}]))
    handle = await local.start(agent, input="Alice's role?")
    result = await handle.result(timeout_s=60)
    assert result.outcome == "succeeded"
    view = await handle.state()
    assert view.status == "completed"
    outputs = [e for c in [c async for c in handle.events(follow=False)] for e in c.events
               if isinstance(e, AttemptSucceeded) and e.step_id == "roles:t1:c0"]
    assert len(outputs) == 1


async def test_approval_and_a_question_wait_for_a_human(local: reel.Client) -> None:
    deployed: list[str] = []

    @reel.tool(needs_approval=True)
    def deploy(env: str) -> str:
        """Deploy the build."""
        deployed.append(env)
        return f"deployed to {env}"

    agent = reel.Agent(name="ship", instructions="Ship it.", tools=[deploy, reel.ask_user()],
                       model=reel.ScriptedModel(turns=[
                           {"tool_calls": [{"name": "deploy", "arguments": {"env": "staging"}},
                                           {"name": "ask_user", "arguments": {"question": "Which version?"}}]},
                           {"text": "Deployed."}]))
    handle = await local.start(agent, input="Deploy.")
    waiting = await handle.result(timeout_s=60)
    assert waiting.status == "awaiting_input" and waiting.outcome is None and not deployed
    requests = {r.kind: r for r in await handle.pending()}
    assert requests["approval"].tool == "deploy" and requests["question"].question == "Which version?"
    answered = await handle.answer(requests["question"].request_id, "v2", by="test")
    assert answered.answered and answered.decision == "answer" and answered.lsn > 0
    approved = await handle.approve(requests["approval"].request_id, arguments={"env": "prod"})
    assert approved.answered
    result = await handle.result(timeout_s=60)
    assert result.status == "completed" and deployed == ["prod"]
    with pytest.raises(reel.RequestAnswered) as again:
        await handle.approve(requests["approval"].request_id)
    assert again.value.code == "request_answered"


async def test_rewind_cancel_and_errors_are_typed(local: reel.Client) -> None:
    handle = await local.start(adder(), input="What is 2 + 3?")
    first = await handle.result(timeout_s=60)
    rewound = await handle.rewind(at="adder", by="bob")
    assert rewound.created and rewound.branch_id != first.branch_id and rewound.from_step == "adder"
    forks = [e for c in [c async for c in handle.events(follow=False)] for e in c.events
             if isinstance(e, reel.events.BranchForked)]
    assert [(f.branch_id, f.by) for f in forks] == [(rewound.branch_id, "bob")]  # who, in the log
    second = await handle.result(timeout_s=60)
    assert second.status == "completed" and second.branch_id == rewound.branch_id
    done = await handle.cancel("too late")
    assert not done.cancelled and done.status == "completed"

    with pytest.raises(reel.StepNotFound):
        await handle.rewind(at="no-such-step")
    with pytest.raises(reel.RunNotFound) as missing:
        await local.get("r-00000000000000000000").cancel()
    assert missing.value.code == "run_not_found" and isinstance(missing.value, reel.ReelError)
    with pytest.raises(reel.WorkflowInvalid, match="input="):
        await local.start(adder().workflow("x"), input="again")


async def test_cancel_a_waiting_run(local: reel.Client) -> None:
    agent = reel.Agent(name="asks", instructions="Ask.", tools=[reel.ask_user()],
                       model=reel.ScriptedModel(turns=[{"tool_calls": [{"name": "ask_user",
                                                                        "arguments": {"question": "?"}}]},
                                                       {"text": "ok"}]))
    handle = await local.start(agent, input="Ask me.")
    assert (await handle.result(timeout_s=60)).status == "awaiting_input"
    cancelled = await handle.cancel("no one answers", by="bob")
    assert cancelled.cancelled and cancelled.previous_status == "awaiting_input" and cancelled.lsn > 0
    ends = [e for c in [c async for c in handle.events(follow=False)] for e in c.events
            if isinstance(e, reel.events.RunCancelled)]
    assert [(e.reason, e.by) for e in ends] == [("no one answers", "bob")]
    assert (await handle.result(timeout_s=10)).status == "cancelled"
    assert await handle.pending() == []


async def test_a_worker_serves_its_functions_beside_the_other_services(cfg: Config) -> None:
    """The fixtures' server runs verifier, cancel and rewind; the user's process runs the one executor."""
    from reel.services.cancel.app import serve as cancel_serve
    from reel.services.verifier.app import serve as verifier_serve
    from reel.shared.nats.infra import connect, ensure_infra

    seen: list[str] = []

    @reel.tool
    def note(text: str) -> str:
        """Remember a note."""
        seen.append(text)
        return "noted"

    agent = reel.Agent(name="noter", instructions="Note it.", tools=[note],
                       model=reel.ScriptedModel(turns=[{"tool_calls": [{"name": "note", "arguments": {"text": "hi"}}]},
                                                       {"text": "noted it"}]),
                       verifiers=[reel.Verifier(type="output_regex", pattern="noted")])
    nc = await connect(cfg, name="services")
    infra = await ensure_infra(nc, cfg)
    async with await reel.Client.connect(cfg.nats_url, namespace=cfg.names.namespace) as client, \
            running(verifier_serve, infra, cfg), running(cancel_serve, infra, cfg):
        worker = reel.Worker(client, agents=[agent])
        task = asyncio.create_task(worker.run())
        try:
            result = await (await client.start(agent, input="Note hi.")).result(timeout_s=60)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 60)
    await nc.close()
    assert result.outcome == "passed" and seen == ["hi"]


async def test_a_plain_executor_leaves_a_workers_runs_to_the_worker(cfg: Config) -> None:
    """Beside an executor that cannot import the tool (a `reel up` one), every run goes to the worker that serves
    it: the plain executor defers the start (its lease names no such tool; the worker's does), never refuses it."""
    from reel.services.cli.status import gather
    from reel.services.executor.app import serve as executor_serve
    from reel.services.verifier.app import serve as verifier_serve
    from reel.shared.nats.infra import connect, ensure_infra

    counter = {"n": 0}

    @reel.tool
    def bump() -> int:
        """Count one."""
        counter["n"] += 1
        return counter["n"]

    agent = reel.Agent(name="bumper", instructions="Bump.", tools=[bump],
                       model=reel.ScriptedModel(turns=[{"tool_calls": [{"name": "bump"}]}, {"text": "bumped"}]))
    nc = await connect(cfg, name="services")
    infra = await ensure_infra(nc, cfg)
    try:
        async with await reel.Client.connect(cfg.nats_url, namespace=cfg.names.namespace) as client, \
                running(verifier_serve, infra, cfg), running(executor_serve, infra, cfg):
            with pytest.raises(reel.WorkflowInvalid, match="no live executor serves it"):  # no worker yet: refused
                await client.start(agent, input="Bump.")
            worker = reel.Worker(client, tools=[bump])
            task = asyncio.create_task(worker.run())
            try:
                report = await gather(infra, cfg, timeout_s=0.3)
                while not any(x["tools"] for x in report["leases"]):
                    report = await gather(infra, cfg, timeout_s=0.3)
                assert sorted(x["tools"] for x in report["leases"]) == [[], [bump.path]]
                handles = [await client.start(agent, input=f"Bump {i}.") for i in range(4)]
                results = [await h.result(timeout_s=90) for h in handles]
            finally:
                worker.stop()
                await asyncio.wait_for(task, 60)
    finally:
        await nc.close()
    assert [r.outcome for r in results] == ["succeeded"] * 4 and counter["n"] == 4


async def test_run_sync_works_inside_a_running_event_loop() -> None:
    result = reel.run_sync(adder(), input="What is 2 + 3?")  # this test's loop is running: a worker thread's own
    assert result.passed and result.output == "2 + 3 = 5"

    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert reel.block_on(answer) == 42


def test_connect_to_nothing_is_a_clear_error() -> None:
    async def go() -> Any:
        return await reel.Client.connect("nats://127.0.0.1:9", connect_timeout_s=2)

    with pytest.raises(reel.ServiceUnavailable) as exc:
        reel.block_on(go)
    assert exc.value.code == "unavailable" and exc.value.retryable and "127.0.0.1:9" in exc.value.message


async def test_stream_yields_the_tokens_of_a_streamed_turn(local: reel.Client, chat_server: ChatServer) -> None:
    gate = asyncio.Event()  # the server holds the first chunk until the test is subscribed
    chat_server.script(streamed("The answer is 42.", chunks=6, gate=gate))
    agent = reel.Agent(name="streamer", instructions="Answer.",
                       model=reel.OpenAIModel(base_url=chat_server.url, model="loopback-1", stream=True, timeout_s=10))
    handle = await local.start(agent, input="The answer?")
    async with handle.stream() as tokens:
        gate.set()
        got = [t async for t in tokens]
    assert "".join(t.text for t in got) == "The answer is 42."
    assert {(t.step_id, t.attempt) for t in got} == {("streamer:t1", 1)} and got[-1].done and not got[-1].error
    assert (await handle.result(timeout_s=30)).output == "The answer is 42."


async def test_a_python_tools_own_output_cap_and_two_functions_under_one_name(local: reel.Client) -> None:
    @reel.tool(max_output_bytes=10)
    def shout() -> str:
        """Say a lot."""
        return "a" * 1000

    agent = reel.Agent(name="shouter", instructions="Shout.", tools=[shout],
                       model=reel.ScriptedModel(turns=[{"tool_calls": [{"name": "shout"}]}, {"text": "done"}]))
    handle = await local.start(agent, input="Shout.")
    assert (await handle.result(timeout_s=60)).outcome == "succeeded"
    [done] = [e for c in [c async for c in handle.events(follow=False)] for e in c.events
              if isinstance(e, AttemptSucceeded) and e.step_id == "shouter:t1:c0"]
    assert done.truncated is True and done.output_ref.size_bytes < 200  # the head and the note, not 1000 bytes

    @reel.tool
    def flood() -> str:
        """Say far too much."""
        return "b" * (3 * 1024 * 1024)

    agent = reel.Agent(name="flooder", instructions="Flood.", tools=[flood],
                       model=reel.ScriptedModel(turns=[{"tool_calls": [{"name": "flood"}]}, {"text": "done"}]))
    handle = await local.start(agent, input="Flood.")
    assert (await handle.result(timeout_s=60)).outcome == "succeeded"
    [done] = [e for c in [c async for c in handle.events(follow=False)] for e in c.events
              if isinstance(e, AttemptSucceeded) and e.step_id == "flooder:t1:c0"]
    assert done.truncated is True  # no cap of its own: a command tool's default, 1 MiB, and the note
    assert 1024 * 1024 < done.output_ref.size_bytes < 1024 * 1024 + 200

    def make(n: int) -> reel.FunctionTool[[], int]:
        @reel.tool
        def value() -> int:
            """A number."""
            return n
        return value

    one, two = make(1), make(2)  # two function objects under one module:function name
    assert one.path == two.path
    with pytest.raises(reel.WorkflowInvalid, match="two functions are served as"):
        for t in (one, two):
            await local.start(reel.Agent(name="numbers", instructions=".", tools=[t],
                                         model=reel.ScriptedModel(turns=[{"text": "done"}])), input="n?")


async def test_a_kept_store_resumes_a_run_in_a_later_local_block(tmp_path: Path) -> None:
    """A run of an earlier block resumes in a later one; while no executor serves its tool it waits, named by
    `reel status` (the executor's lease), and goes on once the tool is served."""
    from reel.services.cli.status import gather, render, waiting_lines

    asked: list[str] = []

    @reel.tool
    def record(answer: str) -> str:
        """Record the answer."""
        asked.append(answer)
        return "recorded"

    agent = reel.Agent(name="survey", instructions="Ask, then record.", tools=[reel.ask_user(), record],
                       model=reel.ScriptedModel(turns=[
                           {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Colour?"}}]},
                           {"tool_calls": [{"name": "record", "arguments": {"answer": "blue"}}]},
                           {"text": "recorded blue"}]))
    store = tmp_path / "js"
    async with reel.local(store_dir=store) as client:
        handle = await client.start(agent, input="Survey me.")
        assert (await handle.result(timeout_s=60)).status == "awaiting_input"
        run_id = handle.run_id
    async with reel.local(store_dir=store) as client:  # a new server and services, the same store; no `record`
        handle = client.get(run_id)
        [question] = await handle.pending()
        await handle.answer(question.request_id, "blue")
        infra = client._infra
        report = await gather(infra, client._cfg, timeout_s=0.3)
        while not any(x["waiting_for"] for x in report["leases"]):  # the answer resumed it: it waits for `record`
            report = await gather(infra, client._cfg, timeout_s=0.3)
        [lease] = report["leases"]
        assert lease["waiting_for"] == [record.path] and await handle.status() == "running" and not asked
        [line] = waiting_lines(report["leases"])
        assert line.plain.startswith(f"runs wait for a worker serving {record.path}: no live executor serves it")
        assert line in render(report)
        client.serve(agent)  # now this process serves it: the command's next redelivery drives the run
        result = await handle.result(timeout_s=60)
    assert (result.status, result.output, asked) == ("completed", "recorded blue", ["blue"])
    async with reel.local(store_dir=store, agents=[agent]) as client:  # served from the start: nothing waits
        assert (await client.get(run_id).result(timeout_s=10)).status == "completed"


async def test_a_sleep_step_and_a_tool_that_asks_to_be_resumed_wait_and_result_waits_through_them(
        local: reel.Client) -> None:
    """``reel.SleepStep`` in a ``reel.Workflow`` and ``reel.resume_after`` from a function tool: the run sleeps
    (status ``sleeping``), recovery wakes it, ``handle.result()`` returns the finished run."""
    flow = reel.Workflow(name="nap", steps=(
        reel.ToolStep(id="before", tool=reel.ToolSpec(type="recorded", output="one")),
        reel.SleepStep(id="nap", for_s=0.5)))
    handle = await local.start(flow)
    done = await handle.result(timeout_s=60)
    assert done.status == "completed" and done.passed, done
    state = await handle.state()
    assert [a.status for a in state.active.attempts["nap"]] == ["succeeded"]

    polls: list[int] = []

    @reel.tool
    def build_ready(attempt: int) -> str:
        """Whether the build is ready."""
        polls.append(attempt)
        return "ready" if attempt >= 2 else reel.resume_after(0.3, "still building")  # type: ignore[return-value]

    agent = reel.Agent(name="waiter", instructions="Wait for the build.", tools=[build_ready],
                       model=reel.ScriptedModel(turns=[{"tool_calls": [{"name": "build_ready", "arguments": {}}]},
                                                       {"text": "the build is ready"}]))
    result = await (await local.start(agent, input="Is the build ready?")).result(timeout_s=60)
    assert result.status == "completed" and result.output == "the build is ready", result
    assert polls == [1, 2]


async def test_connect_with_an_auth_directory(tmp_path: Path) -> None:
    """``Client.connect(auth=DIR)`` logs in as the directory's client role on an auth-on server."""
    from tests.integration.authserver import auth_server, services_as_roles

    agent = reel.Agent(name="hello", instructions="Greet.", tools=[reel.recorded_tool("greet", "hello")],
                       model=reel.ScriptedModel(turns=[{"tool_calls": [{"name": "greet"}]}, {"text": "hello!"}]),
                       verifiers=[reel.Verifier(type="output_regex", pattern="hello")])
    async with auth_server(tmp_path) as server, services_as_roles(server, "executor", "verifier"), \
            await reel.Client.connect(server.base.nats_url, namespace=server.base.names.namespace,
                                      auth=server.dir.path) as client:
        result = await (await client.start(agent, input="Hi.")).result(timeout_s=60)
    assert result.outcome == "passed"


async def test_a_server_without_the_namespaces_streams_is_not_taken_for_reel(cfg: Config) -> None:
    """What ``Client.connect()`` checks of the server at the default URL (``reel up``'s port): it must carry the
    namespace's event stream — another program's server there is not silently given Reel's streams."""
    from reel._client import _check_reel_server
    from reel.shared.nats.infra import connect, ensure_infra

    nc = await connect(cfg, name="check")
    try:
        with pytest.raises(reel.ServiceUnavailable, match="is not a Reel server for namespace"):
            await _check_reel_server(nc, cfg)
        await ensure_infra(nc, cfg)
        await _check_reel_server(nc, cfg)  # now it is
    finally:
        await nc.close()


async def test_fork_restores_an_item_into_the_forked_turn(local: reel.Client) -> None:
    agent = reel.Agent(
        name="noted", instructions="Use the tools to answer.", tools=[add],
        context=[reel.ContextItem(id="old-notes", kind="document", stale=True, text="Notes that no longer apply.")],
        model=reel.ScriptedModel(turns=[
            {"text": "adding", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
            {"text": "2 + 3 = 5"}]))
    handle = await local.start(agent, input="What is 2 + 3?")
    first = await handle.result(timeout_s=60)
    before = (await handle.state()).branches[first.branch_id].attempts["noted:t1"][-1].context
    assert before is not None and "old-notes" in before.dropped
    forked = await handle.fork(at="noted:t1", edits=[reel.edits.Restore(item="old-notes")])
    assert forked.created and forked.from_step == "noted:t1"
    second = await handle.result(timeout_s=60)
    assert second.branch_id == forked.branch_id
    after = (await handle.state()).branches[forked.branch_id].attempts["noted:t1"][-1].context
    assert after is not None and "old-notes" in after.packed and after.restored == ("old-notes",)
    with pytest.raises(reel.InvalidCommand) as refused:
        await handle.fork(at="noted:t1", edits=[reel.edits.Restore(item="no-such-item")])
    assert refused.value.code == "invalid_edit"


async def test_fork_edits_the_instructions_model_params_and_a_tool_result_the_turn_sends(
        local: reel.Client) -> None:
    handle = await local.start(adder(), input="What is 2 + 3?")
    await handle.result(timeout_s=60)
    forked = await handle.fork(at="adder:t2", edits=[
        reel.edits.ToolResult(call="adder:t1:c0", text="41 (edited)"),
        reel.edits.Instructions(text="Answer in French."),
        reel.edits.Model(name="m2"), reel.edits.Param(key="temperature", value=0)])
    await handle.result(timeout_s=60)
    state = await handle.state()
    blobs = handle._rc.blobs
    assert blobs is not None
    sent = {}
    for b in ("main", forked.branch_id):
        ref = state.branches[b].attempts["adder:t2"][-1].prompt_ref
        assert ref is not None
        sent[b] = msgspec.json.decode(await blobs.get(ref))
    messages = {m["role"]: m for m in sent[forked.branch_id]["messages"]}
    assert messages["system"]["content"] == "Answer in French." and messages["tool"]["content"] == "41 (edited)"
    assert sent[forked.branch_id]["model"] == "m2" and sent[forked.branch_id]["temperature"] == 0
    before = {m["role"]: m for m in sent["main"]["messages"]}
    assert before["system"]["content"] == "Use the tools to answer." and before["tool"]["content"] == "5"
    assert "temperature" not in sent["main"]


async def test_a_script_that_connects_to_a_running_reel_keeps_its_output_its_own(cfg: Config, tmp_path: Path) -> None:
    """A script of ``import reel`` that connects (``Client.connect``) and closes prints nothing of Reel's (its
    connection's INFO lines stay below the WARNING a script gets unless it configured structlog itself)."""
    script = tmp_path / "connects.py"
    script.write_text("import asyncio, sys\nimport reel\n\n\nasync def main() -> None:\n"
                      "    async with await reel.Client.connect(sys.argv[1], namespace=sys.argv[2]):\n"
                      "        print('connected')\n\n\nasyncio.run(main())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REEL_", "NATS_"))}
    proc = await asyncio.create_subprocess_exec(sys.executable, str(script), cfg.nats_url, cfg.names.namespace,
                                                cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode, out.decode().strip(), err.decode()) == (0, "connected", ""), err.decode()
