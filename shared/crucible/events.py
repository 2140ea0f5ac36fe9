"""The session log's events.

One JetStream message per commit on ``<ns>.crucible.<session_id>``; its body is a
:class:`SessionCommit` with one or more tagged events. The LSN is the stream
sequence, never in the body. Every time is a field (``at_ms`` epoch ms, ``*_ms``
durations) so the fold never reads a clock; "identical log modulo timestamps"
means equal after dropping those fields (:func:`normalized`).

An iteration's events, in order (each its own commit unless noted)::

    ProposalMade(it)                      the proposer ran; cost counted here
      [ProvisioningBlocked/Cleared]*      proposer or judge unavailable: parked, not discarded
      CandidateDenied                     deny gate refused it before apply
      CandidateApplied(sha)               Proposed → Applied (world commit)
      MeasureStarted, MeasureFinished     Applied → Measured (per measurement)
    IterationClosed(row)                  the decision; keep moves best_score/best_snap

Schema evolution: new fields get defaults, a field never changes type; a breaking
change bumps :data:`SCHEMA_VERSION`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from reel.shared.core.errors import UnknownEventType
from reel.shared.core.run.events import BlobRef
from reel.shared.crucible.config import SessionConfig
from reel.shared.crucible.state import LoopExit, Measurement, Reading, Row

SCHEMA_VERSION = 1

ProposalOutcome = Literal["candidate", "empty", "failed", "escalate", "done", "rescope"]
MeasureTarget = Literal["candidate", "incumbent"]
SegmentReason = Literal["baseline", "rescope"]


class SessionEvent(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of all session events."""


class SessionStarted(SessionEvent, tag="session_started", kw_only=True, frozen=True):
    """The session exists: its frozen config, its world and what no candidate may touch."""

    session_id: str
    config: SessionConfig
    base_sha: str
    world_dir: str
    protected: tuple[str, ...]
    at_ms: int


class SegmentOpened(SessionEvent, tag="segment_opened", kw_only=True, frozen=True):
    """A baseline measurement opened a segment: the fold does ``run.segment = Segment.baseline(...)``.

    Attributes:
        fingerprint_parts: the fingerprint's components (name → sha256), to say what moved later.
        goal_met: the baseline already reaches the regime's goal.
        wall_ms: wall time of the baseline measurement (ms), waits included.
        parked_ms: of which waiting for an unavailable judge (exit 75): parked time (ms).
    """

    regime: str
    reason: SegmentReason
    fingerprint: str
    fingerprint_parts: dict[str, str]
    reading: Reading
    snap: str
    goal_met: bool = False
    wall_ms: int
    parked_ms: int = 0
    at_ms: int


class SessionResumed(SessionEvent, tag="session_resumed", kw_only=True, frozen=True):
    """``resume`` took over: the iteration in flight (if any) is recorded as abandoned."""

    abandoned: Row | None = None
    at_ms: int


class ParkStarted(SessionEvent, tag="park_started", kw_only=True, frozen=True):
    """The park gate holds the loop before iteration ``it`` (reason: the probe's last line)."""

    it: int
    reason: str
    at_ms: int


class ParkEnded(SessionEvent, tag="park_ended", kw_only=True, frozen=True):
    """The park gate released the loop after ``parked_ms`` (excluded from the time budget)."""

    it: int
    parked_ms: int
    at_ms: int


class ProposalMade(SessionEvent, tag="proposal_made", kw_only=True, frozen=True):
    """The proposer ran for iteration ``it``.

    Attributes:
        outcome: ``candidate`` (a non-empty change is staged), ``empty``, ``failed``,
            ``escalate``, ``done`` (nothing more to propose), ``rescope`` (``detail`` = regime).
        paths: world paths the change touches.
        patch: the staged change as a binary git patch in the blob store.
        prompt: a model proposer's prompt in the blob store.
        cost_usd: this call's cost (USD).
        proposer_ms: the proposer's wall time (ms).
        detail: error / escalation reason / target regime, one line.
        proposer_sha: the commit the proposer left HEAD at when it committed itself (kept
            under ``refs/crucible/<session>/proposer/<it>``, its change part of the candidate).
    """

    it: int
    outcome: ProposalOutcome
    note: str = ""
    paths: tuple[str, ...] = ()
    diffstat: str = ""
    patch: BlobRef | None = None
    prompt: BlobRef | None = None
    cost_usd: float = 0.0
    proposer_ms: int = 0
    detail: str = ""
    proposer_sha: str = ""
    at_ms: int


class ProvisioningBlocked(SessionEvent, tag="provisioning_blocked", kw_only=True, frozen=True):
    """A resource (``judge`` or ``proposer``) reported itself unavailable (exit 75): wait, do not discard."""

    it: int
    resource: str
    reason: str
    cost_usd: float = 0.0
    at_ms: int


