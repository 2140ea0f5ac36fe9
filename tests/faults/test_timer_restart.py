"""A run sleeping 60 s survives a restart of nats-server and of every service during its sleep, and wakes on time.

Its own single server (file storage), every service a process (executor, verifier, recovery, cancel, rewind).
The run reaches its ``kind: sleep`` step and rests in ``sleeping``; then every service is killed (SIGKILL), the
server is killed (SIGKILL) and started again on the same port and store, and every service is started again
as a new process. Nothing held the run while it slept, so nothing of it was lost: the new recovery rebuilds
its index from the events stream, finds the timer in the log and wakes the run at its time; a new executor
finishes it. The lateness (``run_woke.at_ms − wake_ms``, the waker's clock) is printed and must stay under 2 s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from reel.shared.core.run import timers
from reel.shared.core.run.events import RunWoke
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import connect, ensure_infra
from reel.shared.runtime.clock import now_ms
from reel.shared.runtime.config import Config
from tests.faults.procs import ServiceProcs, killable_server
from tests.faults.scenario import HANDLER_CRASH, fault_cfg, logged
from tests.integration.scenarios import attempt_of, wait_state
from tests.refold import assert_refold_identical

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SLEEP_S = 60
SERVICES = ("executor", "verifier", "recovery", "cancel", "rewind")
MAX_LATE_MS = 2000


async def test_a_60s_sleep_survives_a_restart_of_nats_and_every_service_and_wakes_on_time(
        cfg: Config, tmp_path: Path) -> None:
    spec = parse_workflow({"name": "sleep-across-restarts", "steps": [
        {"id": "before", "kind": "tool", "tool": {"type": "recorded", "output": "one"}},
        {"id": "nap", "kind": "sleep", "for_s": SLEEP_S},
        {"id": "after", "kind": "tool", "tool": {"type": "recorded", "output": "two"}}]})
    async with killable_server(tmp_path / "server") as srv:
        cfg = fault_cfg(dataclasses.replace(cfg, nats_url=srv.url, storage="file"))
        nc = await connect(cfg, name="faults-timer-restart")
        try:
            infra = await ensure_infra(nc, cfg)
            client = ReelClient(nc, cfg, JetStreamBlobStore(nc, infra.blobs, cfg.names.blob_bucket))
            log = JetStreamEventLog(nc, cfg.names)
            async with ServiceProcs(cfg, tmp_path) as procs:
                for service in SERVICES:
                    await procs.start(service)
                reply = await client.start(spec)
                assert reply.ok and reply.run_id, reply.error
                run_id = reply.run_id
                asleep = await wait_state(log, run_id, lambda s: s.status == "sleeping", timeout_s=60,
                                          what="the run to sleep")
                wake = timers.next_wake(asleep.status, asleep.active)
                assert wake is not None
                for p in list(procs.procs):
                    await procs.kill(p)
                await srv.kill()
                await srv.start()
                for service in SERVICES:
                    await procs.start(service)
                restarted_ms = now_ms()
                assert restarted_ms < wake - 30_000, "the restart must happen well inside the sleep"
                done = await wait_state(log, run_id, lambda s: s.status == "completed",
                                        timeout_s=(wake - now_ms()) / 1000 + 60, what="the run to wake and finish")
                assert not (crashed := logged(procs, HANDLER_CRASH)), "\n".join(crashed)
            woke = [e for _, c in await log.read(run_id) for e in c.events if isinstance(e, RunWoke)]
            assert len(woke) == 1, woke
            late_ms = woke[0].at_ms - wake
            print(f"\ntimer wake lateness: {late_ms} ms (sleep {SLEEP_S} s; all services and nats-server restarted"
                  f" {(wake - restarted_ms) / 1000:.1f} s before the wake time)")
            assert 0 <= late_ms < MAX_LATE_MS, f"woke {late_ms} ms after its time"
            assert attempt_of(done, "nap", 1).status == "succeeded"
            assert attempt_of(done, "after", 1).status == "succeeded"
            assert done.outcome == "succeeded"
            await assert_refold_identical(log, done)
        finally:
            await nc.close()
