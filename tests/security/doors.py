"""Every subject a client-account user must not publish on, derived from the role grants (shared/auth/roles.py).

The universe is every publish pattern of every service role's grant, every subject the client account
imports, every command and signal subject of :class:`~reel.shared.core.wire.subjects.Names` and every JetStream
admin verb on every stream of the namespace; each wildcard token is made concrete. Each such subject — as
the Reel-account subject and, for a JetStream API one, under the client's API prefix — that a role's grant
(:func:`~reel.shared.auth.roles.account_grant`) does not let it publish is a door that role must find shut.
:class:`Tap` and :func:`counts` see whether anything got through anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nats.aio.msg import Msg

from reel.shared.auth.roles import (
    API,
    account_grant,
    client_imports,
    client_js_api_prefix,
    grants,
    may_publish,
    streams,
)
from reel.shared.core.wire.subjects import COMMANDS, Names
from reel.shared.crucible.names import CrucibleNames

ADMIN_VERBS = ("STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE", "STREAM.PURGE", "STREAM.SNAPSHOT",
               "STREAM.RESTORE", "STREAM.MSG.DELETE", "STREAM.LEADER.STEPDOWN", "STREAM.PEER.REMOVE",
               "CONSUMER.NAMES", "CONSUMER.LIST", "CONSUMER.DURABLE.CREATE", "STREAM.INFO", "STREAM.MSG.GET")
"""JetStream API verbs on a stream (``$JS.API.<verb>.<stream>``)."""
CONSUMER_VERBS = ("CONSUMER.DELETE", "CONSUMER.INFO", "CONSUMER.MSG.NEXT", "CONSUMER.CREATE",
                  "CONSUMER.DURABLE.CREATE", "CONSUMER.PAUSE", "CONSUMER.LEADER.STEPDOWN")
"""JetStream API verbs on a stream's consumer (``$JS.API.<verb>.<stream>.<consumer>``)."""
if TYPE_CHECKING:
    from tests.security.conftest import Suite

VICTIM = "r-victim"
"""The run id the concrete subjects name."""


def concrete(pattern: str) -> str:
    """``pattern`` with each ``*`` a token and a ``>`` two (``a.*.>`` → ``a.x1.x2.x3``)."""
    out, n = [], 0
    for token in pattern.split("."):
        if token == "*":
            n += 1
            out.append(f"x{n}")
        elif token == ">":
            out += [f"x{n + 1}", f"x{n + 2}"]
            n += 2
        else:
            out.append(token)
    return ".".join(out)


def universe(names: Names) -> list[str]:
    """Every concrete Reel-account subject some role publishes on, or the namespace names (see the module doc)."""
    n, cru = names, CrucibleNames(names)
    patterns: list[str] = []
    for role, grant in grants(names).items():
        if role not in ("client", "viewer", "operator"):  # the client account's are its imports; operator: ">"
            patterns += grant.publish
    patterns += [i.subject for i in client_imports(names)]
    patterns += [n.events(VICTIM), n.verdict(VICTIM), n.verify(VICTIM), n.control(VICTIM), n.control_all,
                 *(n.command(c) for c in COMMANDS), *(n.run_command(VICTIM, c) for c in ("start", "resume")),
                 cru.command("run"), cru.command("resume"), cru.session("s-victim"), n.stream_all,
                 f"$KV.{n.lease_bucket}.x-victim", f"$KV.{n.outcome_bucket}.{VICTIM}.main.work.1",
                 f"$KV.{n.snapshot_bucket}.{VICTIM}", f"{API}.INFO", f"{API}.STREAM.LIST", f"{API}.STREAM.NAMES"]
    for stream in streams(names).values():
        patterns += [f"{API}.{verb}.{stream}" for verb in ADMIN_VERBS]
        patterns += [f"{API}.{verb}.{stream}.{c}" for verb in CONSUMER_VERBS
                     for c in ("mine", n.consumer("executor"), n.consumer("verifier"))]
    return sorted({concrete(p) for p in patterns})


def must_stay_shut(names: Names) -> list[str]:
    """Doors no client-account user may ever find open, whatever a grant says: history, verdicts, triggers,
    signals, the services' commands, leases/outcomes/snapshots, and stream or consumer administration."""
    n, s, api = names, streams(names), f"{client_js_api_prefix(names)}"
    return [n.events(VICTIM), n.verdict(VICTIM), n.verify(VICTIM), n.control(VICTIM), n.command("resume"),
            n.command("recover"), f"$KV.{n.lease_bucket}.x1", f"$KV.{n.outcome_bucket}.{VICTIM}.main.work.1",
            f"$KV.{n.snapshot_bucket}.x1",
            *(f"{api}.{verb}.{x}" for x in s.values()
              for verb in ("STREAM.UPDATE", "STREAM.DELETE", "STREAM.PURGE", "STREAM.MSG.DELETE")),
            *(f"{api}.CONSUMER.DELETE.{x}.{n.consumer(c)}" for x in s.values() for c in ("executor", "verifier"))]


def doors(names: Names, role: str) -> list[str]:
    """The subjects client-account user ``role`` must not publish on, as it would send them: each subject of
    :func:`universe` (a JetStream API one also under the client's API prefix) that its grant
    (:func:`~reel.shared.auth.roles.account_grant`, what ``reel auth init`` writes for it) does not let it publish."""
    grant, prefix = account_grant(names, role), client_js_api_prefix(names)
    out = []
    for subject in universe(names):
        local = [subject, prefix + subject[len(API):]] if subject.startswith(API + ".") else [subject]
        out += [s for s in local if not may_publish(grant, s)]
    return sorted(set(out))


WATCHED = ("events", "verdicts", "outcomes", "snapshots", "blobs", "crucible")
"""The streams whose message counts an attack must not change (leases change as executors renew them; commands
are removed once consumed: :class:`Tap` watches those)."""


class Tap:
    """The operator's core subscriptions on subjects an attack must not reach: what arrived on each."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._subs: list[object] = []

    async def on(self, suite: Suite, *subjects: str) -> Tap:
        """Start watching ``subjects`` (wildcards allowed)."""
        async def seen(msg: Msg) -> None:
            self.seen.append(msg.subject)

        for subject in subjects:
            self._subs.append(await suite.server.operator.nc.subscribe(subject, cb=seen))
        await suite.server.operator.nc.flush()
        return self

    async def close(self, suite: Suite) -> list[str]:
        """Stop watching (after a flush: everything published before has arrived); what arrived."""
        await suite.server.operator.nc.flush()
        for sub in self._subs:
            await sub.unsubscribe()  # type: ignore[attr-defined]
        return self.seen


def writable(suite: Suite) -> list[str]:
    """Every subject pattern of the Reel account whose messages are commands, history or signals."""
    n = suite.server.base.names
    return [n.commands_all, n.events_all, n.verdicts_all, n.control_all, f"$KV.{n.outcome_bucket}.>",
            f"$KV.{n.snapshot_bucket}.>", f"$O.{n.blob_bucket}.>", f"{CrucibleNames(n).sessions_prefix}>"]


async def counts(suite: Suite) -> dict[str, int]:
    """Messages in each watched stream."""
    js, s = suite.server.operator.js, streams(suite.server.base.names)
    return {k: (await js.stream_info(s[k])).state.messages for k in WATCHED}
