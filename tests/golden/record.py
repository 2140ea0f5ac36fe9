"""Record golden event logs by running real workflows through the real executor (run once, by hand).

    python -m tests.golden.record      # then: python -m tests.golden.regen; review; commit
    python -m tests.golden.record model_turn   # only the named in-process workflows (a new golden)

Starts an embedded nats-server, runs the executor (once as a subprocess that is made to
crash mid-run, then in-process), and writes each run's log exactly as it sits in the
stream to ``tests/golden/recorded_1rt_<name>.jsonl`` (``{"lsn": N, "commit": <body>}`` per
line): the executor's current commit pattern (one round trip per step: an outcome and
the next intent in one commit, small bodies inline in their refs). The
``recorded_<name>.jsonl`` logs beside them are the earlier pattern (the intent and the
outcome of each attempt in commits of their own); they stay as recorded and must still fold.
Ids, clocks and latencies in these logs are whatever the recording run saw: the golden test
only needs them to be frozen, not reproducible. Re-recording replaces the ``recorded_1rt_``
logs and therefore needs ``regen.py`` afterwards; do it only to add coverage.

Events the executor never writes (verdicts, completion, cancel, fork, recovered
outcomes) are covered by the hand-written ``hand_*.jsonl`` logs.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from reel.services.executor.app import serve
from reel.services.executor.attempts import CRASH_ENV
from reel.shared.core.wire.commands import StartRun, encode
from reel.shared.core.wire.subjects import Names
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.embedded import embedded_server
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import connect, ensure_infra
from reel.shared.runtime.config import Config
from reel.shared.runtime.logging import setup_logging

GOLDEN_DIR = Path(__file__).resolve().parent
PREFIX = "recorded_1rt_"
REPO = GOLDEN_DIR.parent.parent


def _ctx(i: int, **kw: Any) -> dict[str, Any]:
    return {"id": f"ctx-{i}", "text": f"context item {i} " + "lorem ipsum dolor " * 4, **kw}


WORKFLOWS: dict[str, dict[str, Any]] = {
    # model (partition with all three buckets non-empty) → tool → replayed model with recorded usage
    "linear": {
        "name": "golden-linear",
        "budget_tokens": 200,
        "steps": [
            {"kind": "model", "id": "plan", "instructions": "Plan the fix.",
             "model": {"adapter": "scripted", "outputs": ["1. read 2. edit 3. test"]},
             "policy": {"budget_tokens": 40, "exclude_kinds": ["scratch"]},
             "context": [_ctx(0, stale=True), _ctx(1, kind="scratch"), _ctx(2, priority=1.0), _ctx(3),
                         _ctx(4, priority=2.0)]},
            {"kind": "tool", "id": "act", "tool": {"type": "recorded", "name": "bash", "input": "make test",
                                                    "output": "3 passed"}},
            {"kind": "model", "id": "review", "include_previous_outputs": True,
             "model": {"adapter": "replay", "output": "LGTM", "name": "recorded/model",
                       "usage": {"input_tokens": 120, "output_tokens": 2, "cost_usd": 0.0015}}},
        ],
    },
    # a retried model step, then a non-retryable tool failure that skips the last step
    "retry_fail": {
        "name": "golden-retry-fail",
        "steps": [
            {"kind": "model", "id": "draft", "max_attempts": 3,
             "model": {"adapter": "scripted", "outputs": [
                 {"error": "rate_limited", "message": "429 from upstream"}, "draft v2"]}},
            {"kind": "tool", "id": "test", "max_attempts": 3,
             "tool": {"type": "scripted", "outputs": [
                 {"error": "exit_1", "message": "1 failed", "retryable": False}]}},
            {"kind": "model", "id": "ship", "model": {"adapter": "scripted", "outputs": ["shipped"]}},
        ],
    },
    # a model step as an agent's first turn without tools: its instructions a required system item, its task
    # required, an earlier output included; the prompt blob the exact wire request
    "model_turn": {
        "name": "golden-model-turn",
        "budget_tokens": 60,
        "steps": [
            {"kind": "tool", "id": "probe", "tool": {"type": "recorded", "output": "2 failed: test_parse, test_emit"}},
            {"kind": "model", "id": "fix", "instructions": "Fix the failing tests.", "include_previous_outputs": True,
             "model": {"adapter": "scripted", "outputs": ["patched parse()"]},
             "context": [{"id": "task", "kind": "task", "text": "Make the suite pass."},
                         _ctx(1, priority=1.0), _ctx(2, stale=True)],
             "policy": {"drop_stale": True}},
        ],
    },
    # the first executor dies after b#1's output is stored; a second one takes over (b#2)
    "takeover": {
        "name": "golden-takeover",
        "steps": [
            {"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": "a done"}},
            {"kind": "model", "id": "b", "model": {"adapter": "scripted", "outputs": ["b done"]}},
            {"kind": "tool", "id": "c", "tool": {"type": "recorded", "output": "c done"}},
        ],
    },
}


def _start_body(name: str) -> bytes:
    return encode(StartRun(workflow=parse_workflow(WORKFLOWS[name]), idempotency_key=f"golden-{name}"))


async def _record(url: str, only: tuple[str, ...] = ()) -> None:
    cfg = Config(nats_url=url, names=Names("golden"), command_ack_wait_s=2.0, lease_ttl_s=2)
    nc = await connect(cfg, name="golden-recorder")
    infra = await ensure_infra(nc, cfg)
    client = ReelClient(nc, cfg)
    runs: dict[str, str] = {}

    if only:
        await _record_only(client, infra, cfg, only)
        await nc.close()
        return
    env = {**os.environ, "NATS_URL": url, "REEL_NAMESPACE": cfg.names.namespace, "REEL_COMMAND_ACK_WAIT_S": "2",
           CRASH_ENV: "b:1:after_output", "REEL_LOG_LEVEL": "WARNING"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.executor", env=env, cwd=REPO)
    reply = await client.command("start", _start_body("takeover"), timeout_s=30)
    assert reply.ok and reply.run_id, reply
    runs["takeover"] = reply.run_id
    assert await asyncio.wait_for(proc.wait(), 60) == 137, "the crash was not injected"

    runs = await _drive(client, infra, cfg, tuple(n for n in WORKFLOWS if n != "takeover"), started=runs)
    await _write(nc, cfg, runs)
    await nc.close()


async def _drive(client: ReelClient, infra: Any, cfg: Config, names: tuple[str, ...], *,
                 started: dict[str, str] | None = None) -> dict[str, str]:
    """Start the workflows ``names`` and drive them, with the runs already ``started`` (name → run id; the
    executor takes them over), to ``verifying`` with an in-process executor; returns every name → run id."""
    stop = asyncio.Event()
    task = asyncio.create_task(serve(infra, cfg, stop))
    runs: dict[str, str] = dict(started or {})
    for name in names:
        reply = await client.command("start", _start_body(name), timeout_s=30)
        assert reply.ok and reply.run_id, reply
        runs[name] = reply.run_id
    for run_id in runs.values():
        await client.wait_for(run_id, ("verifying",), timeout_s=60)
    stop.set()
    await task
    return runs


async def _record_only(client: ReelClient, infra: Any, cfg: Config, names: tuple[str, ...]) -> None:
    """Record only the workflows ``names`` (in-process executor, no crash), leaving every other log as it is."""
    await _write(client.nc, cfg, await _drive(client, infra, cfg, names))


async def _write(nc: Any, cfg: Config, runs: dict[str, str]) -> None:
    log = JetStreamEventLog(nc, cfg.names)
    for name, run_id in runs.items():
        raw = await log.subjects.read_raw(run_id)
        path = GOLDEN_DIR / f"{PREFIX}{name}.jsonl"
        path.write_bytes(b"".join(b'{"lsn":%d,"commit":%s}\n' % (lsn, body) for lsn, body in raw))
        print(f"wrote {path.relative_to(REPO)} ({len(raw)} commits)")


async def main() -> None:
    setup_logging("golden-recorder", level="WARNING")
    only = tuple(sys.argv[1:])
    unknown = [n for n in only if n not in WORKFLOWS or n == "takeover"]
    if unknown:
        sys.exit(f"no in-process golden workflow named {', '.join(unknown)}")
    async with embedded_server() as srv:
        await _record(srv.url, only)


if __name__ == "__main__":
    asyncio.run(main())
