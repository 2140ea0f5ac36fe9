"""Incremental turn contexts in the real executor (shared/core/agent/memo.py): on a real nats-server,
long agent runs whose later turns leave earlier ones out for want of budget, with tool errors, rewound after
resting and while driven; every turn's recorded partition and prompt blob must be what a full rebuild of that
turn makes (tests/support/turncheck.py), byte for byte."""

from __future__ import annotations

import asyncio
from typing import Any

from reel.services.executor.app import serve as executor_serve
from reel.services.rewind.app import serve as rewind_serve
from reel.shared.core.run.events import AnyEvent, BlobRef, Commit, StepsDeclared
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.agent_support import LOOKUP, start_and_rest
from tests.integration.agent_tools import arm
from tests.integration.scenarios import wait_state
from tests.refold import assert_refold_identical
from tests.support.turncheck import check_turns

PARK = {"name": "park", "python": "tests.integration.agent_tools:park",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}


def long_agent(turns: int, *, park_at: int = 0, park_name: str = "") -> WorkflowSpec:
    """``turns`` scripted turns: each looks a key up, every 4th also calls a tool that does not exist (an error
    observation); turn ``park_at`` parks on ``park_name``; the last one answers."""
    script: list[dict[str, Any]] = []
    for t in range(1, turns):
        calls: list[dict[str, Any]] = [{"name": "lookup", "arguments": {"key": f"k{t}"}}]
        if t % 4 == 0:
            calls.append({"name": "nosuch", "arguments": {"n": t}})
        if t == park_at:
            calls.append({"name": "park", "arguments": {"name": park_name}})
        script.append({"text": f"turn {t}: looking up k{t}", "tool_calls": calls})
    script.append({"text": "The answer is 42."})
    return parse_workflow({"name": "long-agent", "steps": [{
        "kind": "agent", "id": "solve", "max_turns": turns, "instructions": "Look things up, then answer.",
        "context": [{"id": "task", "kind": "task", "text": "Find the answer."},
                    {"id": "notes", "kind": "scratch", "text": "private notes"}],
        "policy": {"budget_tokens": 700, "exclude_kinds": ["scratch"]},
        "model": {"adapter": "scripted", "turns": script}, "tools": [LOOKUP, PARK]}]})


def _refs(e: AnyEvent) -> list[BlobRef]:
    refs = [r for r in (getattr(e, "output_ref", None), getattr(e, "prompt_ref", None)) if isinstance(r, BlobRef)]
    if isinstance(e, StepsDeclared):
        refs += [d.arguments_ref for d in e.steps if d.arguments_ref is not None]
    return refs


async def log_and_blobs(event_log: JetStreamEventLog, blobs: JetStreamBlobStore, run_id: str
                        ) -> tuple[list[tuple[int, Commit]], dict[str, bytes]]:
    """The run's log and the body of every blob it names (inline or stored)."""
    log = [(int(lsn), c) for lsn, c in await event_log.read(run_id)]
    refs = {r.sha256: r for _, c in log for e in c.events for r in _refs(e)}
    bodies = await asyncio.gather(*(blobs.get(r) for r in refs.values()))
    return log, dict(zip(refs, bodies, strict=True))


async def test_every_turn_of_a_long_run_and_of_its_rewind_is_the_full_rebuild(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore,
) -> None:
    spec = long_agent(24)
    async with running(executor_serve, infra, cfg), running(rewind_serve, infra, cfg):
        done = await start_and_rest(client, spec, timeout_s=120)
        rewound = await client.rewind(done.run_id, at_step="solve:t8", idempotency_key="again")
        assert rewound.ok and rewound.branch_id, rewound
        state = await wait_state(event_log, done.run_id, lambda s: s.status in ("verifying", "completed")
                                 and s.active_branch == rewound.branch_id, what="the fork to rest", timeout_s=120)
    log, bodies = await log_and_blobs(event_log, blobs, done.run_id)
    got = check_turns(log, spec, bodies, recorded=True)
    assert got.turns == 24 + 17 and got.branches == {"main", rewound.branch_id}
    assert got.over_budget >= 20  # later turns leave earlier ones out (available)
    assert got.dropped == got.turns  # the scratch notes, every turn
    await assert_refold_identical(event_log, state)


async def test_a_rewind_while_driven_moves_the_drive_and_its_contexts_to_the_new_branch(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore,
) -> None:
    arrived, release = arm("incremental-rewind")
    spec = long_agent(16, park_at=10, park_name="incremental-rewind")
    async with running(executor_serve, infra, cfg), running(rewind_serve, infra, cfg):
        start = await client.start(spec)
        assert start.run_id
        await asyncio.wait_for(arrived.wait(), 60)  # turn 10's park call is running in the executor's drive
        rewound = await client.rewind(start.run_id, at_step="solve:t6")
        assert rewound.ok and rewound.branch_id, rewound
        release.set()
        state = await wait_state(event_log, start.run_id, lambda s: s.status in ("verifying", "completed"),
                                 what="the run to rest", timeout_s=120)
    assert state.active_branch == rewound.branch_id and rewound.detail["resume"] == "owner_driving"
    log, bodies = await log_and_blobs(event_log, blobs, start.run_id)
    got = check_turns(log, spec, bodies, recorded=True)
    assert got.branches == {"main", rewound.branch_id} and got.turns == 10 + 11
    assert got.over_budget > 0
