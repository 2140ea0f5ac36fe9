"""The errors the Python API raises: every one a :class:`ReelError` carrying ``code`` (stable, machine-readable)
and ``retryable`` (whether the same call may succeed later unchanged).

A command a service refuses comes back as an error reply (``code``, ``message``, ``retryable``); it is
raised as the class of that code when Reel has one (``run_not_found`` → :class:`RunNotFound`), else as
:class:`CommandRefused` with the reply's code.
"""

from __future__ import annotations

from reel.shared.core.errors import (
    IdempotencyConflict,
    InvalidCommand,
    InvalidTransition,
    ReelError,
    RunNotFound,
    WorkflowInvalid,
)
from reel.shared.core.input.respond import RequestAnswered, RequestNotFound
from reel.shared.core.mutators.forking import InvalidEdit
from reel.shared.core.mutators.rewind import LsnNotInLineage, StepNotFound
from reel.shared.core.wire.commands import ErrorInfo
from reel.shared.nats.client import CommandTimeout


class CommandRefused(ReelError):
    """A service refused a command with a code this version of the API has no class for (``code`` is the
    reply's)."""

    code = "command_refused"

    def __init__(self, message: str, *, code: str, retryable: bool, run_id: str | None = None) -> None:
        super().__init__(message, run_id=run_id)
        self.code, self.retryable = code, retryable


class RunTimeout(ReelError, TimeoutError):
    """The run did not reach the awaited state in time (it goes on; wait again or ``cancel()`` it)."""

    code = "run_timeout"
    retryable = True


class ServiceUnavailable(ReelError):
    """No Reel server or service answers at the URL (start ``reel up``, or use ``reel.local()``)."""

    code = "unavailable"
    retryable = True


_BY_CODE: dict[str, type[ReelError]] = {c.code: c for c in (
    RunNotFound, InvalidCommand, InvalidTransition, WorkflowInvalid, IdempotencyConflict, RequestNotFound,
    RequestAnswered, StepNotFound, LsnNotInLineage, InvalidEdit)}


def refused(error: ErrorInfo | None, run_id: str | None = None) -> ReelError:
    """The exception of an error reply (see the module doc); a reply without ``error`` is a plain refusal."""
    if error is None:
        return CommandRefused("the command was refused (no reason given)", code="refused", retryable=False,
                              run_id=run_id)
    cls = _BY_CODE.get(error.code)
    if cls is None:
        return CommandRefused(error.message, code=error.code, retryable=error.retryable, run_id=run_id)
    exc = cls(error.message, run_id=run_id)
    exc.retryable = error.retryable
    return exc


__all__ = ["CommandRefused", "CommandTimeout", "IdempotencyConflict", "InvalidCommand", "InvalidTransition",
           "LsnNotInLineage", "ReelError", "RequestAnswered", "RequestNotFound", "RunNotFound", "RunTimeout",
           "ServiceUnavailable", "StepNotFound", "WorkflowInvalid", "refused"]
