"""What the Python API returns: one reply type per command, a run's result, its commits, tokens and requests.

All are frozen dataclasses (typed fields, no ``dict`` of per-command keys). Times are epoch milliseconds
(``*_ms``), LSNs are the run's JetStream stream sequences, costs USD, token counts tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from reel.shared.core.run.eventfields import Usage, Verdict
from reel.shared.core.run.events import AnyEvent

RunStatus = Literal["pending", "running", "awaiting_input", "sleeping", "verifying", "completed", "cancelled"]
"""A run's lifecycle: ``pending → running (⇄ awaiting_input, ⇄ sleeping) → verifying → completed``, or
``cancelled``."""

Outcome = Literal["passed", "failed", "error", "succeeded", "unlabelled"]
"""A completed run's outcome: ``passed``/``failed``/``error`` over its verifiers (``failed`` also when a step
failed), ``succeeded`` (no verifier), ``unlabelled`` (a replay without an outcome label)."""


@dataclass(frozen=True, kw_only=True)
class StartReply:
    """The answer to a start: ``created`` is False when the idempotency key's run existed already.

    Attributes:
        run_id: the run; status: its status now; lsn: the LSN of its ``run_created`` (0: it existed).
    """

    run_id: str
    created: bool
    status: str
    lsn: int = 0


@dataclass(frozen=True, kw_only=True)
class CancelReply:
    """The answer to a cancel.

    Attributes:
        cancelled: a ``run_cancelled`` was committed now (at ``lsn``); False: nothing to do (``reason``: it
            had finished, or was cancelled already).
        status: the run's status after it; previous_status: before it (when cancelled now).
    """

    run_id: str
    cancelled: bool
    status: str
    lsn: int = 0
    previous_status: str = ""
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class RewindReply:
    """The answer to a rewind: the branch the run continues on.

    Attributes:
        branch_id: the new branch (or, same idempotency key, the one made before: ``created`` False).
        parent_branch_id, fork_lsn, from_step: where it forked (``from_step``: a rewind at a step).
        lsn: the LSN of the fork's commit.
    """

    run_id: str
    branch_id: str
    created: bool
    status: str
    lsn: int = 0
    parent_branch_id: str | None = None
    fork_lsn: int | None = None
    from_step: str | None = None


@dataclass(frozen=True, kw_only=True)
class RespondReply:
    """The answer to an approve, reject or answer.

    Attributes:
        answered: the answer was committed (at ``lsn``); False: it changed nothing (``reason``: e.g. the run
            was cancelled).
        decision: ``approve``, ``reject`` or ``answer``; status: the run's status after it.
    """

    run_id: str
    request_id: str
    decision: str
    answered: bool
    status: str
    lsn: int = 0
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """Where a run rests: finished (``completed``, ``cancelled``) or waiting for a human (``awaiting_input``).

    Attributes:
        status: see :data:`RunStatus`; outcome: a completed run's (:data:`Outcome`), else ``None``.
        verdicts: each verifier's last verdict (``verifier``, ``status`` pass/fail/error, ``score`` 0–1,
            ``reason``), in the run's order.
        output: the final output text of the last step (an agent's last answer), ``None`` if it has none.
        usage: summed over every attempt, failed ones too (tokens, latency ms, cost USD).
        branch_id: the branch judged (or active); head_lsn: the run's last LSN.
        error: why a run that did not pass did not, in one line — the first failed step's last error
            (``<step> failed: <error_kind>: <message>``), else the first verdict that did not pass
            (``verdict <verifier>: <status>: <reason>``); ``None`` for a run that passed or is not finished.
    """

    run_id: str
    status: RunStatus
    outcome: Outcome | None
    verdicts: tuple[Verdict, ...]
    output: str | None
    usage: Usage
    branch_id: str
    head_lsn: int
    error: str | None = None

    @property
    def passed(self) -> bool:
        """The run completed and passed (or, without verifiers, succeeded)."""
        return self.status == "completed" and self.outcome in ("passed", "succeeded")


@dataclass(frozen=True, kw_only=True)
class CommitEvent:
    """One commit of a run (``RunHandle.events()``): one atomic state transition.

    Attributes:
        lsn: its LSN; writer: who wrote it (an executor id, ``cancel``, ``recovery``…).
        events: its typed events in order (``run_created``, ``attempt_dispatched``, ``attempt_succeeded``…:
            msgspec Structs, discriminated by ``type``; docs/subjects.md lists them).
    """

    lsn: int
    commit_id: str
    writer: str
    events: tuple[AnyEvent, ...]


@dataclass(frozen=True, kw_only=True)
class Token:
    """A fragment of a streamed model attempt (``RunHandle.stream()``; a model with ``stream=True``).

    Attributes:
        step_id, attempt, branch_id: the attempt (``solve:t1``, 1-based).
        text: a fragment of the assistant text; tool_calls: ``(name, arguments fragment)`` pairs.
        done: the attempt's last fragment; error: why its stream ended early, if it did.
        progress: of an MCP tool call's attempt (``solve:t1:c0``): ``(progress, total or None, message)`` as its
            server reported it.
    """

    branch_id: str
    step_id: str
    attempt: int
    text: str
    tool_calls: tuple[tuple[str, str], ...] = ()
    done: bool = False
    error: str = ""
    progress: tuple[float, float | None, str] | None = None


@dataclass(frozen=True, kw_only=True)
class PendingRequest:
    """An open input request of a run waiting for a human.

    Attributes:
        kind: ``approval`` (a tool call to approve or reject) or ``question`` (``ask_user``: answer it).
        step_id, tool, call_id, arguments: the call (``arguments`` as the model sent them, JSON text).
        question: what ``ask_user`` asks; asked: who is asked (free text).
        deadline_ms: when ``default`` is committed unanswered (epoch ms; ``None``: it waits for ever).
    """

    run_id: str
    request_id: str
    kind: str
    step_id: str
    tool: str
    call_id: str
    arguments: str | None
    question: str
    asked: str
    deadline_ms: int | None
    default: str | None
