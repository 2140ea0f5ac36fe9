"""Shared pieces of the fault scenarios: the workflow, the config, starting runs, recording the counts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reel.shared.core.wire.commands import Reply
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.runtime.config import Config
from tests.faults.checks import FaultCounts, side_effect_tool
from tests.faults.conftest import FaultsLedger
from tests.faults.procs import Proc, ServiceProcs

STEPS = ("s1", "s2", "s3")
ACK_WAIT_S = 3.0
"""The scenarios' command ack wait (s): a command of a killed service comes back this soon."""


def fault_cfg(cfg: Config) -> Config:
    """The test's config with a short command ack wait (:data:`ACK_WAIT_S`); lease TTL stays 2 s."""
    return dataclasses.replace(cfg, command_ack_wait_s=ACK_WAIT_S)


def effects_spec(path: Path, name: str = "faults", *, steps: Sequence[str] = STEPS,
                 sleep_s: float = 0.0) -> dict[str, Any]:
    """The workflow JSON of :func:`effects_workflow`."""
    return {"name": name, "steps": [
        {"kind": "tool", "id": s, "max_attempts": 3, "tool": side_effect_tool(path, f"out of {s}", sleep_s=sleep_s)}
        for s in steps]}


def effects_workflow(path: Path, name: str = "faults", *, steps: Sequence[str] = STEPS,
                     sleep_s: float = 0.0) -> WorkflowSpec:
    """``steps`` command tools in a row, each appending its ``<run>:<step>:<attempt>`` line to ``path``
    (3 attempts each; no verifier: the verifier service completes the run)."""
    return parse_workflow(effects_spec(path, name, steps=steps, sleep_s=sleep_s))


async def start_all(client: ReelClient, specs: Sequence[WorkflowSpec], *, keys: Sequence[str | None] = (),
                    timeout_s: float = 90.0) -> list[Reply]:
    """Start every spec at once (``keys[i]``: its idempotency key); the replies, each asserted ok."""
    keyed = list(keys) + [None] * (len(specs) - len(keys))
    replies = await asyncio.gather(*(client.start(s, idempotency_key=k, timeout_s=timeout_s)
                                     for s, k in zip(specs, keyed, strict=True)))
    for r in replies:
        assert r.ok and r.run_id, r
    return list(replies)


def crash_lines(proc: Proc) -> list[dict[str, Any]]:
    """The ``executor.crash_injected`` log records of ``proc`` (JSON lines)."""
    out = []
    for line in proc.log_path.read_text(errors="replace").splitlines():
        if "executor.crash_injected" in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


HANDLER_CRASH = "command.handler_crashed"
"""The log event of a command handler that raised (shared/nats/consumer.py): its command is nak'ed."""


def logged(procs: ServiceProcs, event: str) -> list[str]:
    """The log lines (JSON) of every child of ``procs`` that name ``event``, prefixed by the child's log file."""
    return [f"{p.log_path.name}: {line[:2000]}" for p in procs.procs
            for line in p.log_path.read_text(errors="replace").splitlines() if f'"{event}"' in line]


def record(ledger: FaultsLedger, scenario: str, counts: FaultCounts, procs: ServiceProcs | None = None) -> None:
    """Record ``counts`` for ``scenario``, then assert them clean (record first: the summary counts honestly);
    a failure quotes ``procs``' logs."""
    ledger.record(scenario, counts.runs, counts.lost, counts.stuck, counts.unrecorded)
    if counts.problems and procs is not None:
        counts.problems.append(procs.logs())
    counts.assert_clean()