class ProvisioningCleared(SessionEvent, tag="provisioning_cleared", kw_only=True, frozen=True):
    """The block ended after ``waited_ms`` (counted as parked time)."""

    it: int
    resource: str
    waited_ms: int
    at_ms: int


class CandidateDenied(SessionEvent, tag="candidate_denied", kw_only=True, frozen=True):
    """The deny gate refused the candidate before apply: it touched protected paths."""

    it: int
    paths: tuple[str, ...]
    reason: str
    at_ms: int


class CandidateApplied(SessionEvent, tag="candidate_applied", kw_only=True, frozen=True):
    """Proposed → Applied: the world committed the candidate as ``sha`` (ref ``refs/crucible/<session>/<it>``)."""

    it: int
    sha: str
    at_ms: int


class ApplyFailed(SessionEvent, tag="apply_failed", kw_only=True, frozen=True):
    """The world could not commit the candidate (rolled back)."""

    it: int
    error: str
    at_ms: int


class MeasureStarted(SessionEvent, tag="measure_started", kw_only=True, frozen=True):
    """The judge starts measuring ``target`` of iteration ``it``; its fingerprint was just checked."""

    it: int
    target: MeasureTarget = "candidate"
    fingerprint: str
    at_ms: int


class MeasureFinished(SessionEvent, tag="measured", kw_only=True, frozen=True):
    """Applied → Measured: the judge's reading of ``target`` (valid or invalid). Tag ``measured`` (its wire name).

    A valid reading of the ``incumbent`` corrects the best score (:meth:`Segment.remeasured`);
    the reading's ``cost_usd`` is spent whatever it is.
    """

    it: int
    target: MeasureTarget = "candidate"
    reading: Measurement
    at_ms: int


class FingerprintChanged(SessionEvent, tag="fingerprint_changed", kw_only=True, frozen=True):
    """The judge no longer matches its baseline fingerprint: the run stops (no moved goalposts)."""

    it: int
    expected: str
    actual: str
    changed: tuple[str, ...]
    at_ms: int


class IterationClosed(SessionEvent, tag="iteration_closed", kw_only=True, frozen=True):
    """The iteration's row. A keep moves the segment's best score and snapshot together."""

    row: Row
    at_ms: int


class Escalated(SessionEvent, tag="escalated", kw_only=True, frozen=True):
    """The run needs a human (reported at the break site; the world is already rolled back)."""

    it: int | None = None
    reason: str
    at_ms: int


class SessionEnded(SessionEvent, tag="session_ended", kw_only=True, frozen=True):
    """How the run ended (``STOPPED`` may be resumed; every other exit is final)."""

    exit: LoopExit
    reason: str
    at_ms: int


AnySessionEvent = (
    SessionStarted
    | SegmentOpened
    | SessionResumed
    | ParkStarted
    | ParkEnded
    | ProposalMade
    | ProvisioningBlocked
    | ProvisioningCleared
    | CandidateDenied
    | CandidateApplied
    | ApplyFailed
    | MeasureStarted
    | MeasureFinished
    | FingerprintChanged
    | IterationClosed
    | Escalated
    | SessionEnded
)


class SessionCommit(msgspec.Struct, frozen=True, kw_only=True):
    """One atomic transition of one session: the body of one JetStream message.

    Attributes:
        v: schema version (:data:`SCHEMA_VERSION`).
        commit_id: unique id, also the ``Nats-Msg-Id`` (publish dedup).
        session_id: equals the subject's last token.
        writer: who wrote it (``crucible-cli``, ``crucible-service``…).
        events: applied in order.
    """

    v: int = SCHEMA_VERSION
    commit_id: str
    session_id: str
    writer: str = ""
    events: tuple[AnySessionEvent, ...]


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SessionCommit)
TIME_FIELDS = frozenset({"at_ms", "wall_ms", "judge_ms", "proposer_ms", "parked_ms", "waited_ms", "since_ms"})


def encode_session_commit(commit: SessionCommit) -> bytes:
    """SessionCommit → JSON bytes (the message body)."""
    return _encoder.encode(commit)


def decode_session_commit(data: bytes) -> SessionCommit:
    """JSON bytes → SessionCommit.

    Raises:
        UnknownEventType: an event tag this version does not know, or a newer schema version.
        msgspec.ValidationError / msgspec.DecodeError: any other malformed body.
    """
    try:
        commit = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        if "Invalid value" in str(exc) and "type" in str(exc):
            raise UnknownEventType(f"cannot decode crucible commit: {exc}") from exc
        raise
    if commit.v > SCHEMA_VERSION:
        raise UnknownEventType(f"crucible commit schema v{commit.v} is newer than supported v{SCHEMA_VERSION}")
    return commit


def normalized(events: list[AnySessionEvent], *, drop: frozenset[str] = TIME_FIELDS) -> list[Any]:
    """Events as plain data with every time field removed (for "identical modulo timestamps")."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in drop}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return [strip(e) for e in msgspec.json.decode(_encoder.encode(events))]
