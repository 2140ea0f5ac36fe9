"""The consumer gate's rule (shared/core/wire/consumerrules.py): an ordered consumer into a client inbox, nothing
else."""

from __future__ import annotations

import json

import pytest
from nats.js import api as jsapi

from reel.shared.core.wire.consumerrules import Refused, Vetted, is_client_inbox, vet

READABLE = ("REEL_EVENTS", "REEL_VERDICTS", "OBJ_reel_blobs")


def _body(stream: str = "REEL_EVENTS", **config: object) -> bytes:
    return json.dumps({"stream_name": stream, "config": config}).encode()


def test_what_nats_py_sends_for_an_ordered_consumer_is_admitted_as_it_was_vetted() -> None:
    config = jsapi.ConsumerConfig(deliver_subject="_INBOX.abcdef", ack_policy=jsapi.AckPolicy.NONE,
                                  flow_control=True, idle_heartbeat=5.0, mem_storage=True, num_replicas=1,
                                  filter_subject="reel.ev.r-1", deliver_policy=jsapi.DeliverPolicy.ALL)
    body = json.dumps({"stream_name": "REEL_EVENTS", "config": config.as_dict()}).encode()
    decision = vet("REEL_EVENTS", body, READABLE)
    assert isinstance(decision, Vetted)
    assert json.loads(decision.body) == json.loads(body)


@pytest.mark.parametrize("stream, body, why", [
    ("REEL_CMDS", _body("REEL_CMDS", deliver_subject="_INBOX.a"), "may not create consumers on stream"),
    ("REEL_EVENTS", _body("REEL_VERDICTS", deliver_subject="_INBOX.a"), "its subject"),
    ("REEL_EVENTS", _body(deliver_subject="reel.ctl.r-1"), "own inbox"),
    ("REEL_EVENTS", _body(deliver_subject="_INBOX.a.b"), "own inbox"),
    ("REEL_EVENTS", _body(deliver_subject="_INBOX.*"), "own inbox"),
    ("REEL_EVENTS", _body(deliver_subject="_INBOX_executor.a"), "own inbox"),
    ("REEL_EVENTS", _body(), "own inbox"),  # a pull consumer
    ("REEL_EVENTS", _body(deliver_subject="_INBOX.a", durable_name="d"), "ephemeral"),
    ("REEL_EVENTS", _body(deliver_subject="_INBOX.a", name="d"), "ephemeral"),
    ("REEL_EVENTS", _body(deliver_subject="_INBOX.a", ack_policy="explicit"), "ack-none"),
    ("REEL_EVENTS", b'{"stream_name":"REEL_EVENTS","config":{},"action":"update"}', "may only create"),
    ("REEL_EVENTS", b"[" * 5000 + b"]" * 5000, "not JSON"),
    ("REEL_EVENTS", b"{" + b" " * 20_000 + b"}", "at most"),
    ("REEL_EVENTS", b"[]", "no config"),
])
def test_anything_else_is_refused_with_its_reason(stream: str, body: bytes, why: str) -> None:
    decision = vet(stream, body, READABLE)
    assert isinstance(decision, Refused) and why in decision.reason, decision


def test_a_client_inbox_is_two_tokens() -> None:
    assert is_client_inbox("_INBOX.x") and not is_client_inbox("_INBOX.") and not is_client_inbox(None)
