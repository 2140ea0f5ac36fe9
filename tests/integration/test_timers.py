"""Durable timers end to end on a real nats-server: a ``kind: sleep`` step rests the run in ``sleeping`` (no
executor drives it, nothing is in flight), recovery's sweep wakes it at its time and an executor finishes it;
cancel and rewind while it sleeps; a command tool that asks to be resumed later. Every wait is on the log.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from reel.services.cancel.app import serve as cancel_serve
from reel.services.cli.status import gather, timer_lines
from reel.services.executor.app import serve as executor_serve
from reel.services.recovery.app import serve as recovery_serve
from reel.services.rewind.app import serve as rewind_serve
from reel.services.verifier.app import serve as verifier_serve
from reel.shared.core.run import timers
from reel.shared.core.run.events import RunSleeping, RunWoke
from reel.shared.core.run.ids import RunId
from reel.shared.core.run.planning import has_open_intent
from reel.shared.core.run.state import RESUME_AFTER
from reel.shared.core.wire.commands import RecoverRuns, encode
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import attempt_of, wait_state, wait_until
from tests.integration.test_cli import reel as reel_cli
from tests.refold import assert_refold_identical


@contextlib.asynccontextmanager
async def services(infra: Infra, cfg: Config, *, executor: bool = True) -> AsyncIterator[None]:
    """Executor (optional), cancel, rewind, recovery (its sweep on: the waker) and the verifier, in-process."""
    async with contextlib.AsyncExitStack() as stack:
        if executor:
            await stack.enter_async_context(running(executor_serve, infra, cfg))
        for serve in (cancel_serve, rewind_serve, recovery_serve, verifier_serve):
            await stack.enter_async_context(running(serve, infra, cfg))
        yield


async def _past(ms: int) -> bool:
    return time.time() * 1000 > ms


def sleepy(name: str, sleep: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "steps": [
        {"id": "before", "kind": "tool", "tool": {"type": "recorded", "output": "one"}},
        {"id": "nap", "kind": "sleep", **sleep},
        {"id": "after", "kind": "tool", "tool": {"type": "recorded", "output": "two"}},
    ]}


async def commits(event_log: JetStreamEventLog, run_id: str) -> list[Any]:
    return [e for _, c in await event_log.read(run_id) for e in c.events]


async def test_a_sleep_step_rests_the_run_and_recovery_wakes_it_at_its_time(
        infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog) -> None:
    async with services(infra, cfg):
        reply = await client.start(parse_workflow(sleepy("nap-1s", {"for_s": 1.5})))
        assert reply.run_id
        run_id = reply.run_id
        asleep = await wait_state(event_log, run_id, lambda s: s.status == "sleeping", what="the run to sleep")
        assert not has_open_intent(asleep), "nothing is in flight while a run sleeps"
        assert attempt_of(asleep, "before", 1).status == "succeeded"
        assert "nap" not in asleep.active.attempts
        wake = timers.next_wake(asleep.status, asleep.active)
        assert wake is not None

        async def reported() -> dict[str, Any] | None:  # reel status: recovery's timers line
            report = await gather(infra, cfg, timeout_s=0.5)
            return next((t for t in report["timers"] if t["sleeping"] == 1), None)
        line = await wait_until(reported, timeout_s=10, what="reel status to report the sleeping run")
        assert line["next_wake"].endswith(run_id), line
        assert f"timers (recovery {line['instance_id']}): 1 run sleeping, next wake" in str(
            timer_lines([line])[0])
        done = await wait_state(event_log, run_id, lambda s: s.status == "completed", timeout_s=30,
                                what="the run to wake and finish")
    woke = next(e for e in await commits(event_log, run_id) if isinstance(e, RunWoke))
    sleeping = next(e for e in await commits(event_log, run_id) if isinstance(e, RunSleeping))
    assert sleeping.wake_ms == wake and wake - sleeping.at_ms == 1500
    assert 0 <= woke.at_ms - wake < 2000, f"woke {woke.at_ms - wake} ms late"
    out = json.loads((await client.blobs.get(attempt_of(done, "nap", 1).output_ref)).decode())
    assert out["wake_ms"] == wake and out["woke_ms"] == woke.at_ms
    assert attempt_of(done, "after", 1).status == "succeeded"
    await assert_refold_identical(event_log, done)


async def test_until_in_the_past_does_not_wait(infra: Infra, cfg: Config, client: ReelClient,
                                               event_log: JetStreamEventLog) -> None:
    async with services(infra, cfg):
        reply = await client.start(parse_workflow(sleepy("nap-past", {"until": "2020-01-01T00:00:00Z"})))
        assert reply.run_id
        done = await wait_state(event_log, reply.run_id, lambda s: s.status == "completed", what="the run to finish")
    events = await commits(event_log, reply.run_id)
    sleeping = next(e for e in events if isinstance(e, RunSleeping))
    assert sleeping.wake_ms == 1577836800000
    assert any(isinstance(e, RunWoke) for e in events)
    assert attempt_of(done, "nap", 1).status == "succeeded"


async def test_a_sleeping_run_is_cancelled_and_stays_cancelled(infra: Infra, cfg: Config, client: ReelClient,
                                                               event_log: JetStreamEventLog) -> None:
    async with services(infra, cfg):
        reply = await client.start(parse_workflow(sleepy("nap-cancel", {"for_s": 2})))
        assert reply.run_id
        asleep = await wait_state(event_log, reply.run_id, lambda s: s.status == "sleeping", what="the run to sleep")
        wake = timers.next_wake(asleep.status, asleep.active)
        assert wake is not None
        assert (await client.cancel(reply.run_id, reason="no more naps")).ok
        cancelled = await wait_state(event_log, reply.run_id, lambda s: s.status == "cancelled", what="the cancel")
        # once its wake time has passed, a recovery pass over the run (what the sweep does) leaves it cancelled
        await wait_until(lambda: _past(wake), timeout_s=10, what="the wake time to pass")
        report = await client.command("recover", encode(RecoverRuns(run_id=RunId(reply.run_id))))
        assert report.ok, report.error
        assert (await event_log.load(reply.run_id)).status == "cancelled"
    assert cancelled.status == "cancelled"
    assert not any(isinstance(e, RunWoke) for e in await commits(event_log, reply.run_id))


async def test_a_sleeping_run_is_rewound_and_sleeps_again_on_its_new_branch(
        infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog) -> None:
    async with services(infra, cfg):
        reply = await client.start(parse_workflow(sleepy("nap-rewind", {"for_s": 1})))
        assert reply.run_id
        run_id = reply.run_id
        first = await wait_state(event_log, run_id, lambda s: s.status == "sleeping", what="the run to sleep")
        rewound = await client.rewind(run_id, at_step="nap")
        assert rewound.ok, rewound.error
        again = await wait_state(event_log, run_id, lambda s: s.status == "sleeping"
                                 and s.active_branch != first.active_branch, what="the new branch to sleep")
        assert again.active_branch != first.active_branch
        done = await wait_state(event_log, run_id, lambda s: s.status == "completed", timeout_s=30,
                                what="the new branch to wake and finish")
    assert attempt_of(done, "after", 1).status == "succeeded"
    assert done.active_branch == again.active_branch
    await assert_refold_identical(event_log, done)


RESUMER = (
    "import json, os, sys\n"
    "n = int(os.environ['REEL_ATTEMPT'])\n"
    "if n < 3:\n"
    "    print(json.dumps({'reel': {'resume_after_s': 0.5, 'reason': f'not ready ({n})'}}))\n"
    "else:\n"
    "    print('ready')\n"
)


async def test_a_command_tool_asks_to_be_resumed_later(infra: Infra, cfg: Config, client: ReelClient,
                                                       event_log: JetStreamEventLog, tmp_path: Path) -> None:
    script = tmp_path / "resumer.py"
    script.write_text(RESUMER)
    spec = parse_workflow({"name": "poller", "steps": [
        {"id": "poll", "kind": "tool", "max_attempts": 1,
         "tool": {"type": "command", "argv": [sys.executable, str(script)]}}]})
    async with services(infra, cfg):
        reply = await client.start(spec)
        assert reply.run_id
        done = await wait_state(event_log, reply.run_id, lambda s: s.status == "completed", timeout_s=30,
                                what="the poller to finish")
    attempts = done.active.attempts["poll"]
    assert [a.status for a in attempts] == ["failed", "failed", "succeeded"]
    assert {a.error_kind for a in attempts[:2]} == {RESUME_AFTER}
    assert "not ready (1)" in (attempts[0].error_message or "")
    events = await commits(event_log, reply.run_id)
    assert sum(isinstance(e, RunSleeping) for e in events) == 2 and sum(isinstance(e, RunWoke) for e in events) == 2
    for a, woke in zip(attempts[:2], [e for e in events if isinstance(e, RunWoke)], strict=True):
        assert isinstance(a.resume_at_ms, int) and woke.at_ms >= a.resume_at_ms
        assert a.finished_ms is not None and a.resume_at_ms - a.finished_ms == 500
    await assert_refold_identical(event_log, done)


async def test_a_python_tool_of_an_agent_returns_resume_after_and_its_call_runs_again_later(
        infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog) -> None:
    spec = parse_workflow({"name": "poller", "steps": [{
        "kind": "agent", "id": "poller", "context": [{"id": "task", "kind": "task", "text": "is the build done?"}],
        "model": {"adapter": "scripted", "turns": [{"tool_calls": [{"name": "poll", "arguments": {"job": "build"}}]},
                                                   {"text": "it is done"}]},
        "tools": [{"name": "poll", "python": "tests.integration.timer_tools:poll",
                   "parameters": {"type": "object", "properties": {"job": {"type": "string"}}}}]}]})
    async with services(infra, cfg):
        reply = await client.start(spec)
        assert reply.run_id
        asleep = await wait_state(event_log, reply.run_id, lambda s: s.status == "sleeping", what="the run to sleep")
        assert not has_open_intent(asleep)
        done = await wait_state(event_log, reply.run_id, lambda s: s.status == "completed", timeout_s=30,
                                what="the agent to finish")
    call = done.active.attempts["poller:t1:c0"]
    assert [(a.status, a.error_kind) for a in call] == [("failed", RESUME_AFTER), ("failed", RESUME_AFTER),
                                                        ("succeeded", None)]
    assert "build not ready (1)" in (call[0].error_message or "")
    assert (await client.blobs.get(call[2].output_ref)).decode() == "build done after 3 attempts"
    events = await commits(event_log, reply.run_id)
    woke = [e for e in events if isinstance(e, RunWoke)]
    assert [e.step_id for e in woke] == ["poller:t1:c0"] * 2
    for a, w in zip(call[:2], woke, strict=True):
        assert isinstance(a.resume_at_ms, int) and w.at_ms >= a.resume_at_ms
    assert attempt_of(done, "poller:t2", 1).status == "succeeded"
    await assert_refold_identical(event_log, done)


SLEEPY_YAML = """\
name: nap-cli
steps:
  - {kind: tool, id: before, tool: {type: recorded, output: one}}
  - {kind: sleep, id: nap, for_s: 3}
  - {kind: tool, id: after, tool: {type: recorded, output: two}}
"""


async def test_reel_run_follows_a_sleeping_run_to_its_end_past_its_timeout(cfg: Config, tmp_path: Path,
                                                                          event_log: JetStreamEventLog) -> None:
    """``reel run --timeout 2`` of a 3 s sleep: the timeout counts from the wake time, the run finishes, exit 0."""
    path = tmp_path / "nap.yaml"
    path.write_text(SLEEPY_YAML)
    code, out, err = await reel_cli(cfg, "run", str(path), "--timeout", "2")
    assert code == 0, (out, err)
    assert "sleeping until" in out and "woke (nap)" in out and "completed" in out, out
    run_id = re.search(r"run (r-[0-9a-f]{20})", out)
    assert run_id is not None
    state = await event_log.load(run_id.group(1))
    assert state.status == "completed" and attempt_of(state, "after", 1).status == "succeeded"
