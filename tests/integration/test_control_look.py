"""The executor's periodic cancel look (shared/nats/control.py): one request for every watched run, and a read
only of the runs whose log grew past what was read. Real nats-server and event log; the looks themselves are the
rendezvous (counted as they ask for the heads).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from reel.shared.core.mutators import cancel
from reel.shared.core.run.events import RunCancelled
from reel.shared.nats.control import Cause, ControlHub
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.clock import now_ms
from reel.shared.runtime.config import Config
from tests.integration.scenarios import wait_until


async def test_the_periodic_look_reads_only_the_runs_whose_log_grew(infra: Infra, cfg: Config,
                                                                      event_log: JetStreamEventLog) -> None:
    runs = [f"look-{uuid.uuid4().hex[:8]}-{i}" for i in range(3)]
    heads = {r: await event_log.commit(r, [], expected_lsn=0) for r in runs}
    reads: list[tuple[str, int]] = []
    looks = 0

    async def stopped_since(run_id: str, from_lsn: int) -> tuple[Cause | None, int]:
        reads.append((run_id, from_lsn))
        commits = await event_log.read(run_id, from_lsn=from_lsn)
        return ("cancelled" if cancel.cancel_lsn(commits) is not None else None,
                commits[-1][0] if commits else from_lsn - 1)

    async def counted_heads(run_ids: Sequence[str]) -> dict[str, int]:
        nonlocal looks
        looks += 1
        return await event_log.heads(run_ids)

    async def looked(n: int) -> bool:
        return looks >= n

    hub = ControlHub(infra.nc, cfg.names, stopped_since, check_s=0.1, heads=counted_heads)
    await hub.start()
    try:
        with hub.watch(runs[0]) as first, hub.watch(runs[1]) as second, hub.watch(runs[2]) as third:
            for r, lsn in heads.items():
                hub.seen(r, lsn)  # what each drive holds, folded and not cancelled
            await wait_until(lambda: looked(3), timeout_s=10, what="three looks")
            assert reads == []  # nothing committed since: no run was read
            # a cancel committed with no signal (its service died in between): found by the look alone
            await event_log.commit(runs[1], [RunCancelled(reason="stop", at_ms=now_ms())],
                                         expected_lsn=heads[runs[1]])
            assert await asyncio.wait_for(second.fired, 10) == "cancelled"
            assert reads == [(runs[1], heads[runs[1]] + 1)]  # only that run, from after what was seen
            n = looks
            await wait_until(lambda: looked(n + 2), timeout_s=10, what="two more looks")
            assert first.cause is None and third.cause is None
            assert reads == [(runs[1], heads[runs[1]] + 1)]  # a stopped run is not looked at again
    finally:
        await hub.stop()
