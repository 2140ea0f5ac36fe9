"""The executor role may not purge blob chunks: a purge of a chunk another writer stored is refused and the
blob still reads back whole.

A NATS permission names the subject ``$JS.API.STREAM.PURGE.<stream>``, never the filter in the request's body,
so a role holding that subject could purge any chunk of the blob stream. No service role holds it: a blob
store on a role connection leaves the chunks of a body it lost a race for unreferenced instead of purging
them (shared/nats/blobstore.py). Skipped (naming why) should a grant hold it again.
"""

from __future__ import annotations

import pytest
from nats.js.errors import Error as JetStreamError

from reel.shared.auth.roles import API, grants, may_publish, streams
from reel.shared.core.errors import BlobMissing
from reel.shared.nats.access import PermissionDenied
from reel.shared.nats.blobstore import JetStreamBlobStore
from tests.integration.authserver import connected
from tests.security.conftest import SecurityLedger, Suite

pytestmark = pytest.mark.security


async def test_the_executor_cannot_purge_a_blob_it_did_not_write(
        suite: Suite, security_ledger: SecurityLedger) -> None:
    n, op = suite.server.base.names, suite.server.operator
    stream = streams(n)["blobs"]
    if may_publish(grants(n)["executor"], f"{API}.STREAM.PURGE.{stream}"):
        pytest.skip(f"not limited: the executor's grant holds {API}.STREAM.PURGE.{stream}, whose filter "
                    "(in the request body) no NATS permission restricts: it may purge any blob chunk")
    body = b"another writer's blob " * 100
    ref = await JetStreamBlobStore(op.nc, op.blobs, n.blob_bucket).put(body)
    info = await op.blobs.get_info(ref.sha256)
    async with connected(suite.server, "executor") as nc:
        try:
            await nc.jetstream().purge_stream(stream, subject=f"$O.{n.blob_bucket}.C.{info.nuid}")
            exc: BaseException | None = None
        except (PermissionDenied, JetStreamError) as e:
            exc = e
    try:
        intact = await JetStreamBlobStore(op.nc, op.blobs, n.blob_bucket).get(ref) == body
    except BlobMissing:  # its chunk is gone
        intact = False
    security_ledger.record("executor purges another writer's blob", refused=exc is not None, let_in=not intact)
    assert exc is not None and intact, exc
