"""Every write the executor makes waits out a server outage with the same message ids.

One killable nats-server (file storage). The server is frozen (SIGSTOP) so that the writes sent
next are in flight and unanswered, then killed -9 and restarted on the same port and store: the
first try of each write gets no ack, and it must be sent again — the same message, the same
``Nats-Msg-Id`` — until it settles, never raised to the drive (that was a ``command.handler_crashed``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from pathlib import Path

import msgspec
import nats.errors
import nats.js.api
import nats.js.errors
import pytest

from reel.shared.core.run.events import BlobRef
from reel.shared.core.wire.subjects import EXPECTED_LAST_SUBJECT_SEQ_HEADER, MSG_ID_HEADER, outcome_key
from reel.shared.nats.blobstore import CHUNK_BYTES, JetStreamBlobStore
from reel.shared.nats.infra import connect, ensure_infra
from reel.shared.nats.publish import _settled, publish_pipelined
from reel.shared.runtime.config import Config
from tests.faults.procs import killable_server
from tests.integration.scenarios import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow]

ACK_TIMEOUT_S = 2.0
"""Each try's ack wait (s) here: a try lost with the server is sent again this soon."""


async def test_blob_puts_and_markers_in_flight_at_a_server_kill_settle(cfg: Config, tmp_path: Path) -> None:
    async with killable_server(tmp_path / "server") as srv:
        cfg = dataclasses.replace(cfg, nats_url=srv.url, storage="file")
        nc = await connect(cfg, name="faults-outage-writes")
        try:
            infra = await ensure_infra(nc, cfg)
            blobs = JetStreamBlobStore(nc, infra.blobs, cfg.names.blob_bucket, timeout_s=ACK_TIMEOUT_S)
            big = bytes(range(256)) * (3 * CHUNK_BYTES // 256 + 1000)  # four chunks
            small = b"a tool's output " * 300
            key = outcome_key("r-outage", "main", "s1", 1)
            marker_ref = BlobRef(sha256=hashlib.sha256(small).hexdigest(), size_bytes=len(small))

            srv.freeze()
            puts = [asyncio.ensure_future(blobs.put(big)), asyncio.ensure_future(blobs.put(small))]
            marker = publish_pipelined(nc, cfg.names.outcome_marker(key), msgspec.json.encode(marker_ref), None,
                                       ACK_TIMEOUT_S)

            async def sent() -> bool:  # every byte handed to the frozen server's socket: in flight
                return nc.pending_data_size == 0 and nc.stats["out_bytes"] > len(big)

            await wait_until(sent, timeout_s=20, what="the writes to be sent to the frozen server")
            await srv.kill()
            await srv.start()

            refs = await asyncio.wait_for(asyncio.gather(*puts), 90)
            await asyncio.wait_for(marker, 90)
            assert [await blobs.get(r) for r in refs] == [big, small]  # intact: no chunk stored twice
            entry = await infra.outcomes.get(key)
            assert msgspec.json.decode(entry.value or b"", type=BlobRef) == marker_ref
        finally:
            await nc.close()


async def test_a_fenced_write_whose_ack_was_lost_settles_as_landed(cfg: Config, tmp_path: Path) -> None:
    """The first try landed but its ack was lost: on one node the resend meets the fence (10071) before
    the duplicate window, and must be taken for the landed write it is — not for another writer's."""
    async with killable_server(tmp_path / "server") as srv:
        cfg = dataclasses.replace(cfg, nats_url=srv.url, storage="file")
        nc = await connect(cfg, name="faults-lost-ack")
        try:
            infra = await ensure_infra(nc, cfg)
            key = outcome_key("r-lost-ack", "main", "s1", 1)
            subject = cfg.names.outcome_marker(key)
            headers = {MSG_ID_HEADER: "lost-ack-1", EXPECTED_LAST_SUBJECT_SEQ_HEADER: "0"}

            async def landed_but_ack_lost() -> nats.js.api.PubAck:
                await nc.jetstream().publish(subject, b"first", headers=headers)
                raise nats.errors.TimeoutError

            ack = await _settled(nc, subject, b"first", headers, ACK_TIMEOUT_S, 10.0, landed_but_ack_lost())
            assert ack.duplicate and ack.seq > 0
            other = {MSG_ID_HEADER: "another-writer", EXPECTED_LAST_SUBJECT_SEQ_HEADER: "0"}

            async def lost() -> nats.js.api.PubAck:
                raise nats.errors.TimeoutError

            with pytest.raises(nats.js.errors.APIError) as refused:  # another writer's: still a conflict
                await _settled(nc, subject, b"other", other, ACK_TIMEOUT_S, 10.0, lost())
            assert refused.value.err_code == 10071
            assert (await infra.outcomes.get(key)).value == b"first"
        finally:
            await nc.close()
