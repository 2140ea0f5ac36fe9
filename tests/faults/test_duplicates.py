"""Duplicate commands: the same start twice, one idempotency key, concurrent
duplicates — against two executor processes (and the verifier and recovery), nothing runs twice.

* the same start command published twice (one ``Nats-Msg-Id``, as a client retrying a publish does):
  JetStream keeps one, one reply, one run;
* one idempotency key, started again once the first start is answered: the same run, ``created`` false;
* one key started 12 times at once (distinct msg ids, so 12 commands across two executors): one run,
  every reply naming it, exactly one ``created``;
* 8 ``resume`` commands at once for a run in flight: it is driven by one executor, no step runs twice.

Every invariant of tests/faults/checks.py holds (asserted), one run per key. Nothing was killed here,
so every step's side effect happens exactly once (asserted): a duplicate command delivered to the *other*
executor does not claim the run while its owner holds a lease with an attempt in flight
(``planning.claim_defers``); the command is nak'ed and comes back until the run rests.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from reel.shared.core.run.ids import run_id_for_key
from reel.shared.core.wire.commands import Reply, ResumeRun, StartRun, encode
from reel.shared.core.wire.subjects import MSG_ID_HEADER, REPLY_TO_HEADER
from reel.shared.nats.client import ReelClient
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.faults.checks import check_runs, read_side_effects
from tests.faults.conftest import FaultsLedger
from tests.faults.procs import ServiceProcs
from tests.faults.scenario import STEPS, effects_workflow, fault_cfg, record, start_all
from tests.integration.scenarios import wait_until

pytestmark = pytest.mark.faults

CONCURRENT = 12


async def _same_command_twice(infra: Infra, cfg: Config, body: bytes) -> list[Reply]:
    """Publish one start command twice with one msg id and one reply inbox; the replies within 30 s."""
    inbox = infra.nc.new_inbox()
    sub = await infra.nc.subscribe(inbox)
    headers = {REPLY_TO_HEADER: inbox, MSG_ID_HEADER: uuid.uuid4().hex}
    acks = [await infra.js.publish(cfg.names.command("start"), body, headers=headers) for _ in range(2)]
    assert (acks[0].duplicate, acks[1].duplicate, acks[0].seq) == (None, True, acks[1].seq), acks
    replies = [msgspec.json.decode((await sub.next_msg(timeout=30)).data, type=Reply)]
    await sub.unsubscribe()
    return replies


async def test_duplicate_commands_run_nothing_twice(
    infra: Infra, cfg: Config, client: ReelClient, tmp_path: Path, faults_ledger: FaultsLedger,
) -> None:
    cfg = fault_cfg(cfg)
    effects = tmp_path / "effects.txt"
    async with ServiceProcs(cfg, tmp_path) as procs:
        for service in ("verifier", "recovery", "executor", "executor"):
            await procs.start(service)
        acked: list[str] = []

        twice = await _same_command_twice(infra, cfg, encode(StartRun(workflow=effects_workflow(effects, "twice"))))
        assert [r.ok and r.created for r in twice] == [True], twice
        acked += [r.run_id for r in twice if r.run_id]

        keyed = effects_workflow(effects, "keyed")
        first = (await start_all(client, [keyed], keys=["key-again"]))[0]
        again = (await start_all(client, [keyed], keys=["key-again"]))[0]
        assert (first.run_id, first.created, again.run_id, again.created) == (
            run_id_for_key("key-again"), True, first.run_id, False)
        acked += [first.run_id or "", again.run_id or ""]

        crowd = await start_all(client, [effects_workflow(effects, "crowd")] * CONCURRENT, keys=["key-crowd"] * 12)
        assert {r.run_id for r in crowd} == {run_id_for_key("key-crowd")}, crowd
        assert Counter(bool(r.created) for r in crowd)[True] == 1, [r.created for r in crowd]
        acked += [r.run_id for r in crowd if r.run_id]

        slow = (await start_all(client, [effects_workflow(effects, "resumed", sleep_s=0.3)]))[0]
        assert slow.run_id
        acked.append(slow.run_id)

        async def started() -> bool:
            return any(ln.startswith(f"{slow.run_id}:s1:") for ln in read_side_effects(effects))

        await wait_until(started, timeout_s=30, what="the slow run's first step to run")
        resumes = await asyncio.gather(*(client.command("resume", encode(ResumeRun(run_id=slow.run_id)),
                                                        timeout_s=60) for _ in range(8)))
        assert all(r.ok for r in resumes), resumes

        counts = await check_runs(client.log, acked, side_effects=effects, timeout_s=60)
        record(faults_ledger, "duplicate_commands", counts, procs)

    lines = read_side_effects(effects)
    runs = sorted(set(acked))
    assert len(runs) == 4
    assert len(await client.log.list_runs()) == 4, "a duplicate made a run of its own"
    ran = Counter(ln.rpartition(":")[0] for ln in lines)  # run:step -> how many times its side effect happened
    assert set(ran) == {f"{r}:{s}" for r in runs for s in STEPS}, f"a step never ran: {sorted(lines)}"
    twice = sorted(k for k, n in ran.items() if n > 1)
    assert not twice, (f"a duplicate command made a second live executor claim the run and run {len(twice)} "
                       f"steps again (planning.claim_defers must keep it off): {twice}")
