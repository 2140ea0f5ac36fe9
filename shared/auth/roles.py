"""Reel's NATS roles and the subjects each may publish and subscribe (docs/security.md).

Pure: every subject comes from :class:`reel.shared.core.wire.subjects.Names` (and crucible's
names), so a new subject gets a permission here or no role may use it.

Two NATS accounts per namespace (``<NS>`` and ``<NS>_CLIENTS``):

* the **Reel account** holds the JetStream data and the service roles — ``executor``,
  ``verifier``, ``mutators`` (rewind, cancel, recovery), ``crucible``, ``retention`` (reads every stream,
  purges runs and blobs: the only service role that may purge) and ``operator`` (everything) — each with an
  allow-list of subjects (:func:`grants`);
* the **client account** holds ``client`` and ``viewer`` (``client``'s reads without its command
  subjects and blob writes: ``reel ui``, dashboards). It has no JetStream of its own: it reaches
  the Reel account only through the service imports of :func:`client_imports` (its
  command subjects, reads, its own ephemeral consumers — through the consumer gate, which admits
  only ack-none ones delivering to the client's inbox: shared/core/wire/consumerrules.py — and blob writes) and receives
  replies through one stream import of ``_INBOX.>`` (and streamed tokens through one of
  ``<ns>.stream.>``: :func:`client_streams`). Every reply to a client's request
  is delivered in the client account, so a reply subject a client picks (``reel.ev.<run>``)
  can never land in a Reel stream — within one account it would: a JetStream answer
  (a PubAck, a Direct Get of bytes the client stored) published on it is stored there.

JetStream API subjects (``$JS.API.…``) reach the Reel account under the client
account's prefix :func:`client_js_api_prefix` (``JS.<NS>.API.…``), because the
server answers ``$JS.API.…`` of an account without JetStream itself. Direct Get is
imported under both names (Reel's event-log reads use ``$JS.API.DIRECT.GET``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from reel.shared.core.wire.subjects import Names, subject_matches
from reel.shared.crucible.names import CrucibleNames

ROLES = ("client", "viewer", "executor", "verifier", "mutators", "crucible", "retention", "operator")
"""Every role of ``reel auth init``, in the order of docs/security.md's matrix."""

CLIENT_ROLES = ("client", "viewer")
"""The roles of the client account (they share its imports; :func:`account_grant`)."""

SERVICE_ROLE = {"executor": "executor", "verifier": "verifier", "rewind": "mutators", "cancel": "mutators",
                "recovery": "mutators", "crucible": "crucible", "retention": "retention"}
"""The role each service connects as."""

CLIENT_COMMANDS = ("start", "cancel", "rewind", "respond", "crucible.run", "crucible.resume")
"""Command subjects (``<ns>.cmd.<name>``) a client may publish; ``resume``, ``verify.<run>`` and ``recover``
are not among them."""

API = "$JS.API"
SRV = "$SRV"
MAPPED_REPLIES = "_R_.>"
"""Reply subjects nats-server maps a request arriving through a service import to (a client-account requester)."""
RESPONSES = "(reply of a request it received)"
"""The matrix's row for NATS ``allow_responses`` (one answer per request, within 10 s: ``$SRV`` answers)."""
"""The NATS micro discovery prefix (``$SRV.PING|INFO|STATS[.<name>[.<id>]]``, NATS ADR-32)."""


@dataclass(frozen=True)
class Grant:
    """A NATS user's permissions: subjects it may publish and subscribe (allow-lists), publishes denied within them."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()
    responses: bool = False  # may answer once each request it receives (NATS allow_responses), wherever it came from


@dataclass(frozen=True)
class Import:
    """One service the client account imports: ``subject`` of the Reel account, reached as ``local``.

    ``response`` is ``stream`` for requests answered by several messages (batched Direct Get).
    """

    subject: str
    local: str
    response: str = "singleton"


def accounts(names: Names) -> tuple[str, str]:
    """The (Reel, client) account names of ``names``' namespace: ``REEL``, ``REEL_CLIENTS``."""
    up = names.events_stream.removesuffix("_EVENTS")
    return up, f"{up}_CLIENTS"


def client_js_api_prefix(names: Names) -> str:
    """The JetStream API prefix of a client connection (``JS.REEL.API``)."""
    return f"JS.{accounts(names)[0]}.API"


def inbox_prefix(role: str) -> str:
    """The inbox prefix a role's connections use: ``_INBOX`` for clients (any NATS library's default),
    ``_INBOX_<role>`` for the others, so no service's replies travel on the inboxes clients receive."""
    return "_INBOX" if role in CLIENT_ROLES else f"_INBOX_{role}"


