"""The poison and hostile payloads of the trust tests, in one table.

Both the integration suites (tests/integration/test_poison_commands.py, test_poison.py: each
case in depth, on in-process services) and the fault suite (tests/faults/test_hostile_payloads.py,
test_poison_isolation.py: all at once, beside real runs) send these, so a shape added here is
tried by both:

* :data:`GARBAGE` — command bodies that do not decode or have the wrong schema: every command
  subject refuses each with ``invalid_command`` (and acks it: no redelivery);
* :data:`DEEP` — well-formed bodies nested 10,000 deep: refused with ``invalid_command: nested deeper than 64``;
* :func:`hostile` — :data:`GARBAGE` and worse (bodies naming live runs with wrong types,
  ~900 KB bodies, unicode: emoji, right-to-left text, NUL, lone surrogates, ids that are not one
  subject token): each is refused with some code;
* :data:`POISON_COMMITS` — what a plain client publishes straight onto a run's event subject, with
  the corruption kind the run then reads at that LSN;
* :func:`ask` — publish a command with a reply subject and decode the reply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from reel.shared.core.run.events import (
    AttemptSucceeded,
    BlobRef,
    Commit,
    RunCancelled,
    RunCompleted,
    Verdict,
    VerdictRecorded,
    encode_commit,
)
from reel.shared.core.wire.commands import Reply
from reel.shared.core.wire.subjects import REPLY_TO_HEADER
from reel.shared.nats.infra import Infra

GARBAGE: tuple[bytes, ...] = (
    b"\x00\xff not json", b"\x00\xff\xfe not json", b"", b"[1, 2]", b"[]", b"null", b"42", b'"a string"',
    b'{"bogus": true}', b'{"run_id": 5}', b'{"run_id": null, "reason": {"x": [1]}}', b"{" * 5000, b"{" * 20_000,
    b"[" * 10_000 + b"]" * 10_000,
)
"""Bodies that no command subject decodes into its command (``invalid_command`` everywhere)."""

DEPTH = 10_000
"""How deep the :data:`DEEP` bodies nest: ten times Python's recursion limit."""


def _nest(inner: bytes, depth: int = DEPTH) -> bytes:
    return b'{"a": ' * depth + inner + b"}" * depth


DEEP: tuple[bytes, ...] = (
    _nest(b"1"), b"[" * DEPTH + b"]" * DEPTH,
    b'{"workflow": {"name": "w", "steps": [], "source": ' + _nest(b"1") + b"}}",
    b'{"run_id": "r-1", "request_id": "q", "decision": "approve", "arguments": ' + _nest(b"[]") + b"}",
    b'{"run_id": "r-1", "config": ' + _nest(b"{}") + b', "session_id": "cs-1"}',
    b'{"run_id": ' + b"[" * DEPTH + b'"r-1"' + b"]" * DEPTH + b"}",
)
"""Well-formed JSON bodies nested :data:`DEPTH` deep, the deep part where a command takes any JSON (a
workflow's ``source``, a respond's ``arguments``, a crucible session's ``config``) and where it takes
none: every command subject refuses each with ``invalid_command: nested deeper than 64``, at once."""

HUGE = 900 * 1024
"""Bytes of the largest hostile body: below the server's 1 MiB max payload."""

UNICODE = ("r-😀", "r-\u202eevil", "r-\x00nul", "r-\ud800", "r-ünïcödé", "r-a.b", "r->", " ", "r-" + "é" * 5000)
"""Ids no run has: emoji, right-to-left override, NUL, a lone surrogate, not one subject token, very long."""


def naming(live: str) -> list[bytes]:
    """Bodies that name the live run ``live`` but are wrong (types, operators, unknown fields)."""
    run = live.encode()
    return [b'{"run_id": ["' + run + b'"]}',
            b'{"run_id": "' + run + b'", "at_lsn": "three", "reason": 7, "decision": 1}',
            b'{"run_id": "' + run + b'", "at_step": {"$gt": ""}, "request_id": [], "extra": true}']


def hostile(run_ids: list[str]) -> list[bytes]:
    """:data:`GARBAGE`, bodies naming the first of ``run_ids`` (:func:`naming`), huge and unicode ones."""
    bodies = [*GARBAGE, *DEEP, *naming(run_ids[0]), b'{"workflow": "' + b"x" * HUGE + b'"}',
              b'{"workflow": {"name": "' + "名前".encode() * 1000 + b'", "steps": "none"}}',
              b'{"workflow": {"name": "w", "steps": [{"kind": "tool", "id": "\\u0000", "tool": {"type": "command",'
              b' "argv": []}}]}}', b'{"run_id": "\\ud800\\udfff\\ud800"}', "{\"run_id\": \"r-\u0000\"}".encode()]
    bodies += [msgspec.json.encode({"run_id": u, "reason": u, "at_step": u, "request_id": u, "decision": u})
               for u in UNICODE if "\ud800" not in u]
    return bodies


async def ask(infra: Infra, subject: str, body: bytes, *, timeout_s: float = 30.0) -> Reply:
    """Publish ``body`` on ``subject`` with a reply subject (``Reel-Reply-To``); the decoded reply.

    Raises:
        nats.errors.TimeoutError: no reply within ``timeout_s``.
    """
    inbox = infra.nc.new_inbox()
    sub = await infra.nc.subscribe(inbox, max_msgs=1)
    try:
        await infra.js.publish(subject, body, headers={REPLY_TO_HEADER: inbox})
        msg = await sub.next_msg(timeout=timeout_s)
    finally:
        await sub.unsubscribe()
    return msgspec.json.decode(msg.data, type=Reply)


REF = BlobRef(sha256="a" * 64, size_bytes=1)
"""A blob reference no run wrote (a forged outcome's output)."""


def forged(run_id: str, *events: object, writer: str = "forger") -> bytes:
    """A well-formed commit of ``events`` naming ``run_id``, as a plain client could publish it."""
    return encode_commit(Commit(commit_id="c-forged", run_id=run_id, writer=writer, events=events))  # type: ignore[arg-type]


@dataclass(frozen=True)
class PoisonCommit:
    """One poison case: the body published onto a run's event subject and what the run then reads.

    Attributes:
        kind: the corruption kind at its LSN (``undecodable``, ``invalid_transition``, ``foreign_run``).
        words: words of the corruption's reason.
        body: ``(run_id, another run's id, the run's head LSN) → bytes``.
    """

    kind: str
    words: str
    body: Callable[[str, str, int], bytes]


POISON_COMMITS: dict[str, PoisonCommit] = {
    "garbage": PoisonCommit("undecodable", "does not decode", lambda run, other, head: b"\x00\xff not a commit {"),
    "forged_completed": PoisonCommit("invalid_transition", "run_completed", lambda run, other, head: forged(
        run, RunCompleted(branch_id="main", outcome="passed", at_ms=1))),
    "foreign_run": PoisonCommit("foreign_run", "names another run", lambda run, other, head: forged(
        other, RunCancelled(reason="forged", at_ms=1))),
    "never_dispatched": PoisonCommit("invalid_transition", "wait#9 on main that was never dispatched",
                                     lambda run, other, head: forged(run, AttemptSucceeded(
                                         branch_id="main", step_id="wait", attempt=9, output_ref=REF, at_ms=1))),
    "unasked_verdict": PoisonCommit("invalid_transition", "", lambda run, other, head: forged(
        run, VerdictRecorded(verdict=Verdict(run_id=run, branch_id="main", snapshot_lsn=head, verifier="forged",
                                             status="pass")))),
}
"""The poison commits, by case (a run waiting in its step ``wait`` on branch ``main``)."""
