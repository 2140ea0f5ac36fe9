"""A full store explains itself (a real nats-server with ``max_file_store: 8MB``; docs/operations.md, "A full store").

The server refuses every file-store write with JetStream ``err_code`` 10023 "insufficient resources" once its
limit is used up. A command is then refused at once as ``store_full`` (``reel run``'s error line names it);
an executor whose writes wait says so (``store.full`` log lines, ``store_full`` in its discovery STATS, which
``reel status`` prints beside the account's usage); once space is freed the waiting writes land and the run
completes, with no server restart.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.js import api as jsapi
from nats.js.errors import APIError

from reel.services.cli.status import gather, jetstream_lines
from reel.services.executor.app import serve as executor_serve
from reel.shared.core.wire.subjects import Names
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.embedded import EmbeddedServer, embedded_server
from reel.shared.nats.infra import Infra, connect, ensure_infra
from reel.shared.nats.publish import StoreFull
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import wait_until
from tests.integration.test_auth_cli import reel
from tests.logcapture import info_logs

MAX_FILE_STORE = "8MB"
FILL = "FILLER"


@dataclass
class Small:
    """A server with a small store, Reel's streams on it (namespace ``reel``), and a filler stream."""

    srv: EmbeddedServer
    cfg: Config
    infra: Infra
    client: ReelClient

    async def fill(self) -> APIError:
        """Publish 64 KiB messages on the filler stream until the server refuses one; that refusal."""
        while True:
            try:
                await self.infra.js.publish(f"{FILL}.x", b"f" * 65536, timeout=5)
            except APIError as exc:
                return exc

    async def free(self) -> None:
        await self.infra.js.purge_stream(FILL)


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[Small]:
    conf = tmp_path / "small.conf"
    conf.write_text(f"jetstream {{ max_file_store: {MAX_FILE_STORE} }}\n")
    async with embedded_server(config_file=str(conf), store_dir=str(tmp_path / "js")) as srv:
        cfg = Config(nats_url=srv.url, names=Names("reel"), lease_ttl_s=2)
        nc = await connect(cfg, name="t-small")
        try:
            infra = await ensure_infra(nc, cfg)
            await infra.js.add_stream(jsapi.StreamConfig(name=FILL, subjects=[f"{FILL}.>"]))
            blobs = JetStreamBlobStore(nc, infra.blobs, cfg.names.blob_bucket)
            yield Small(srv, cfg, infra, ReelClient(nc, cfg, blobs))
        finally:
            await nc.close()


HELLO = {"name": "hello", "steps": [{"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": "hi"}}]}


async def test_a_command_on_a_full_store_is_refused_at_once_naming_it(small: Small, tmp_path: Path) -> None:
    refusal = await small.fill()
    assert (refusal.code, refusal.err_code) == (503, 10023), refusal
    started = time.monotonic()
    with pytest.raises(StoreFull) as caught:
        await small.client.start(parse_workflow(HELLO))
    took_s = time.monotonic() - started
    assert caught.value.err_code == 10023 and "insufficient resources" in caught.value.message
    assert took_s < 5, took_s  # it waited out REEL_FAILOVER_S (30 s) and said "ServiceUnavailableError"

    code, out, err = await reel("run", "examples/hello.yaml", "--nats-url", small.cfg.nats_url,
                                env={"REEL_HOME": str(tmp_path / "home")}, timeout_s=90)
    said = " ".join((out + err).split())
    assert code == 1 and "error: store_full: JetStream refused the write to reel.cmd." in said, said
    assert "err_code 10023 'insufficient resources'" in said and "Traceback" not in said, said

    code, out, err = await reel("status", "--nats-url", small.cfg.nats_url, env={"REEL_HOME": str(tmp_path / "home")},
                                timeout_s=90)
    said = " ".join(out.split())
    assert code == 3 and "JetStream storage: 8.0 MiB used (no account limit: the server's max_file_store" in said, \
        (out, err)


WAITS = {"name": "waits", "steps": [{"kind": "tool", "id": "big", "tool": {"type": "command", "argv": [
    "sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.05; done; head -c 300000 /dev/zero | tr "\\0" a', "{go}"]}}]}
"""A step that waits for a file (the test's rendezvous), then prints 300 KB: its output is a blob."""


@pytest.mark.parametrize(("lease_ttl_s", "within_s"), [(30, 10.0), (2, 60.0)], ids=["lease-outlasts", "lease-lost"])
async def test_a_run_waiting_on_a_full_store_says_so_and_completes_once_space_is_freed(
        small: Small, tmp_path: Path, lease_ttl_s: int, within_s: float) -> None:
    """While the lease outlasts the full store, the executor's writes wait and land within about a second of
    space being freed. Once the full store outlasts the lease (its renewals are refused too: the bucket shares
    the server's storage), the executor gives its runs up (``lease.lost``, a new incarnation) and the run is
    taken up again by the start command's redelivery once there is room."""
    cfg = dataclasses.replace(small.cfg, lease_ttl_s=lease_ttl_s)
    go = tmp_path / "go"
    spec = parse_workflow({**WAITS, "steps": [{**WAITS["steps"][0], "tool": {
        **WAITS["steps"][0]["tool"], "argv": [*WAITS["steps"][0]["tool"]["argv"][:3], str(go)]}}]})
    with info_logs() as logs:
        async with running(executor_serve, small.infra, cfg):
            reply = await small.client.start(spec)
            assert reply.ok and reply.run_id, reply
            await small.client.wait_for(reply.run_id, ("running",), timeout_s=30)
            await small.fill()
            go.touch()  # the step ends now; its output, attempt and commit meet the full store

            async def reported() -> dict[str, object] | None:
                report = await gather(small.infra, cfg, timeout_s=0.5)
                return report if report["jetstream"]["store_full"] else None

            report = await wait_until(reported, timeout_s=30, what="the executor to report the full store")
            [(instance, why)] = report["jetstream"]["store_full"].items()
            assert instance.startswith("executor x-") and why.startswith("store_full: err_code 10023"), report
            lines = " ".join(str(t) for t in jetstream_lines(report["jetstream"]))
            assert "its writes wait until space is freed" in lines, lines
            assert (await small.client.log.load(reply.run_id)).status == "running"
            if lease_ttl_s < 5:
                async def lost() -> bool:
                    return any(e["event"] == "lease.lost" for e in logs)

                await wait_until(lost, timeout_s=30, what="the executor's lease to be lost")

            freed = time.monotonic()
            await small.free()
            done = await small.client.wait_for(reply.run_id, ("verifying", "completed"), timeout_s=90)
            resumed_s = time.monotonic() - freed
    assert done.status in ("verifying", "completed"), done.status  # verifying: no verifier runs here
    events = {e["event"] for e in logs}
    print(f"store full, lease ttl {lease_ttl_s}s: the run moved on {resumed_s:.2f}s after space was freed; "
          f"lease lost: {'lease.lost' in events}")
    assert resumed_s < within_s, resumed_s
    assert ("lease.lost" in events) is (lease_ttl_s < 5), sorted(events)
    refused = [e for e in logs if e["event"] == "lease.renew_failed"]  # a renewal fell in the full store's time
    assert refused or lease_ttl_s >= 5
    assert all("store full (err_code 10023" in e["error"] for e in refused), refused[:3]
    full = [e for e in logs if e["event"] == "store.full"]
    assert full and all(e["err_code"] == 10023 for e in full), logs[-20:]
    assert not [e for e in logs if e["event"] == "command.handler_crashed"]