def streams(names: Names) -> dict[str, str]:
    """Every stream of the namespace by what it holds (``events``, ``commands``, …, ``crucible``)."""
    n = names
    return {"events": n.events_stream, "commands": n.commands_stream, "verdicts": n.verdicts_stream,
            "blobs": f"OBJ_{n.blob_bucket}", "leases": f"KV_{n.lease_bucket}",
            "outcomes": f"KV_{n.outcome_bucket}", "snapshots": f"KV_{n.snapshot_bucket}",
            "crucible": CrucibleNames(n).stream}


def _read(stream: str, api: str = API) -> list[str]:
    return [f"{api}.STREAM.INFO.{stream}", f"{api}.DIRECT.GET.{stream}", f"{api}.DIRECT.GET.{stream}.>",
            f"{api}.STREAM.MSG.GET.{stream}"]


def _ordered(stream: str) -> list[str]:
    """An ordered (ephemeral, unnamed) consumer of nats-py, and its flow-control replies."""
    return [f"{API}.CONSUMER.CREATE.{stream}", f"$JS.FC.{stream}.>"]


def _durable(stream: str, durable: str) -> list[str]:
    """Create, inspect, pull from and ack one durable consumer — nothing else of the stream's consumers."""
    c = f"{API}.CONSUMER"
    return [f"{c}.DURABLE.CREATE.{stream}.{durable}", f"{c}.CREATE.{stream}.{durable}",
            f"{c}.CREATE.{stream}.{durable}.>", f"{c}.INFO.{stream}.{durable}",
            f"{c}.MSG.NEXT.{stream}.{durable}", f"$JS.ACK.{stream}.{durable}.>"]


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def grants(names: Names) -> dict[str, Grant]:
    """Each role's permissions (``client``'s are those of its account; see the module doc)."""
    n, s = names, streams(names)
    cru = CrucibleNames(names)
    blobs = n.blob_bucket
    setup = [f"{API}.INFO", f"{API}.STREAM.NAMES", *(f"{API}.STREAM.INFO.{x}" for x in s.values()),
             *(f"{API}.STREAM.CREATE.{x}" for x in s.values())]  # create what is missing, never update or delete
    blob_read = [*_read(s["blobs"]), *_ordered(s["blobs"])]
    blob_write = [f"$O.{blobs}.C.*", f"$O.{blobs}.M.*"]  # never purge: a purge's filter is in its body, unseen
    replies = ["_INBOX.>", f"{inbox_prefix('operator')}.>"]  # answers on a command's Reel-Reply-To, and to $SRV

    def service(role: str, publish: Iterable[str], subscribe: Iterable[str] = ()) -> Grant:
        micro = [x for svc, r in SERVICE_ROLE.items() if r == role for x in discovery(svc)]
        # $SRV answers go to the requester's inbox (``replies``) or, for a client-account requester, to the
        # reply the service import maps it to (``_R_.>``). Not NATS allow_responses: with it, nats-server 2.15
        # dropped JetStream API answers to several service connections starting at once (ensure_infra timed out).
        return Grant(publish=_unique([*setup, *publish, MAPPED_REPLIES]),
                     subscribe=(f"{inbox_prefix(role)}.>", *subscribe, *micro))

    out = {
        "client": client_grant(names),
        "viewer": account_grant(names, "viewer"),
        "executor": service("executor", [
            *_durable(s["commands"], n.consumer("executor")), f"{n.namespace}.ev.*", n.verify_all,
            *(x for p in range(n.partitions) for x in _durable(s["commands"], n.consumer(n.partition_consumer(p)))),
            *_read(s["events"]),
            *blob_read, *blob_write, *_read(s["snapshots"]), *_read(s["leases"]),
            f"$KV.{n.lease_bucket}.*", f"$KV.{n.outcome_bucket}.>", f"$KV.{n.snapshot_bucket}.*", n.stream_all,
            *replies], [n.control_all]),  # streamed tokens out; the cancel service's signals in (core NATS)
        "verifier": service("verifier", [
            *_durable(s["commands"], n.consumer("verifier")), f"{n.namespace}.ev.*", f"{n.namespace}.verdict.*",
            f"{API}.CONSUMER.DELETE.{s['events']}.{n.consumer('verifier')}",  # its durable of old, dropped at start
            *_read(s["events"]), *_read(s["verdicts"]), *blob_read, *_read(s["snapshots"])]),
        "mutators": service("mutators", [
            *(x for svc in ("rewind", "cancel", "recovery") for x in _durable(s["commands"], n.consumer(svc))),
            f"{n.namespace}.ev.*", n.command("resume"), *([n.run_command("*", "resume")] if n.partitions else []),
            n.verify_all, n.control_all, *_read(s["events"]),
            *_ordered(s["events"]), f"{API}.CONSUMER.CREATE.{s['verdicts']}",  # and the consumer gate's forwards
            f"{API}.STREAM.MSG.GET.{s['commands']}",  # recovery: is a verification trigger queued?
            *blob_read, *_read(s["snapshots"]), *_read(s["leases"]), *_read(s["outcomes"]),
            f"$KV.{n.outcome_bucket}.>",  # recovery claims a lost attempt's marker key before recording it lost
            *replies], [n.consumer_gate_all]),  # clients' consumer-create requests (shared/nats/consumergate.py)
        "crucible": service("crucible", [
            *_durable(s["commands"], n.consumer(cru.consumer_service)), f"{cru.sessions_prefix}*",
            *_read(s["crucible"]), *blob_read, *blob_write, *replies]),
        "retention": service("retention", [  # drops runs and collects blobs (shared/nats/retention.py)
            *(x for k in ("events", "crucible", "snapshots", "outcomes") for x in (*_read(s[k]), *_ordered(s[k]))),
            *blob_read, f"$O.{blobs}.M.*",  # a blob's delete marker, fenced on the record judged
            f"{API}.STREAM.INFO.KV_{n.pin_bucket}",  # the pinned runs: its subjects
            *(f"{API}.STREAM.PURGE.{x}" for x in (s["events"], s["verdicts"], s["blobs"], s["snapshots"],
                                                  s["outcomes"], f"KV_{n.pin_bucket}"))]),
        "operator": Grant(publish=(">",), subscribe=(">",)),
    }
    return out


