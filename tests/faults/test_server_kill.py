"""kill -9 of the nats-server mid-run, restarted on the same port and store.

Its own single server (file storage), every service a process (two executors, the
verifier, recovery): eight runs of three command tools (0.3 s each) are acked and in
flight when the server hangs (SIGSTOP, 0.5 s: what the services send meanwhile is in
flight, unanswered) and is then killed; it comes back ~1 s later, every process
reconnects, every write that was in flight is sent again with its ids until it settles
(no command handler crashes), and every invariant of
tests/faults/checks.py holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.infra import connect, ensure_infra
from reel.shared.runtime.config import Config
from tests.faults.checks import check_runs, read_side_effects
from tests.faults.conftest import FaultsLedger
from tests.faults.procs import ServiceProcs, killable_server
from tests.faults.scenario import HANDLER_CRASH, effects_workflow, fault_cfg, logged, record, start_all
from tests.integration.scenarios import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow]

RUNS = 8


async def test_nats_server_killed_and_restarted_with_runs_in_flight(
    cfg: Config, tmp_path: Path, faults_ledger: FaultsLedger,
) -> None:
    effects = tmp_path / "effects.txt"
    async with killable_server(tmp_path / "server") as srv:
        cfg = fault_cfg(dataclasses.replace(cfg, nats_url=srv.url, storage="file"))
        nc = await connect(cfg, name="faults-server-kill")
        try:
            infra = await ensure_infra(nc, cfg)
            client = ReelClient(nc, cfg, JetStreamBlobStore(nc, infra.blobs, cfg.names.blob_bucket))
            async with ServiceProcs(cfg, tmp_path) as procs:
                for service in ("verifier", "recovery", "executor", "executor"):
                    await procs.start(service)
                specs = [effects_workflow(effects, f"server-kill-{i}", sleep_s=0.3) for i in range(RUNS)]
                replies = await start_all(client, specs)
                run_ids = [r.run_id for r in replies if r.run_id]

                async def in_flight() -> bool:  # a few side effects done, most still to come
                    return len(read_side_effects(effects)) >= RUNS // 2

                await wait_until(in_flight, timeout_s=60, what="the runs to be in flight")
                done_before = len(read_side_effects(effects))
                srv.freeze()
                await asyncio.sleep(0.5)  # the hang: writes sent now are in flight when it dies (not a rendezvous)
                await srv.kill()
                await asyncio.sleep(1.0)  # the outage itself: the server stays down this long (not a rendezvous)
                await srv.start()
                counts = await check_runs(client.log, run_ids, side_effects=effects, timeout_s=60)
                assert all(p.alive for p in procs.procs), procs.logs()  # every service reconnected, none died
                assert done_before < RUNS * 3, "the kill came after every side effect: not mid-run"
                record(faults_ledger, "nats_server_kill", counts, procs)
                assert not (crashed := logged(procs, HANDLER_CRASH)), "\n".join(crashed)
        finally:
            await nc.close()
