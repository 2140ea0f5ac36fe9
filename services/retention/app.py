"""The retention service: enforces the namespace's retention policy and collects unreferenced blobs.

Every ``REEL_RETENTION_SWEEP_S`` seconds it runs :func:`reel.shared.nats.retention.sweep` with the policy of
``REEL_RETENTION_KEEP_DAYS`` / ``REEL_RETENTION_KEEP_NEWEST`` and the blob grace ``REEL_BLOB_GRACE_S``
(:class:`reel.shared.runtime.config.RetentionConfig`). With no limit set it only collects blobs no run references.
It connects as the ``retention`` role: the only service role that may purge streams (docs/security.md).
Running two instances is safe (each delete is fenced), but one is enough.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from reel.shared.nats.blobread import KNOWN_TTL_S
from reel.shared.nats.infra import Infra
from reel.shared.nats.retention import serve_loop
from reel.shared.runtime.config import Config, RetentionConfig

log = structlog.get_logger(__name__)


async def serve(infra: Infra, cfg: Config, stop: asyncio.Event, **_: Any) -> None:
    """Sweep until ``stop`` is set.

    Raises:
        ValueError: a ``REEL_RETENTION_*`` / ``REEL_BLOB_GRACE_S`` variable holds a value it cannot take.
    """
    rc = RetentionConfig.from_env()
    log.info("retention.policy", keep_days=rc.policy.keep_days, keep_newest=rc.policy.keep_newest,
             sweep_s=rc.sweep_s, blob_grace_s=rc.blob_grace_s)
    if rc.blob_grace_s < 2 * KNOWN_TTL_S:
        log.warning("retention.grace_short", blob_grace_s=rc.blob_grace_s, writer_cache_s=KNOWN_TTL_S,
                    reason="a writer may name a blob it cached as stored this long ago without touching it: a grace "
                           "under twice that may collect a blob a commit is about to name")
    await serve_loop(infra, cfg.names, rc.policy, stop, every_s=rc.sweep_s, grace_s=rc.blob_grace_s)
