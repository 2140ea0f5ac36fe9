"""``reel status``: the services and instances answering (NATS micro), their consumers' lag, the executor leases,
JetStream's storage against its limits.

Three reads, none of which changes anything (docs/operations.md "reel status"):

* ``$SRV.STATS`` (scatter-gather, ``--timeout`` seconds; shared/nats/micro.py): every instance of
  this namespace's services, its version, start time, host/pid, and per consumed subject the
  deliveries it handled and refused;
* JetStream consumer info of each service's durable consumer (``<ns>_<service>`` on the commands
  stream): ``num_pending`` (queued, not yet delivered), ``num_ack_pending`` (delivered, in flight),
  ``num_redelivered``, ``num_waiting`` (pull requests of idle instances);
* the executor leases KV bucket: one key per live executor (its id, pid), with whether an
  instance of that id answered discovery;
* ``$JS.API.INFO`` (the account's JetStream usage and limits) and each Reel stream's bytes, with the
  instances whose writes JetStream refuses for a full store (``store_full`` in their STATS metadata).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

import typer
from nats.js.errors import NotFoundError
from rich.table import Table
from rich.text import Text

from reel.services.cli.console import Namespace, NatsUrl, console, run_async
from reel.services.cli.embed import session
from reel.shared.auth.roles import SERVICE_ROLE
from reel.shared.nats.access import redact_url
from reel.shared.nats.infra import Infra
from reel.shared.nats.micro import discover
from reel.shared.runtime.config import Config

SERVICES = tuple(SERVICE_ROLE)
"""Every service whose durable consumer ``reel status`` reports (executor, verifier, … crucible)."""


async def gather(infra: Infra, cfg: Config, *, timeout_s: float = 0.5, expected: int | None = None) -> dict[str, Any]:
    """The status report (the ``--json`` document, to which ``reel status`` adds ``"server": {"url", "origin"}``):
    ``{"namespace", "services": [...], "consumers": [...], "leases": [...], "jetstream": {...}, "timers": [...]}``
    (``timers``: per recovery instance, ``{"instance_id", "sleeping", "next_wake"}`` — the sleeping runs it
    will wake); times in ms, processing times in ms (micro reports ns).

    ``expected``: stop waiting for discovery answers once this many instances answered.
    """
    names = cfg.names
    stats = await discover(infra.nc, "STATS", namespace=names.namespace, timeout_s=timeout_s, expected=expected)
    services = []
    for s in stats:
        meta = s.get("metadata") or {}
        assert isinstance(meta, dict)
        endpoints = s.get("endpoints") or []
        assert isinstance(endpoints, list)
        services.append({
            "service": str(s.get("name", "")).removeprefix("reel-"), "instance_id": s.get("id"),
            "version": s.get("version"), "started": s.get("started"), "host": meta.get("host"),
            "pid": meta.get("pid"),
            "endpoints": [{"name": e.get("name"), "subject": e.get("subject"), "handled": e.get("num_requests", 0),
                           "errors": e.get("num_errors", 0), "last_error": e.get("last_error") or None,
                           "avg_ms": round(int(e.get("average_processing_time", 0)) / 1e6, 3)}
                          for e in endpoints if isinstance(e, dict)]})
    consumers = []
    for service in SERVICES:
        durable = names.consumer(service)
        try:
            info = await infra.js.consumer_info(names.commands_stream, durable)
        except NotFoundError:
            continue
        consumers.append({"service": service, "durable": durable, "stream": names.commands_stream,
                          "num_pending": info.num_pending or 0, "num_ack_pending": info.num_ack_pending or 0,
                          "num_redelivered": info.num_redelivered or 0, "num_waiting": info.num_waiting or 0})
    answering = {str(s["instance_id"]) for s in services}
    full, timers = {}, []
    for s in stats:
        meta = s.get("metadata")
        if isinstance(meta, dict) and meta.get("store_full"):
            full[f"{str(s.get('name', '')).removeprefix('reel-')} {s.get('id')}"] = str(meta["store_full"])
        if isinstance(meta, dict) and "sleeping" in meta:  # a recovery instance: the runs it will wake
            timers.append({"instance_id": s.get("id"), "sleeping": int(meta["sleeping"]),
                           "next_wake": meta.get("next_wake")})
    return {"namespace": names.namespace, "services": services, "consumers": consumers,
            "leases": await _leases(infra, cfg, answering), "jetstream": await _jetstream(infra, cfg, full),
            "timers": timers}


async def _jetstream(infra: Infra, cfg: Config, full: dict[str, str]) -> dict[str, Any]:
    """The account's JetStream usage against its limits (``$JS.API.INFO``), the bytes of each Reel stream, and the
    instances whose writes are being refused for a full store (``full``: instance id → ``store_full: …``).

    ``max_storage_bytes`` -1 means the account has no limit of its own: the server's ``max_file_store``
    (default: the disk's free space) applies, which JetStream does not tell a client.
    """
    out: dict[str, Any] = {"store_full": full}
    if getattr(infra.nc, "js_api_prefix", None):  # the client/viewer role: its own account's $JS.API.INFO is empty
        out["error"] = "the Reel account's usage is not visible to this role (the operator's is)"
        info = None
    else:
        try:
            info = await infra.js.account_info()
        except Exception as exc:  # no answer: the rest of the report stands
            out["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            info = None
    if info is not None:
        out |= {"storage_bytes": info.storage, "memory_bytes": info.memory, "streams": info.streams,
                "max_storage_bytes": info.limits.max_storage if info.limits else -1,
                "max_memory_bytes": info.limits.max_memory if info.limits else -1}
    n = cfg.names
    sizes = {}
    for stream in (n.events_stream, n.commands_stream, n.verdicts_stream, f"OBJ_{n.blob_bucket}",
                   *(f"KV_{b}" for b in (n.lease_bucket, n.outcome_bucket, n.snapshot_bucket))):
        try:
            sizes[stream] = (await infra.js.stream_info(stream)).state.bytes
        except Exception:  # not readable by this role, or gone
            continue
    out["stream_bytes"] = sizes
    return out


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


def jetstream_lines(js: dict[str, Any]) -> list[Text]:
    """The JetStream part of the report: usage against the limits, and each instance refused for a full store."""
    limit = js.get("max_storage_bytes", -1)
    against = (f"of the account's {_mib(limit)}" if isinstance(limit, int) and limit >= 0 else
               "(no account limit: the server's max_file_store applies; JetStream does not tell clients its value)")
    used = f"JetStream storage: {_mib(js.get('storage_bytes'))} used {against}" if "error" not in js else \
        f"JetStream storage: not readable ({js['error']})"
    reel = sum(js.get("stream_bytes", {}).values())
    lines = [Text(f"{used}; Reel's streams and buckets hold {_mib(reel)}")]
    lines += [Text(f"{instance}: {why} — its writes wait until space is freed (docs/operations.md, \"A full store\")",
                   style="red") for instance, why in sorted(js.get("store_full", {}).items())]
    return lines


async def _leases(infra: Infra, cfg: Config, answering: set[str]) -> list[dict[str, Any]]:
    """Each live lease: its key (the executor id), the pid in its body, how long ago it was last put (ms), the
    ``module:function`` tools it serves function objects for (a ``reel.Worker``; ``[]`` for a plain executor),
    and ``waiting_for``: the tools runs it was handed wait for (no live executor could resolve them)."""
    stream, prefix = f"KV_{cfg.names.lease_bucket}", f"$KV.{cfg.names.lease_bucket}."
    info = await infra.js.stream_info(stream, subjects_filter=f"{prefix}>")
    out = []
    now = datetime.now(UTC)
    for subject in sorted(info.state.subjects or {}):
        try:
            msg = await infra.js.get_last_msg(stream, subject)
        except NotFoundError:  # expired meanwhile
            continue
        if not msg.data or (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
            continue  # deleted by a stopping executor
        try:
            body = json.loads(msg.data)
        except ValueError:
            body = {}
        key = subject.removeprefix(prefix)
        tools = body.get("tools") if isinstance(body, dict) else None
        waiting = body.get("waiting_for") if isinstance(body, dict) else None
        out.append({"executor_id": key, "pid": body.get("pid") if isinstance(body, dict) else None,
                    "tools": [str(t) for t in tools] if isinstance(tools, list) else [],
                    "waiting_for": sorted(map(str, waiting)) if isinstance(waiting, dict) else [],
                    "renewed_ms_ago": round((now - msg.time).total_seconds() * 1000) if msg.time else None,
                    "answers_discovery": key in answering})
    return out


def server_line(url: str, origin: str, namespace: str) -> Text:
    """Which server the report is of (``origin``: see :attr:`reel.services.cli.embed.Session.origin`)."""
    how = {"embedded": "an embedded server started for this command only: nothing else runs on it (start "
                       "`reel up`, or pass --nats-url)",
           "reel up": "the `reel up` server on 127.0.0.1:4222"}.get(origin, "from --nats-url / $NATS_URL")
    return Text(f"server {url} ({how}), namespace {namespace!r}")


EMPTY = {
    "services": "no service answers discovery: none is running — start them all with `reel up`, or one with "
                "`reel serve executor|verifier|rewind|cancel|recovery`",
    "consumers": "no service consumer yet: each service creates its durable consumer when it first starts",
    "leases": "no executors running — start one with `reel serve executor` (or `reel up`)",
}
"""What ``reel status`` prints instead of an empty table."""


def render(report: dict[str, Any]) -> list[Table | Text]:
    """The report as rich tables: services, consumers, leases; an empty one as a line saying why (:data:`EMPTY`)."""
    svc = Table(title=f"services of namespace {report['namespace']!r}", title_justify="left")
    for col in ("service", "instance", "version", "host/pid", "subject", "handled", "errors", "avg ms", "last error"):
        svc.add_column(col)
    for s in report["services"]:
        for i, e in enumerate(s["endpoints"] or [{}]):
            first = i == 0
            svc.add_row(s["service"] if first else "", str(s["instance_id"]) if first else "",
                        str(s["version"]) if first else "", f"{s['host']}/{s['pid']}" if first else "",
                        str(e.get("subject", "")), str(e.get("handled", "")), str(e.get("errors", "")),
                        str(e.get("avg_ms", "")), str(e.get("last_error") or ""))
    lag = Table(title="consumers (JetStream)", title_justify="left")
    for col in ("service", "durable", "pending", "ack pending", "redelivered", "waiting pulls"):
        lag.add_column(col)
    for c in report["consumers"]:
        lag.add_row(c["service"], c["durable"], str(c["num_pending"]), str(c["num_ack_pending"]),
                    str(c["num_redelivered"]), str(c["num_waiting"]))
    leases = Table(title="executor leases", title_justify="left")
    for col in ("executor", "pid", "renewed ms ago", "answers discovery", "serves tools", "runs wait for"):
        leases.add_column(col)
    for x in report["leases"]:
        leases.add_row(x["executor_id"], str(x["pid"]), str(x["renewed_ms_ago"] if x["renewed_ms_ago"] is not None
                                                             else "?"), "yes" if x["answers_discovery"] else "no",
                       ", ".join(x.get("tools", [])), ", ".join(x.get("waiting_for", [])))
    out: list[Table | Text] = [t if report[key] else Text(f"{t.title}: {EMPTY[key]}")
                               for key, t in (("services", svc), ("consumers", lag), ("leases", leases))]
    return out + waiting_lines(report["leases"]) + timer_lines(report.get("timers", []))


def timer_lines(timers: list[dict[str, Any]]) -> list[Text]:
    """One line per recovery instance: how many sleeping runs it will wake, and the next wake time and run."""
    return [Text(f"timers (recovery {t['instance_id']}): {t['sleeping']} run{'s' * (t['sleeping'] != 1)} sleeping"
                 + (f", next wake {t['next_wake']}" if t.get("next_wake") else ""), style="blue") for t in timers]


def waiting_lines(leases: list[dict[str, Any]]) -> list[Text]:
    """One red line per ``python:`` tool runs wait for that no live executor serves (start a ``reel.Worker`` with
    it, docs/python.md)."""
    served = {t for x in leases for t in x.get("tools", [])}
    waiting = sorted({t for x in leases for t in x.get("waiting_for", [])} - served)
    return [Text(f"runs wait for a worker serving {t}: no live executor serves it (start a reel.Worker with it, "
                 "docs/python.md)", style="red") for t in waiting]


NO_SERVICE = 3
"""``reel status``'s exit code when no service answers discovery (as ``systemctl status`` of a stopped unit)."""


def status(
    json_out: bool = typer.Option(False, "--json", help="print the report as JSON"),
    timeout: float = typer.Option(0.5, min=0.1, help="seconds to wait for the services' discovery answers"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """List the services and their instances ($SRV.STATS), consumer lag and executor leases.

    The first line names the server read (and whether it is an embedded one started for this
    command only, where nothing else runs); an empty table is a line saying why it is empty.
    Exit code 0 when some service answers discovery, 3 when none does (the report is printed
    either way), so `reel status` serves as a liveness check in scripts.
    """
    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            report = await gather(s.infra, s.cfg, timeout_s=timeout)
            report["server"] = {"url": redact_url(s.cfg.nats_url), "origin": s.origin}
        if json_out:
            sys.stdout.write(json.dumps(report, indent=2) + "\n")
        else:
            console.print(server_line(report["server"]["url"], report["server"]["origin"], report["namespace"]))
            for table in render(report):
                console.print(table)
            for line in jetstream_lines(report["jetstream"]):
                console.print(line)
        return 0 if report["services"] else NO_SERVICE

    run_async(body(), json_out=json_out)
