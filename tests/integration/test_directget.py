"""Direct Gets on one reply subscription per connection (shared/nats/directget.py), on a real nats-server.

Many reads in flight at once on one connection each get exactly their own answer; the connection
keeps one reply subscription however many reads it makes; a read that found nothing answers empty;
a late reply to a read that timed out is dropped, not handed to the next read.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from reel.shared.nats.directget import direct_replies
from reel.shared.nats.infra import Infra
from reel.shared.nats.subjectlog import SubjectLog
from reel.shared.runtime.config import Config


async def test_concurrent_reads_each_get_their_own_messages(infra: Infra, cfg: Config) -> None:
    log = SubjectLog(infra.nc, cfg.names.events_stream, cfg.names.events)
    keys = [f"r-dg{i}" for i in range(40)]
    for i, key in enumerate(keys):
        for j in range(i % 4 + 1):
            await log.append(key, f"{key}:{j}".encode(), expected_seq=log.known(key))
    got = await asyncio.gather(*(log.read_raw(k) for k in keys))
    subscribe, made = infra.nc.subscribe, []

    async def counting(*args: Any, **kwargs: Any) -> Any:  # the real subscribe, counted
        made.append(args)
        return await subscribe(*args, **kwargs)

    infra.nc.subscribe = counting  # type: ignore[method-assign]
    for i, (key, rows) in enumerate(zip(keys, got, strict=True)):
        assert [body for _, body in rows] == [f"{key}:{j}".encode() for j in range(i % 4 + 1)]
    again = await asyncio.gather(*(log.read_raw(k) for k in keys))
    assert again == got
    assert made == []  # 40 more reads in flight at once, no subscription more
    assert await log.read_raw("r-dg-none") == []
    assert await log.head_msg("r-dg-none") is None


async def test_late_reply_of_a_timed_out_read_is_dropped(infra: Infra, cfg: Config) -> None:
    log = SubjectLog(infra.nc, cfg.names.events_stream, cfg.names.events)
    await log.append("r-dg-late", b"mine", expected_seq=0)
    replies = direct_replies(infra.nc)
    subject = f"$JS.API.DIRECT.GET.{cfg.names.events_stream}"
    with pytest.raises(TimeoutError):  # the answer cannot arrive within 0 s: this read gives up first
        await replies.get(subject, json.dumps({"last_by_subj": cfg.names.events("r-dg-late")}).encode(),
                          single=True, timeout_s=0)
    await log.append("r-dg-other", b"theirs", expected_seq=0)
    rows = await log.read_raw("r-dg-other")
    assert [body for _, body in rows] == [b"theirs"]
    assert [body for _, body in await log.read_raw("r-dg-late")] == [b"mine"]
