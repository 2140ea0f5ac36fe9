"""Commands and replies: Reel's public interface on NATS (docs/subjects.md).

A client publishes a JSON command on ``<ns>.cmd.<name>`` (a JetStream stream, so
a command sent while the service is down waits for it) with the header
``Reel-Reply-To: <inbox>``; the service answers on that inbox with a
:class:`Reply`. JSON Schemas of every type here are in docs/schemas/.
"""

from __future__ import annotations

import posixpath
from typing import Any, Literal, TypeVar

import msgspec

from reel.shared.core.errors import InvalidCommand, ReelError
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.forkedits import ContextEdit
from reel.shared.core.run.ids import LSN, BranchId, RunId, StepId
from reel.shared.core.wire import limits
from reel.shared.core.workflow.spec import WorkflowSpec

_T = TypeVar("_T")


class StartRun(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Start a run of a workflow (``<ns>.cmd.start``).

    Attributes:
        workflow: the workflow inline, or
        workflow_ref: a blob already in the blob store (for workflows near the
            1 MiB message limit; ``reel run`` uploads and sends a ref).
        idempotency_key: a repeated start with the same key returns the same run.
        labels: free-form string labels recorded on the run.
        source_dir: the folder of the workflow's file (``reel run FILE`` sends it), recorded on the run: its
            ``python:`` tools are looked up there, in the folders above it up to the project root, then in the
            executor's working folder (docs/workflow.md, "Where python tools are found"). An absolute,
            normalised path (no ``.``/``..`` parts, no trailing ``/``) of at most :data:`MAX_SOURCE_DIR_BYTES`;
            unset (not encoded): the working folder only.

    Raises:
        ValueError: (``InvalidCommand`` through :func:`decode_command`) ``source_dir`` is not such a path.
    """

    workflow: WorkflowSpec | None = None
    workflow_ref: BlobRef | None = None
    idempotency_key: str | None = None
    labels: dict[str, str] = {}
    source_dir: str | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        if isinstance(self.source_dir, str):
            check_source_dir(self.source_dir)


MAX_SOURCE_DIR_BYTES = 4096
"""Bytes of a start's ``source_dir`` (Linux's ``PATH_MAX``)."""


def check_source_dir(path: str) -> str:
    """``path`` if it is an absolute, normalised POSIX folder path of at most :data:`MAX_SOURCE_DIR_BYTES`.

    Raises:
        ValueError: it is relative, has ``.``/``..``/empty parts or a NUL, or is too long (the message says which).
    """
    if len(path.encode(errors="surrogatepass")) > MAX_SOURCE_DIR_BYTES:
        raise ValueError(f"source_dir is longer than {MAX_SOURCE_DIR_BYTES} bytes")
    if "\x00" in path:
        raise ValueError("source_dir holds a NUL character")
    if not posixpath.isabs(path) or posixpath.normpath(path) != path:
        raise ValueError(f"source_dir must be an absolute, normalised folder path (like /home/me/project), "
                         f"got {path[:200]!r}")
    return path


class CancelRun(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Cancel a run (``<ns>.cmd.cancel``); legal from Pending, Running, AwaitingInput, Verifying.

    Attributes:
        reason: why (recorded on the ``run_cancelled``).
        by: who cancels, as the sender names them (free text, recorded on the ``run_cancelled``; unset: not
            encoded, nobody named). The sender's NATS role decides whether it may cancel at all; ``by`` is what
            it says about the person behind it.
    """

    run_id: RunId
    reason: str = ""
    by: str | msgspec.UnsetType = msgspec.UNSET


