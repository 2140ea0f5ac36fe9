"""Verifiers at work: built from their spec, run under their deadline (docs/verifiers.md).

:func:`make_verifier` builds what a :class:`~reel.shared.core.workflow.spec.VerifierSpec`
configures — a built-in (:mod:`reel.shared.core.verify.verifiers.builtin`), the ``command``
verifier (:mod:`reel.shared.proc.verifier`) or a ``python`` one loaded by import path
(``module:callable``: a Verifier, or a factory taking the VerifierSpec).
:func:`run_verifier` turns a raise, a malformed answer or a passed deadline into
an ``error`` result, never a hang. Outside the core: it imports user code and
runs asyncio tasks; the types and the pure verifiers are :mod:`reel.shared.core.verify.verifiers`.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Mapping
from typing import Any

import msgspec
import structlog

from reel.shared.auth import secrets
from reel.shared.core.verify.verifiers.builtin import (
    ContextRequires,
    OutputJsonSchema,
    OutputRegex,
    RecordedOutcome,
    outcome_label,
)
from reel.shared.core.verify.verifiers.context import (
    MAX_REASON_CHARS,
    VerdictResult,
    Verifier,
    VerifierCtx,
    VerifierInvalid,
    checked,
    errored,
)
from reel.shared.core.workflow.spec import VerifierSpec
from reel.shared.proc.verifier import CommandVerifier

log = structlog.get_logger(__name__)

CANCEL_GRACE_S = 1.0
# A verifier that enforces the deadline itself (the command verifier kills its process group at it)
# gets this long past the deadline to report its own reason before the guard cancels it (s).
REPORT_SLACK_S = 0.5


def _import_path(spec: VerifierSpec) -> Verifier:
    path = spec.path or ""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise VerifierInvalid(f"verifier {spec.label}: path {path!r} must be 'module:callable'")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise VerifierInvalid(f"verifier {spec.label}: cannot import {path!r}: {exc}") from exc
    try:
        impl = target(spec) if isinstance(target, type) or not hasattr(target, "verify") else target
    except Exception as exc:
        raise VerifierInvalid(f"verifier {spec.label}: {path}(spec) raised {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(impl, "verify", None)):
        raise VerifierInvalid(f"verifier {spec.label}: {path!r} gave {type(impl).__name__}, not a Verifier")
    return _Named(spec, impl)


class _Named:
    """A custom verifier under its configured name (its own version if it has one)."""

    def __init__(self, spec: VerifierSpec, impl: Any) -> None:
        self.name = spec.label
        self.version = str(getattr(impl, "version", spec.version))
        self._impl = impl

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        result: VerdictResult = await self._impl.verify(ctx)
        return result


def make_verifier(spec: VerifierSpec, *, source: Mapping[str, Any] | None = None) -> Verifier:
    """Build the verifier a spec configures.

    Args:
        source: the workflow's ``source`` (replayed trajectories); its outcome
            label is quoted by ``recorded_outcome``.

    Raises:
        VerifierInvalid: bad regex, JSON Schema or import path.
    """
    match spec.type:
        case "output_regex":
            return OutputRegex(spec)
        case "output_json_schema":
            return OutputJsonSchema(spec)
        case "command":
            return CommandVerifier(spec)
        case "context_requires":
            return ContextRequires(spec)
        case "recorded_outcome":
            return RecordedOutcome(spec, outcome_label(source or {}))
        case "python":
            return _import_path(spec)
    raise VerifierInvalid(f"unknown verifier type {spec.type!r}")


async def run_verifier(
    verifier: Verifier, ctx: VerifierCtx, *, cancel_grace_s: float = CANCEL_GRACE_S
) -> VerdictResult:
    """Run ``verifier.verify(ctx)`` until ``ctx.deadline``; never raises, never hangs.

    A raise, a result that is not a valid :class:`VerdictResult` (score outside
    0..1) or a passed deadline gives an ``error`` result. At the deadline the
    verify task is cancelled and given ``cancel_grace_s`` to unwind; one that
    swallows the cancellation is abandoned (and logged), not awaited forever.
    The guard fires :data:`REPORT_SLACK_S` after the deadline, so a verifier that
    stops itself at the deadline (a command killed at its timeout) reports its own
    reason rather than racing the guard. The reason is scrubbed of this process's secrets
    (:func:`reel.shared.auth.secrets.scrub`): a python verifier runs in-process and could quote them.
    """
    result = await _judged(verifier, ctx, cancel_grace_s)
    reason = secrets.scrub(result.reason)
    return result if reason == result.reason else msgspec.structs.replace(result, reason=reason)


async def _judged(verifier: Verifier, ctx: VerifierCtx, cancel_grace_s: float) -> VerdictResult:
    task = asyncio.ensure_future(verifier.verify(ctx))
    try:
        done, _ = await asyncio.wait({task}, timeout=ctx.remaining_s() + REPORT_SLACK_S)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.add_done_callback(_discard_result)
        task.cancel()
        _, pending = await asyncio.wait({task}, timeout=cancel_grace_s)
        if pending:
            log.warning("verifier.ignores_cancel", verifier=verifier.name, run_id=ctx.run)
        return errored(f"verifier {verifier.name} passed its deadline")
    if task.cancelled():
        return errored(f"verifier {verifier.name} was cancelled")
    exc = task.exception()
    if exc is not None:
        return errored(f"verifier {verifier.name} raised {type(exc).__name__}: {exc}"[:MAX_REASON_CHARS])
    return checked(verifier.name, task.result())


def _discard_result(task: asyncio.Future[VerdictResult]) -> None:
    """Retrieve an abandoned verify task's outcome so asyncio does not warn about it."""
    if not task.cancelled():
        task.exception()