def discovery(service: str) -> list[str]:
    """The ``$SRV`` subjects service ``service`` answers as NATS micro service ``reel-<service>``
    (shared/nats/micro.py): every verb to all services, to its name, to its instance."""
    return [f"{SRV}.*", f"{SRV}.*.reel-{service}", f"{SRV}.*.reel-{service}.*"]


def client_imports(names: Names) -> list[Import]:
    """The services the client account imports from the Reel account (see the module doc)."""
    n, s, p = names, streams(names), client_js_api_prefix(names)
    out = [Import(n.command(c), n.command(c)) for c in CLIENT_COMMANDS]
    if n.partitions >= 1:  # a keyed start (executor partitions: services/executor/partitions.py)
        out.append(Import(n.run_command("*", "start"), n.run_command("*", "start")))
    readable = [s["events"], s["verdicts"], s["snapshots"], s["blobs"], s["crucible"]]
    for x in readable:
        for direct in (API, p):
            out.append(Import(f"{API}.DIRECT.GET.{x}", f"{direct}.DIRECT.GET.{x}", "stream"))
            out.append(Import(f"{API}.DIRECT.GET.{x}.>", f"{direct}.DIRECT.GET.{x}.>"))
        out.append(Import(f"{API}.STREAM.MSG.GET.{x}", f"{p}.STREAM.MSG.GET.{x}"))
    out += [Import(f"{API}.STREAM.INFO.{x}", f"{p}.STREAM.INFO.{x}") for x in s.values()]
    out.append(Import(f"{API}.STREAM.NAMES", f"{p}.STREAM.NAMES"))
    for x in (s["events"], s["verdicts"], s["blobs"]):  # its own ephemeral consumers (ordered reads), vetted
        out += [Import(n.consumer_gate(x), f"{p}.CONSUMER.CREATE.{x}"), Import(f"$JS.FC.{x}.>", f"$JS.FC.{x}.>")]
    out += [Import(f"$O.{n.blob_bucket}.C.*", f"$O.{n.blob_bucket}.C.*"),  # workflow refs (sha256 checked on read)
            Import(f"$O.{n.blob_bucket}.M.*", f"$O.{n.blob_bucket}.M.*")]
    out.append(Import(f"{SRV}.>", f"{SRV}.>", "stream"))  # discovery (`reel status`): one answer per instance
    for svc in SERVICE_ROLE:  # `reel status`: each service's consumer lag, the executor leases (read only)
        info = f"CONSUMER.INFO.{s['commands']}.{n.consumer(svc)}"
        out.append(Import(f"{API}.{info}", f"{p}.{info}"))
    out.append(Import(f"{API}.STREAM.MSG.GET.{s['leases']}", f"{p}.STREAM.MSG.GET.{s['leases']}"))
    return out


