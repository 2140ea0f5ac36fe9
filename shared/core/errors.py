"""Reel's exception hierarchy: one base, subclasses shaped by how callers react.

Every error carries a stable ``code`` (sent on reply subjects as ``error.code``)
and ``retryable`` (whether the same request may succeed later unchanged).
"""

from __future__ import annotations


class ReelError(Exception):
    """Base of every error Reel raises on purpose.

    Attributes:
        code: stable machine-readable code, e.g. ``"concurrency_conflict"``.
        retryable: True if retrying the same operation later may succeed.
        run_id: the run concerned, when there is one.
    """

    code = "reel_error"
    retryable = False

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.run_id = run_id


class ConcurrencyConflict(ReelError):
    """Another writer committed to the run since we last read it (JetStream 10071/10164).

    Callers re-read the run (re-fold) and retry or yield; they never overwrite.
    """

    code = "concurrency_conflict"
    retryable = True

    def __init__(self, message: str, *, run_id: str | None = None, expected_lsn: int = 0) -> None:
        super().__init__(message, run_id=run_id)
        self.expected_lsn = expected_lsn


class LeaseLost(ReelError):
    """This executor's lease was not renewed in time (a freeze, a lost connection, a full store): it may no
    longer hold its runs. It writes nothing more — no commit, no outcome marker — and stops as this
    incarnation; its tools were killed first. Another executor (or this process under a new executor id)
    takes the runs over once the lease has expired on the server."""

    code = "lease_lost"
    retryable = True


class RunNotFound(ReelError):
    """No run with this id exists in the event log."""

    code = "run_not_found"


class InvalidCommand(ReelError):
    """A command payload could not be decoded or failed validation."""

    code = "invalid_command"


class IdempotencyConflict(ReelError):
    """An idempotency key reused with another workflow: the key's run was started from a workflow whose
    encoded body has another sha256 (Stripe-style keys: one key, one request). The existing run is untouched;
    retrying the same start can never succeed, so not retryable.

    Attributes:
        key: the reused idempotency key.
        existing_workflow, new_workflow: the workflow names of the key's run and of the refused start.
    """

    code = "idempotency_conflict"

    def __init__(self, message: str, *, run_id: str | None = None, key: str = "", existing_workflow: str = "",
                 new_workflow: str = "") -> None:
        super().__init__(message, run_id=run_id)
        self.key = key
        self.existing_workflow = existing_workflow
        self.new_workflow = new_workflow


class InvalidTransition(ReelError):
    """The command is not legal in the run's current state (e.g. cancel of a Completed run)."""

    code = "invalid_transition"


class WorkflowInvalid(ReelError):
    """A workflow spec failed validation; the message names the offending field."""

    code = "workflow_invalid"


class TrajectoryFormatError(ReelError):
    """A trajectory file is unreadable or of a format Reel does not know."""

    code = "trajectory_format"


class BlobMissing(ReelError):
    """A blob ref points at an object the blob store does not hold."""

    code = "blob_missing"


class BlobCorrupt(BlobMissing):
    """The object a blob ref names does not hold that body (it hashes to something else, or is
    not a readable object): written under the wrong sha256 by someone else, or overwritten."""

    code = "blob_corrupt"


class BlobTimeout(ReelError, TimeoutError):
    """A blob store read did not finish within its timeout."""

    code = "blob_timeout"
    retryable = True


class UnknownEventType(ReelError):
    """A commit holds an event type this version of Reel cannot decode (never skipped silently)."""

    code = "unknown_event_type"


class ModelError(ReelError):
    """A model adapter failed to produce an output for an attempt.

    Attributes:
        kind: error kind recorded on the failed attempt (e.g. ``rate_limited``).
        cost_usd: what the failed call was billed (USD); budgets count failed calls too.
        retry_after_s: the provider's ``Retry-After`` (s): the earliest the next attempt should go, or None.
        body: the whole body behind the error (a server's error response, exactly as received, the API key
            scrubbed), stored as the failed attempt's ``error_ref``; None when there is none.
        body_media_type: the body's MIME type (the response's ``Content-Type``).
        input_tokens, output_tokens, usage_source: usage the failed call reported (``reported``), e.g. an
            empty answer's; by default none (``none``, 0 tokens: nothing was reported, so nothing is counted).
    """

    code = "model_error"
    retryable = True

    def __init__(self, message: str, *, kind: str = "model_error", retryable: bool = True,
                 cost_usd: float = 0.0, retry_after_s: float | None = None, body: bytes | None = None,
                 body_media_type: str = "application/json", input_tokens: int = 0, output_tokens: int = 0,
                 usage_source: str = "none") -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
        self.cost_usd = cost_usd
        self.retry_after_s = retry_after_s
        self.body = body
        self.body_media_type = body_media_type
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.usage_source = usage_source


class ToolCallInvalid(ReelError):
    """A model's tool call cannot be run as given (arguments not a JSON object, …).

    The agent loop hands this back to the model as an error observation; it never ends the run.

    Attributes:
        call_id: the tool call's id; name: the tool it named.
    """

    code = "tool_call_invalid"

    def __init__(self, message: str, *, call_id: str = "", name: str = "") -> None:
        super().__init__(message)
        self.call_id = call_id
        self.name = name


class ToolError(ReelError):
    """A tool step failed (non-zero exit, timeout, bad output)."""

    code = "tool_error"
    retryable = True

    def __init__(self, message: str, *, kind: str = "tool_error", retryable: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