class RewindRun(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fork a new branch of a run at a step or an LSN (``<ns>.cmd.rewind``).

    Exactly one of ``at_step`` / ``at_lsn``. ``branch`` defaults to the run's active branch. ``by``: who
    rewinds, as the sender names them (free text, recorded on the ``branch_forked``; unset: not encoded).
    ``edits``: a fork — ``at_step`` is an agent turn, re-run with these changes to its context
    (:mod:`reel.shared.core.run.forkedits`; unset: a plain rewind).
    """

    run_id: RunId
    branch: BranchId | None = None
    at_step: StepId | None = None
    at_lsn: LSN | None = None
    idempotency_key: str | None = None
    by: str | msgspec.UnsetType = msgspec.UNSET
    edits: tuple[ContextEdit, ...] | msgspec.UnsetType = msgspec.UNSET


class RespondRun(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Answer one input request of a run (``<ns>.cmd.respond``; docs/mutators.md, "respond").

    Attributes:
        request_id: the request (``reel pending`` lists the open ones).
        decision: ``approve`` or ``reject`` an approval; ``answer`` or ``reject`` a question.
        arguments: ``approve`` only: the arguments the tool runs with instead of the model's (a JSON
            object, validated against the tool's ``parameters``).
        note: ``reject``: what the model is told (its error result).
        text: ``answer``: the answer (the ``ask_user`` call's result).
        by: who answers (recorded with the answer).
    """

    run_id: RunId
    request_id: str
    decision: Literal["approve", "reject", "answer"]
    arguments: dict[str, Any] | None = None
    note: str = ""
    text: str = ""
    by: str = ""


class ResumeRun(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Ask an executor to continue a run (``<ns>.cmd.resume``); sent by rewind and recovery."""

    run_id: RunId


class VerifyRun(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Verify a run resting in Verifying (``<ns>.cmd.verify.<run_id>``); sent by the executor right after
    its ``run_verifying`` commit at ``snapshot_lsn``, and again by recovery for a run resting there
    with no trigger queued."""

    run_id: RunId
    branch_id: BranchId
    snapshot_lsn: LSN


class RecoverRuns(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Ask recovery to scan now (``<ns>.cmd.recover``): one run, or every run with open intents."""

    run_id: RunId | None = None


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Why a command was refused: stable ``code`` and one human line."""

    code: str
    message: str
    retryable: bool = False


class Reply(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Answer to a command, on the ``Reel-Reply-To`` subject.

    Attributes:
        ok: whether the command was accepted.
        run_id: the run concerned.
        status: the run's status after the command.
        created: for start — False when an idempotency key matched an existing run.
        branch_id: for rewind — the new (or existing) branch.
        lsn: the LSN of the commit the command made (0: none).
        error: set when ``ok`` is False.
    """

    ok: bool
    run_id: RunId | None = None
    status: str | None = None
    created: bool | None = None
    branch_id: BranchId | None = None
    lsn: LSN = LSN(0)
    error: ErrorInfo | None = None
    detail: dict[str, Any] = {}


def error_reply(exc: ReelError, run_id: str | None = None) -> Reply:
    """The reply for a refused command."""
    rid = run_id or exc.run_id
    return Reply(ok=False, run_id=None if rid is None else RunId(rid),
                 error=ErrorInfo(code=exc.code, message=exc.message, retryable=exc.retryable))


def decode_command(data: bytes, kind: type[_T]) -> _T:
    """Decode one command body.

    The body's size and nesting are checked before it is decoded (:func:`reel.shared.core.wire.limits.check_json`:
    at most :data:`~reel.shared.core.wire.limits.MAX_COMMAND_BYTES`, arrays and objects at most
    :data:`~reel.shared.core.wire.limits.MAX_DEPTH` deep), so no decoder or later walk over it recurses without bound.

    Raises:
        InvalidCommand: not JSON, wrong field types, unknown fields; the message
            names the field (e.g. ``Expected `str`, got `int` - at `$.run_id```);
            ``nested deeper than 64 (…)``; over the size limit.
    """
    if not data.strip():
        raise InvalidCommand("empty command body (expected a JSON object)")
    limits.check_json(data, what=f"{kind.__name__} body")
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        raise InvalidCommand(f"invalid {kind.__name__}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise InvalidCommand(f"{kind.__name__} is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # the depth check bounds this; kept so no shape of body can crash a handler
        raise InvalidCommand(limits.too_deep(f" (in the {kind.__name__} body)")) from exc


_enc = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    """JSON bytes of a command, reply or verdict."""
    return _enc.encode(obj)
