"""Hostile payloads on every command subject while real runs proceed (issue 10 item 6; brief §12).

Every service is a process (two executors, cancel, rewind, recovery, the verifier). Six runs of
three command tools are in flight while a plain client sends, to each of ``start``, ``resume``,
``cancel``, ``respond``, ``rewind`` and ``recover``: garbage bytes, wrong JSON types, deep nesting,
~900 KB bodies, and unicode (emoji, right-to-left text, NUL, lone surrogates, ids that are not one
subject token) — some naming the live runs — and to ``verify.<run>`` (no reply) the same, naming
the live runs and forging triggers for them.

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

from shared.config import Config
from shared.core.commands import Reply, VerifyRun
from shared.core.ids import LSN, BranchId, RunId
from shared.core.subjects import REPLY_TO_HEADER
from shared.nats.client import ReelClient
from shared.nats.infra import Infra
from tests.faults.checks import check_runs
from tests.faults.conftest import FaultsLedger
from tests.faults.procs import ServiceProcs
from tests.faults.scenario import effects_workflow, record, start_all
from tests.integration.scenarios import wait_until

pytestmark = pytest.mark.faults

RUNS = 6
HUGE = 900 * 1024  # below the server's 1 MiB max payload
SERVICES = {"start": "executor", "resume": "executor", "cancel": "cancel", "respond": "cancel",
            "rewind": "rewind", "recover": "recovery"}
UNICODE = ["r-😀", "r-\u202eevil", "r-\x00nul", "r-\ud800", "r-ünïcödé", "r-a.b", "r->", " ", "r-" + "é" * 5000]


def hostile(run_ids: list[str]) -> list[bytes]:
    """The bodies sent to every subject (see module doc); a few name the live runs."""
    live = run_ids[0]
    bodies = [b"\x00\xff\xfe not json", b"", b"[]", b"null", b"42", b'"a string"', b"{" * 20_000,
              b'[' * 10_000 + b']' * 10_000, b'{"run_id": 5}', b'{"run_id": null, "reason": {"x": [1]}}',
              b'{"run_id": ["' + live.encode() + b'"]}', b'{"workflow": "' + b"x" * HUGE + b'"}',
              b'{"run_id": "' + live.encode() + b'", "at_lsn": "three", "reason": 7, "decision": 1}',
              b'{"run_id": "' + live.encode() + b'", "at_step": {"$gt": ""}, "request_id": [], "extra": true}',
              b'{"workflow": {"name": "' + "名前".encode() * 1000 + b'", "steps": "none"}}',
              b'{"workflow": {"name": "w", "steps": [{"kind": "tool", "id": "\\u0000", "tool": {"type": "command",'
              b' "argv": []}}]}}', b'{"run_id": "\\ud800\\udfff\\ud800"}', "{\"run_id\": \"r-\u0000\"}".encode()]
    bodies += [msgspec.json.encode({"run_id": u, "reason": u, "at_step": u, "request_id": u, "decision": u})
               for u in UNICODE if "\ud800" not in u]
    return bodies


async def ask(infra: Infra, subject: str, body: bytes) -> Reply:
    """Publish ``body`` with a reply subject; the decoded reply (within 30 s)."""
    inbox = infra.nc.new_inbox()
    sub = await infra.nc.subscribe(inbox, max_msgs=1)
    try:
        await infra.js.publish(subject, body, headers={REPLY_TO_HEADER: inbox})
        msg = await sub.next_msg(timeout=30)
    finally:
        await sub.unsubscribe()
    return msgspec.json.decode(msg.data, type=Reply)


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
        for run_id in run_ids:
            for body in [*bodies[:12], *forged]:
                await infra.js.publish(cfg.names.verify(run_id), body)
        sent["verifier"] = RUNS * (12 + len(forged))

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
