"""Prometheus metrics (shared/runtime/metrics.py): real executor and verifier processes with ``REEL_METRICS_PORT``
set run
the shipped hello workflow; ``/metrics`` scraped over HTTP counts its commits, attempts by kind and outcome with
their latency, the verdicts by status, and the consumer's queue depth. Off by default."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from reel.shared.core.workflow.spec import load_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.runtime.config import Config
from tests.conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def service(cfg: Config, tmp_path: Path, name: str, port: int | None) -> AsyncIterator[None]:
    env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace, "REEL_LOG_FORMAT": "json",
           "REEL_METRICS_ADDR": "127.0.0.1"}
    env.pop("REEL_METRICS_PORT", None)
    args = ["--metrics-port", str(port)] if port is not None else []
    with (tmp_path / f"{name}.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", f"reel.services.{name}", *args, cwd=REPO,
                                                    env=env, stdout=log, stderr=log)
    try:
        yield
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()


async def scrape(port: int, *, within_s: float = 30) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as {(sample name, sorted labels): value} (retried until the endpoint listens)."""
    deadline = asyncio.get_running_loop().time() + within_s
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    assert resp.status == 200
                    text = await resp.text()
                    break
            except aiohttp.ClientConnectorError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


async def test_services_serve_metrics_over_http(cfg: Config, client: ReelClient, tmp_path: Path) -> None:
    ex_port, ver_port = free_port(), free_port()
    async with service(cfg, tmp_path, "executor", ex_port), service(cfg, tmp_path, "verifier", ver_port):
        reply = await client.start(load_workflow(REPO / "examples" / "hello.yaml"))
        assert reply.ok, reply
        state = await client.wait_for(reply.run_id, ("completed",), timeout_s=90)
        assert state.outcome == "passed"
        ex, ver = await scrape(ex_port), await scrape(ver_port)
        durable = cfg.names.consumer("executor")
        pending = ("reel_consumer_pending", (("durable", durable),))
        deadline = asyncio.get_running_loop().time() + 30
        while ex.get(pending) != 0 and asyncio.get_running_loop().time() < deadline:
            # the gauge is set from each delivery's metadata and a periodic poll: it lags the queue
            await asyncio.sleep(0.5)
            ex = await scrape(ex_port)
    lines = [json.loads(x) for x in (tmp_path / "executor.log").read_text().splitlines() if x.startswith("{")]
    assert [x["port"] for x in lines if x.get("event") == "metrics.listening"] == [ex_port]
    # hello: plan (model), run (tool), summarize (model: fails once, rate_limited, then succeeds)
    assert ex[("reel_attempts_total", (("kind", "model"), ("outcome", "succeeded")))] == 2
    assert ex[("reel_attempts_total", (("kind", "model"), ("outcome", "failed")))] == 1
    assert ex[("reel_attempts_total", (("kind", "tool"), ("outcome", "succeeded")))] == 1
    assert ex[("reel_attempt_duration_seconds_count", (("kind", "model"),))] == 3
    assert ex[("reel_attempt_duration_seconds_count", (("kind", "tool"),))] == 1
    assert ex[("reel_attempt_duration_seconds_sum", (("kind", "tool"),))] > 0  # a real `sh` ran
    commits = ex[("reel_commits_total", ())]
    assert commits >= 5  # created/started, 4 dispatches and their outcomes, verifying (some share a commit)
    assert ex[pending] == 0
    assert ("reel_consumer_ack_pending", (("durable", durable),)) in ex  # polled while the endpoint is on
    assert ver[("reel_verdicts_total", (("status", "pass"), ("verifier", "greeting-printed")))] == 1
    assert ver[("reel_verdicts_total", (("status", "pass"), ("verifier", "task-was-packed")))] == 1
    assert ver[("reel_commits_total", ())] >= 2  # its verdicts and run_completed
    assert not any(name == "reel_attempts_total" for name, _ in ver)


async def test_metrics_are_off_by_default(cfg: Config, client: ReelClient, tmp_path: Path) -> None:
    from tests.integration.test_micro import until_all_answer

    async with service(cfg, tmp_path, "rewind", None):
        await until_all_answer(client.nc, cfg, ("rewind",))  # serving
    text = (tmp_path / "rewind.log").read_text()
    assert "service.started" in text and "metrics" not in text
