"""Which JetStream consumer a client may create: ephemeral, ack-none, delivering to a client inbox (pure).

A consumer-create request (``$JS.API.CONSUMER.CREATE.<stream>``) carries its consumer's whole shape in
its body — a durable name, a ``deliver_subject`` — where NATS subject permissions cannot see it. A
push consumer delivers in the account of its stream, on any subject its body names: one aimed at
``<ns>.cmd.recover`` was stored in the commands stream, one aimed at ``<ns>.ctl.<run>`` reached the
executor. So a client's request reaches the consumer gate, not JetStream: :func:`vet` admits only
what Reel's clients (and any NATS library's ordered consumer) ask for, and the gate forwards exactly
the request it vetted (re-encoded), nothing else of the client's bytes (docs/security.md).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from reel.shared.core.wire import limits

CLIENT_INBOX = "_INBOX"
"""The inbox prefix of client connections: the Reel account exports ``_INBOX.>`` to the client account."""

MAX_REQUEST_BYTES = 16 * 1024
"""The largest consumer-create request the gate decodes (bytes); a larger one is refused undecoded."""

ACTIONS = ("", "create")
"""A request's ``action``: create only (an update needs the consumer's name, which a client never gives)."""


@dataclass(frozen=True)
class Vetted:
    """An admissible request: ``body`` is what to send to ``$JS.API.CONSUMER.CREATE.<stream>``."""

    body: bytes


@dataclass(frozen=True)
class Refused:
    """An inadmissible request and why (one line, for the client's error and the log)."""

    reason: str


def is_client_inbox(subject: object) -> bool:
    """True for ``_INBOX.<token>``: the deliver subject of an ordered consumer (nats-py, nats.go: ``new_inbox()``).

    Two tokens exactly: a request's reply inbox (``_INBOX.<prefix>.<token>``, three) is never a deliver
    subject, so a client cannot aim a stream at another client's pending request.
    """
    if not isinstance(subject, str):
        return False
    head, _, token = subject.partition(".")
    return head == CLIENT_INBOX and token != "" and not any(c in token for c in ".*> \t\r\n")


def vet(stream: str, body: bytes, readable: Collection[str]) -> Vetted | Refused:
    """Admit a client's request to create a consumer on ``stream`` (the stream its subject names).

    Admitted: ``{"stream_name": stream, "config": {...}, "action"?: "create"}`` whose config has no
    ``durable_name`` and no ``name``, ``ack_policy`` ``none`` and a ``deliver_subject`` that
    :func:`is_client_inbox` — an ephemeral push consumer into the client's own inbox, which is
    what an ordered consumer is. Everything else is refused with the reason.
    """
    if stream not in readable:
        return Refused(f"clients may not create consumers on stream {stream!r}")
    if len(body) > MAX_REQUEST_BYTES:
        return Refused(f"consumer request of {len(body)} bytes (at most {MAX_REQUEST_BYTES})")
    if limits.json_deeper_than(body):
        return Refused(f"consumer request is not JSON within the limits: {limits.too_deep()}")
    try:
        req = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return Refused(f"consumer request is not JSON ({type(exc).__name__})")
    if not isinstance(req, dict) or not isinstance(req.get("config"), dict):
        return Refused("consumer request has no config object")
    if req.get("stream_name") != stream:
        return Refused(f"consumer request names stream {req.get('stream_name')!r}, its subject {stream!r}")
    action = req.get("action", "")
    if action not in ACTIONS:
        return Refused(f"consumer request action {action!r} (clients may only create)")
    config: dict[str, Any] = req["config"]
    why = _config_refusal(config)
    if why is not None:
        return Refused(why)
    out: dict[str, Any] = {"stream_name": stream, "config": config}
    if action:
        out["action"] = action
    return Vetted(json.dumps(out).encode())


def _config_refusal(config: dict[str, Any]) -> str | None:
    for key in ("durable_name", "name"):
        if config.get(key):
            return f"clients may create only ephemeral consumers (a {key} was given)"
    if config.get("ack_policy", "none") != "none":
        return f"clients may create only ack-none consumers (ack_policy {config.get('ack_policy')!r})"
    deliver = config.get("deliver_subject")
    if not is_client_inbox(deliver):
        return (f"clients may create only consumers delivering to their own inbox ({CLIENT_INBOX}.<token>), "
                f"not {str(deliver)[:80]!r}")
    return None