def viewer_imports(names: Names) -> list[Import]:
    """The imports a ``viewer`` may use: :func:`client_imports` without command subjects and blob writes."""
    writes = (names.commands_all.removesuffix(">"), f"$O.{names.blob_bucket}.")
    return [i for i in client_imports(names) if not i.subject.startswith(writes)]


def account_grant(names: Names, role: str) -> Grant:
    """A client-account user (``client`` or ``viewer``): its imports only; replies on ``_INBOX.>``.

    Denied outright (whatever an import allows): a named or durable consumer — ``CONSUMER.CREATE.<stream>.>``
    and ``CONSUMER.DURABLE.CREATE.>`` under its JetStream API prefix; a client creates consumers only on
    ``CONSUMER.CREATE.<stream>`` itself, which the consumer gate vets.
    """
    p = client_js_api_prefix(names)
    imports = client_imports(names) if role == "client" else viewer_imports(names)
    deny = (f"{p}.CONSUMER.CREATE.*.>", f"{p}.CONSUMER.DURABLE.CREATE.>")
    return Grant(publish=_unique(i.local for i in imports), subscribe=client_streams(names), deny_publish=deny)


def client_grant(names: Names) -> Grant:
    """The client user (:func:`account_grant`)."""
    return account_grant(names, "client")


def client_reply_stream() -> str:
    """The stream the Reel account exports to the client account: replies to client inboxes."""
    return "_INBOX.>"


def client_streams(names: Names) -> tuple[str, ...]:
    """Every stream the Reel account exports to the client account: replies, and streamed tokens (core NATS)."""
    return client_reply_stream(), names.stream_all


def may_publish(grant: Grant, subject: str) -> bool:
    """True if ``grant`` lets its user publish on ``subject`` (a deny wins over an allow)."""
    return any(subject_matches(p, subject) for p in grant.publish) and \
        not any(subject_matches(d, subject) for d in grant.deny_publish)


def matrix(names: Names) -> list[tuple[str, dict[str, str]]]:
    """Role × subject pattern: ``[(pattern, {role: "pub" | "sub" | "pub, sub" | "deny"})]`` in the Reel
    account's subjects (a client's imports by the subject they reach; the operator: every subject)."""
    g = grants(names)
    rows: dict[str, dict[str, set[str]]] = {}

    def mark(pattern: str, role: str, what: str) -> None:
        rows.setdefault(pattern, {}).setdefault(role, set()).add(what)

    for role, grant in g.items():
        if role in (*CLIENT_ROLES, "operator"):
            continue
        for p in grant.publish:
            mark(p, role, "pub")
        for p in grant.subscribe:
            mark(p, role, "sub")
        if grant.responses:
            mark(RESPONSES, role, "pub")
    p = client_js_api_prefix(names)
    for role in CLIENT_ROLES:
        for i in client_imports(names):
            if account_user_may_publish(names, role, i.subject):
                mark(i.subject, role, "pub")
        for d in g[role].deny_publish:
            mark(API + d[len(p):], role, "deny")
        for stream in client_streams(names):
            mark(stream, role, "sub")
    mark(">", "operator", "pub")
    mark(">", "operator", "sub")
    order = ["pub", "sub", "deny"]
    return [(pattern, {r: ", ".join(w for w in order if w in roles[r]) for r in ROLES if r in roles})
            for pattern, roles in rows.items()]


def render_matrix(names: Names) -> str:
    """:func:`matrix` as a Markdown table (docs/security.md holds it for the default namespace)."""
    lines = ["| subject pattern | " + " | ".join(ROLES) + " |", "|---|" + "---|" * len(ROLES)]
    for pattern, cells in matrix(names):
        lines.append(f"| `{pattern}` | " + " | ".join(cells.get(r, "") for r in ROLES) + " |")
    return "\n".join(lines) + "\n"


def client_may_publish(names: Names, subject: str) -> bool:
    """True if a client reaches the Reel-account ``subject`` through an import its user may publish on."""
    return account_user_may_publish(names, "client", subject)


def account_user_may_publish(names: Names, role: str, subject: str) -> bool:
    """True if client-account user ``role`` reaches the Reel-account ``subject`` through an import it may
    publish on (an import's local subject: the same, or under the client's JetStream API prefix)."""
    grant, prefix = account_grant(names, role), client_js_api_prefix(names)
    for i in client_imports(names):
        if subject_matches(i.subject, subject):
            if i.local == i.subject:
                local = subject
            elif i.subject.startswith(API):
                local = prefix + subject[len(API):]
            else:
                local = i.local  # a literal mapping (the consumer gate)
            if may_publish(grant, local):
                return True
    return False
