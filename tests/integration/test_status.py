"""``reel status`` (services/cli/status.py): instances from NATS micro discovery, consumer lag, executor leases."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from reel.services.cli.status import gather, render
from reel.services.executor.app import serve as executor_serve
from reel.services.recovery.app import serve as recovery_serve
from reel.shared.core.wire.commands import RecoverRuns, encode
from reel.shared.nats.client import ReelClient
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import REPO, running


async def test_status_lists_instances_lag_and_leases(infra: Infra, cfg: Config, client: ReelClient) -> None:
    async with running(recovery_serve, infra, cfg, sweep=False):  # creates its durable consumer, then stops
        assert (await client.command("recover", encode(RecoverRuns()))).ok
    for _ in range(2):  # queued while no recovery instance runs: lag
        await client.js.publish(cfg.names.command("recover"), encode(RecoverRuns()))
    async with running(executor_serve, infra, cfg):
        report = await _until(lambda r: any(x["answers_discovery"] for x in r["leases"]), infra, cfg)
        [ex] = report["services"]
        assert ex["service"] == "executor" and ex["instance_id"].startswith("x-") and ex["version"]
        assert [(e["subject"], e["handled"], e["errors"]) for e in ex["endpoints"]] == [
            (cfg.names.command("start"), 0, 0), (cfg.names.command("resume"), 0, 0)]
        consumers = {c["service"]: c for c in report["consumers"]}
        assert set(consumers) == {"executor", "recovery"}
        assert consumers["recovery"]["num_pending"] == 2 and consumers["recovery"]["num_ack_pending"] == 0
        assert consumers["executor"]["num_pending"] == 0
        [lease] = report["leases"]
        assert lease["executor_id"] == ex["instance_id"] and lease["pid"] == os.getpid()
        assert lease["renewed_ms_ago"] is not None and 0 <= lease["renewed_ms_ago"] < 60_000
        tables = render(report)
        assert [t.title for t in tables] == [f"services of namespace {cfg.names.namespace!r}",
                                             "consumers (JetStream)", "executor leases"]
        assert tables[1].row_count == 2 and tables[2].row_count == 1

        env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace, "COLUMNS": "200"}
        for args in (["--json"], []):
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.cli", "status", *args,
                                                        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            if args:
                doc = json.loads(out)
                assert [s["instance_id"] for s in doc["services"]] == [ex["instance_id"]]
                assert {c["service"]: c["num_pending"] for c in doc["consumers"]}["recovery"] == 2
            else:
                text = out.decode()
                assert ex["instance_id"] in text and cfg.names.consumer("recovery") in text
    report = await gather(infra, cfg, timeout_s=0.3)
    assert report["services"] == [] and report["leases"] == []  # stopped: no instance, its lease deleted


async def _until(ok, infra: Infra, cfg: Config, within_s: float = 30, expected: int = 1):  # type: ignore[no-untyped-def]
    """The report, once ``ok(report)`` (the executor registers and heartbeats as it starts)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        report = await gather(infra, cfg, timeout_s=1.0, expected=expected)
        if ok(report) or loop.time() > deadline:
            return report


async def test_status_as_the_client_role(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from reel.shared.nats.infra import open_infra
    from tests.integration.authserver import auth_server, connected, services_as_roles

    async with auth_server(tmp_path) as server, services_as_roles(server, "executor", "cancel"), \
            connected(server, "client") as nc:
        cfg = server.cfg("client")
        infra = await open_infra(nc, cfg)
        report = await _until(lambda r: len(r["services"]) == 2 and r["leases"], infra, cfg, expected=2)
        assert sorted(s["service"] for s in report["services"]) == ["cancel", "executor"]
        assert {c["service"] for c in report["consumers"]} == {"executor", "cancel"}
        assert [x["answers_discovery"] for x in report["leases"]] == [True]
        assert nc.violations == []
