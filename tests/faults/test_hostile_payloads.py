"""Hostile payloads on every command subject while real runs proceed.

Every service is a process (two executors, cancel, rewind, recovery, the verifier). Six runs of
three command tools are in flight while a plain client sends, to each of ``start``, ``resume``,
``cancel``, ``respond``, ``rewind`` and ``recover``: garbage bytes, wrong JSON types, deep nesting,
~900 KB bodies, and unicode (emoji, right-to-left text, NUL, lone surrogates, ids that are not one
subject token) — some naming the live runs — and to ``verify.<run>`` (no reply) the garbage ones, ones
naming the live runs and forged triggers for them. The bodies: tests/support/payloads.py, shared with
the integration suite's poison commands (tests/integration/test_poison_commands.py).

Asserted: every command with a reply subject is answered with a decodable refusal naming a code;
each consumer delivered each command once (no redelivery, nothing left pending); every service
still runs; the six runs satisfy every invariant of tests/faults/checks.py, none cancelled or rewound.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import msgspec
import pytest

from reel.shared.core.run.ids import LSN, BranchId, RunId
from reel.shared.core.wire.commands import VerifyRun
from reel.shared.nats.client import ReelClient
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.faults.checks import check_runs
from tests.faults.conftest import FaultsLedger
from tests.faults.procs import ServiceProcs
from tests.faults.scenario import effects_workflow, record, start_all
from tests.integration.scenarios import wait_until
from tests.support.payloads import GARBAGE, ask, hostile, naming

pytestmark = pytest.mark.faults

RUNS = 6
SERVICES = {"start": "executor", "resume": "executor", "cancel": "cancel", "respond": "cancel",
            "rewind": "rewind", "recover": "recovery"}


async def test_hostile_payloads_on_every_command_subject_while_runs_proceed(
    infra: Infra, cfg: Config, client: ReelClient, tmp_path: Path, faults_ledger: FaultsLedger,
) -> None:
    cfg = dataclasses.replace(cfg, command_ack_wait_s=30.0)  # nothing is killed: any redelivery is a fault
    effects = tmp_path / "effects.txt"
    async with ServiceProcs(cfg, tmp_path) as procs:
        for service in ("verifier", "recovery", "cancel", "rewind", "executor", "executor"):
            await procs.start(service)
        replies = await start_all(client, [effects_workflow(effects, f"hostile-{i}", sleep_s=0.2)
                                           for i in range(RUNS)])
        run_ids = [r.run_id for r in replies if r.run_id]
        sent = {"executor": RUNS}
        bodies = hostile(run_ids)
        refusals: list[str] = []
        for suffix, service in SERVICES.items():
            answers = await asyncio.gather(*(ask(infra, cfg.names.command(suffix), b) for b in bodies))
            sent[service] = sent.get(service, 0) + len(bodies)
            for body, reply in zip(bodies, answers, strict=True):
                if reply.ok or reply.error is None or not reply.error.code or not reply.error.message:
                    refusals.append(f"{suffix} {body[:60]!r}: {reply}")
        forged = [msgspec.json.encode(VerifyRun(run_id=RunId(r), branch_id=BranchId("main"), snapshot_lsn=LSN(1)))
                  for r in run_ids]
        triggers = [*GARBAGE, *naming(run_ids[0]), *forged]  # no reply: garbage, wrong types, forged triggers
        for run_id in run_ids:
            for body in triggers:
                await infra.js.publish(cfg.names.verify(run_id), body)
        sent["verifier"] = RUNS * len(triggers)

        counts = await check_runs(client.log, run_ids, side_effects=effects, timeout_s=90)
        for run_id in run_ids:
            state = await client.log.load(run_id)
            if state.status != "completed" or len(state.branches) != 1 or state.outcome != "succeeded":
                counts.problems.append(f"{run_id}: {state.status}, {state.outcome}, branches {list(state.branches)}")
        counts.problems += refusals
        for service, n in sent.items():
            async def settled(durable: str = cfg.names.consumer(service)) -> object:
                info = await infra.js.consumer_info(cfg.names.commands_stream, durable)
                return info if info.num_ack_pending == 0 and info.num_pending == 0 else None

            info = await wait_until(settled, timeout_s=60, what=f"{service} to settle its commands")
            if info.delivered.consumer_seq < n or info.num_redelivered:
                counts.problems.append(f"{service}: delivered {info.delivered.consumer_seq} of {n} commands, "
                                       f"{info.num_redelivered} redelivered")
        dead = [p.name for p in procs.procs if not p.alive]
        if dead:
            counts.problems.append(f"services died: {dead}")
        record(faults_ledger, "hostile_payloads", counts, procs)
        assert not counts.problems, "\n".join(counts.problems[:40])
