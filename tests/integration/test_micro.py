"""NATS service discovery (shared/nats/micro.py): every service, run as a real process, answers ``$SRV.PING``,
``$SRV.INFO`` lists the subjects it consumes, ``$SRV.STATS`` counts the commands it handled — with nats-py's
plain requests, as ``nats micro ls`` would ask."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats

from reel.shared.core.wire.commands import RecoverRuns, encode
from reel.shared.nats.client import ReelClient
from reel.shared.nats.micro import discover
from reel.shared.runtime.config import Config

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("executor", "verifier", "rewind", "cancel", "recovery", "crucible")


@contextlib.asynccontextmanager
async def processes(cfg: Config, tmp_path: Path, names: tuple[str, ...]) -> AsyncIterator[None]:
    """``python -m services.<name>`` for each of ``names``, on ``cfg``'s server and namespace."""
    env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace, "REEL_LOG_FORMAT": "json",
           "REEL_HOME": str(tmp_path / "home")}
    procs = []
    for name in names:
        log = (tmp_path / f"{name}.log").open("wb")
        procs.append(await asyncio.create_subprocess_exec(sys.executable, "-m", f"reel.services.{name}", cwd=REPO,
                                                          env=env, stdout=log, stderr=log))
    try:
        yield
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 30)
            except TimeoutError:
                p.kill()


async def until_all_answer(nc: nats.NATS, cfg: Config, names: tuple[str, ...], within_s: float = 60
                           ) -> list[dict[str, object]]:
    """PING until every one of ``names`` answered (each process registers once its consumer runs)."""
    want = {f"reel-{n}" for n in names}
    deadline = time.monotonic() + within_s
    while True:
        got = await discover(nc, "PING", namespace=cfg.names.namespace, timeout_s=1.0, expected=len(want))
        if {str(g["name"]) for g in got} >= want or time.monotonic() > deadline:
            return got


async def test_every_service_process_answers_ping_info_and_stats(cfg: Config, client: ReelClient,
                                                                  tmp_path: Path) -> None:
    nc = await nats.connect(cfg.nats_url)  # a plain nats-py connection, no Reel code on the asking side
    try:
        async with processes(cfg, tmp_path, SERVICES):
            pings = await until_all_answer(nc, cfg, SERVICES)
            assert sorted(str(p["name"]) for p in pings) == sorted(f"reel-{n}" for n in SERVICES), (
                pings, [(tmp_path / f"{n}.log").read_text()[-2000:] for n in SERVICES])
            for p in pings:
                assert p["type"] == "io.nats.micro.v1.ping_response" and p["version"] and p["id"]
            by_name = {str(p["name"]): p for p in pings}
            assert str(by_name["reel-executor"]["id"]).startswith("x-")  # the executor id: the one its lease names
            leases = await client.js.key_value(cfg.names.lease_bucket)
            assert (await leases.get(str(by_name["reel-executor"]["id"]))).value

            # INFO of one service by name, as a plain request: the subjects it consumes, marked as JetStream's
            msg = await nc.request("$SRV.INFO.reel-executor", b"", timeout=5)
            info = json.loads(msg.data)
            assert info["type"] == "io.nats.micro.v1.info_response"
            assert [(e["name"], e["subject"]) for e in info["endpoints"]] == [
                ("start", cfg.names.command("start")), ("resume", cfg.names.command("resume"))]
            for e in info["endpoints"]:
                assert e["queue_group"] == cfg.names.consumer("executor")
                assert e["metadata"] == {"transport": "jetstream", "stream": cfg.names.commands_stream,
                                         "durable": cfg.names.consumer("executor")}
            assert info["metadata"]["namespace"] == cfg.names.namespace
            infos = await discover(nc, "INFO", namespace=cfg.names.namespace, expected=len(SERVICES), timeout_s=5)
            subjects = {str(i["name"]): [e["subject"] for e in i["endpoints"]] for i in infos}  # type: ignore[attr-defined]
            assert subjects["reel-verifier"] == [cfg.names.verify_all]
            assert subjects["reel-cancel"] == [cfg.names.command("cancel"), cfg.names.command("respond")]
            assert subjects["reel-crucible"] == [cfg.names.command(f"crucible.{c}") for c in ("run", "resume")]

            # STATS: one command handled, one refused
            reply = await client.command("recover", encode(RecoverRuns()))
            assert reply.ok, reply
            refused = await client.cancel("r-00000000000000000000")
            assert not refused.ok and refused.error is not None
            stats = {str(s["name"]): s for s in await discover(nc, "STATS", namespace=cfg.names.namespace,
                                                               expected=len(SERVICES), timeout_s=5)}
            recover = {e["name"]: e for e in stats["reel-recovery"]["endpoints"]}["recover"]  # type: ignore[attr-defined]
            assert (recover["num_requests"], recover["num_errors"]) == (1, 0)
            assert recover["processing_time"] > 0
            cancel = {e["name"]: e for e in stats["reel-cancel"]["endpoints"]}  # type: ignore[attr-defined]
            assert (cancel["cancel"]["num_requests"], cancel["cancel"]["num_errors"]) == (1, 1)
            assert cancel["cancel"]["last_error"].startswith(refused.error.code)
            assert cancel["respond"]["num_requests"] == 0
    finally:
        await nc.close()


async def test_discovery_keeps_to_its_namespace(cfg: Config, client: ReelClient, tmp_path: Path) -> None:
    async with processes(cfg, tmp_path, ("rewind",)):
        ours = await until_all_answer(client.nc, cfg, ("rewind",))
        assert [p["name"] for p in ours] == ["reel-rewind"]
        assert await discover(client.nc, "PING", namespace=cfg.names.namespace + "x", timeout_s=0.5) == []
        assert [p["name"] for p in await discover(client.nc, "PING", name="reel-rewind", timeout_s=0.5,
                                                  namespace=cfg.names.namespace)] == ["reel-rewind"]
