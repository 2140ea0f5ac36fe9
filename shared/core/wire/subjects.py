"""Every subject, stream, bucket and consumer name Reel uses, in one place.

All names hang off one *namespace* (default ``reel``), so several Reel
deployments — or test modules — can share one NATS server without seeing each
other. With the default namespace:

=====================  ==========================  =================================
what                   subject / name              notes
=====================  ==========================  =================================
run events             ``reel.ev.<run_id>``        stream ``REEL_EVENTS``; LSN = seq
start a run            ``reel.cmd.start``          stream ``REEL_CMDS`` (work queue)
cancel a run           ``reel.cmd.cancel``         ″
rewind a run           ``reel.cmd.rewind``         ″
answer an input        ``reel.cmd.respond``        ″ (the cancel service, docs/mutators.md)
resume a run           ``reel.cmd.resume``         ″ (rewind/recovery → executor)
start/resume, keyed    ``reel.cmd.run.<run>.<cmd>`` ″ with ``REEL_PARTITIONS`` N ≥ 1: stored as
                       ``reel.cmd.part.<p>.<run>.<cmd>``, ``p = partition(N, run)`` (the stream's
                       subject transform), one durable ``reel_executor_p<p>`` per partition
scan for lost intents  ``reel.cmd.recover``        ″ (recovery)
verify a run           ``reel.cmd.verify.<run_id>`` ″ (executor/recovery → verifier)
verdicts               ``reel.verdict.<run_id>``   stream ``REEL_VERDICTS``
run control            ``reel.ctl.<run_id>``       core NATS, not stored: "the run was cancelled at LSN n"
streamed tokens        ``reel.stream.<run_id>.``   core NATS, not stored: one attempt's deltas
                       ``<branch>.<step>.<attempt>`` (``:`` of a turn's step id is a legal token)
blobs                  object store ``reel_blobs`` content-addressed (sha256)
executor leases        KV ``reel_leases``          per-message TTL heartbeats
stored outcomes        KV ``reel_outcomes``        ``<run>.<branch>.<step>.<attempt>`` (``:`` → ``=``)
run snapshots          KV ``reel_snapshots``       key ``<run>``: latest snapshot (shared/nats/snapshots.py)
=====================  ==========================  =================================

Replies: a command carries the subject to answer on in the ``Reel-Reply-To``
header (JetStream itself answers the publish with its PubAck), see docs/subjects.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from reel.shared.core.run.stepids import kv_safe

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def is_token(value: str) -> bool:
    """True if ``value`` can be one token of Reel's subjects (a run id, a workflow's step id, a crucible
    session id: letters, digits, ``_``, ``-``; 1–128 characters): never a wildcard (``*``, ``>``) nor a dot."""
    return bool(_TOKEN.match(value))


REPLY_TO_HEADER = "Reel-Reply-To"
MSG_ID_HEADER = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQ_HEADER = "Nats-Expected-Last-Subject-Sequence"

COMMANDS = ("start", "cancel", "rewind", "resume", "recover", "respond")
RUN_COMMANDS = ("start", "resume")
"""Commands that may be published keyed by run id (``<ns>.cmd.run.<run_id>.<cmd>``) and so partitioned."""


@dataclass(frozen=True)
class Names:
    """Subjects and JetStream object names under one namespace (a NATS token).

    ``partitions``: N command partitions of the executors (``REEL_PARTITIONS``; 0: none, every
    executor shares one durable). With N ≥ 1 the commands stream maps ``<ns>.cmd.run.<run>.<cmd>`` to
    ``<ns>.cmd.part.<p>.<run>.<cmd>`` with ``p = {{partition(N,1)}}`` of the run id (FNV-1a, the server's
    subject transform; :func:`partition_of` computes the same). Source: NATS docs, "Subject mapping and
    partitioning"; docs/architecture.md, "Executor partitions".
    """

    namespace: str = "reel"
    partitions: int = 0

    @property
    def _up(self) -> str:
        return self.namespace.upper().replace("-", "_")

    # streams
    @property
    def events_stream(self) -> str:
        return f"{self._up}_EVENTS"

    @property
    def commands_stream(self) -> str:
        return f"{self._up}_CMDS"

    @property
    def verdicts_stream(self) -> str:
        return f"{self._up}_VERDICTS"

    # buckets
    @property
    def blob_bucket(self) -> str:
        return f"{self.namespace}_blobs"

    @property
    def lease_bucket(self) -> str:
        return f"{self.namespace}_leases"

    @property
    def outcome_bucket(self) -> str:
        return f"{self.namespace}_outcomes"

    @property
    def snapshot_bucket(self) -> str:
        return f"{self.namespace}_snapshots"

    @property
    def pin_bucket(self) -> str:
        """Pinned runs (key = run id): retention never drops them (docs/operations.md, "Retention and archives")."""
        return f"{self.namespace}_pins"

    # subjects
    def events(self, run_id: str) -> str:
        """The subject of one run's commits."""
        return f"{self.namespace}.ev.{run_id}"

    @property
    def events_all(self) -> str:
        return f"{self.namespace}.ev.>"

    def command(self, name: str) -> str:
        """Command subject, ``name`` one of :data:`COMMANDS`."""
        return f"{self.namespace}.cmd.{name}"

    @property
    def commands_all(self) -> str:
        return f"{self.namespace}.cmd.>"

    def run_command(self, run_id: str, name: str) -> str:
        """The keyed subject of a start/resume (``name`` in :data:`RUN_COMMANDS`) of ``run_id`` (a token;
        ``*`` for a permission): what a client publishes when the namespace is partitioned."""
        return f"{self.namespace}.cmd.run.{run_id}.{name}"

    def partition(self, p: int) -> str:
        """Every stored keyed command of partition ``p`` (a consumer's filter)."""
        return f"{self.namespace}.cmd.part.{p}.>"

    def partition_transform(self) -> tuple[str, str]:
        """The commands stream's subject transform (source, destination) for :attr:`partitions` ≥ 1."""
        return (f"{self.namespace}.cmd.run.*.*",
                f"{self.namespace}.cmd.part.{{{{partition({self.partitions},1)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}")

    def keyed_command(self, subject: str) -> tuple[int, str, str] | None:
        """``(partition, run_id, command)`` of a stored keyed command subject, else ``None``."""
        t = subject.split(".")
        if len(t) == 6 and t[0] == self.namespace and t[1:3] == ["cmd", "part"] and t[3].isdigit() \
                and t[5] in RUN_COMMANDS:
            return int(t[3]), t[4], t[5]
        return None

    def partition_consumer(self, p: int) -> str:
        """The service suffix of partition ``p``'s durable (``<ns>_executor_p<p>``)."""
        return f"executor_p{p}"

    def verdict(self, run_id: str) -> str:
        """The subject verdicts about ``run_id`` are published on."""
        return f"{self.namespace}.verdict.{run_id}"

    @property
    def verdicts_all(self) -> str:
        return f"{self.namespace}.verdict.>"

    def verify(self, run_id: str) -> str:
        """The verification trigger of one run: one ``VerifyRun`` per ``run_verifying`` commit (commands stream)."""
        return f"{self.namespace}.cmd.verify.{run_id}"

    @property
    def verify_all(self) -> str:
        return f"{self.namespace}.cmd.verify.*"

    def consumer_gate(self, stream: str) -> str:
        """Where a client's ``CONSUMER.CREATE.<stream>`` request arrives in the Reel account: the consumer gate
        (shared/nats/consumergate.py) vets it and forwards it to JetStream (docs/security.md)."""
        return f"{self.namespace}.gate.consumer.{stream}"

    @property
    def consumer_gate_all(self) -> str:
        return f"{self.namespace}.gate.consumer.*"

    def control(self, run_id: str) -> str:
        """Core-NATS subject of signals to the executor driving ``run_id``
        (:class:`~reel.shared.core.wire.livemessages.RunControl`)."""
        return f"{self.namespace}.ctl.{run_id}"

    @property
    def control_all(self) -> str:
        return f"{self.namespace}.ctl.*"

    def stream(self, run_id: str, branch_id: str, step_id: str, attempt: int) -> str:
        """The core-NATS subject of one model attempt's streamed deltas
        (:class:`~reel.shared.core.wire.livemessages.StreamChunk`).

        A turn's step id (``solve:t1``) is one token: ``:`` is legal in a NATS subject token.
        """
        return f"{self.namespace}.stream.{run_id}.{branch_id}.{step_id}.{attempt}"

    def stream_run(self, run_id: str) -> str:
        """Every attempt's deltas of one run (a wildcard to subscribe to)."""
        return f"{self.namespace}.stream.{run_id}.>"

    @property
    def stream_all(self) -> str:
        return f"{self.namespace}.stream.>"

    def outcome_marker(self, key: str) -> str:
        """The KV subject of one outcome marker (``key`` from :func:`outcome_key`)."""
        return f"$KV.{self.outcome_bucket}.{key}"

    def consumer(self, service: str) -> str:
        """Durable consumer name of a service."""
        return f"{self.namespace}_{service}"


def partition_of(run_id: str, partitions: int) -> int:
    """The partition the server's ``{{partition(N,1)}}`` maps ``run_id`` to: FNV-1a 32 of the token, mod N."""
    h = 0x811C9DC5
    for b in run_id.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def verify_msg_id(run_id: str, snapshot_lsn: int) -> str:
    """``Nats-Msg-Id`` of a verification trigger: one per (run, ``run_verifying`` LSN), so a re-trigger
    within the duplicate window is dropped by the server."""
    return f"verify:{run_id}:{snapshot_lsn}"


def outcome_key(run_id: str, branch_id: str, step_id: str, attempt: int) -> str:
    """The outcomes-KV key the executor writes before committing a success, and recovery reads.

    An agent's turn or call id (``solve:t1:c0``) is written with ``=`` for ``:``
    (:func:`reel.shared.core.run.stepids.kv_safe`): KV keys do not allow ``:``.
    """
    return f"{run_id}.{branch_id}.{kv_safe(step_id)}.{attempt}"


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` one token, ``>`` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)
