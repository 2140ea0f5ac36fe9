"""Verifiers: what judges a run resting in ``Verifying`` (seed T4.2; docs/verifiers.md).

A verifier gets a :class:`VerifierCtx` — the run, the step and attempt it judges,
the frozen :class:`~shared.core.views.EpisodeView` built at the snapshot LSN, a lazy
blob handle (nothing is fetched unless the verifier asks) and a deadline — and
answers with a :class:`VerdictResult`. :func:`run_verifier` turns a raise, a
malformed answer or a passed deadline into an ``error`` result, never a hang.

Built-ins (configured per workflow, :class:`~shared.core.workflow.VerifierSpec`):

* ``output_regex`` / ``output_json_schema`` — the judged attempt's output;
* ``command`` — argv with the output on stdin and in ``$REEL_OUTPUT_FILE``; exit 0 passes;
* ``context_requires`` — an item id must be ``packed`` in the judged attempt's
  partition (answered from the partition alone: no blob is read);
* ``recorded_outcome`` — a replayed trajectory's own outcome label;
* ``python`` — ``module:callable`` (a Verifier, or a factory taking the VerifierSpec).

Everything here but the verifiers' own I/O is pure: :func:`derive_outcome` maps
verdict statuses to the run's outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import re
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jsonschema
import msgspec
import structlog

from shared.core.errors import ReelError
from shared.core.events import BlobRef, RunOutcome, VerdictStatus
from shared.core.ids import LSN, AttemptNo, BranchId, RunId, StepId
from shared.core.views import AttemptView, EpisodeView, StepView
from shared.core.workflow import VerifierSpec

log = structlog.get_logger(__name__)

CANCEL_GRACE_S = 1.0
KILL_MARGIN_S = 0.25  # a command verifier is killed this long before its deadline
MAX_REASON_CHARS = 500
OUTPUT_FILE_ENV = "REEL_OUTPUT_FILE"


class VerifierInvalid(ReelError):
    """A verifier cannot be built from its spec (bad import path, invalid JSON Schema…)."""

    code = "verifier_invalid"


class BlobReader(Protocol):
    """The read side of :class:`~shared.nats.blobstore.BlobStore`: what a verifier may fetch."""

    async def get(self, ref: BlobRef) -> bytes: ...


class VerdictResult(msgspec.Struct, frozen=True, kw_only=True):
    """A verifier's answer (the service adds run, branch, snapshot LSN, name, version).

    Attributes:
        status: ``pass``, ``fail``, or ``error`` (the verifier could not judge).
        score: 0.0–1.0.
        reason: one human-readable line.
    """

    status: VerdictStatus
    score: float = 0.0
    reason: str = ""


def passed(reason: str, score: float = 1.0) -> VerdictResult:
    return VerdictResult(status="pass", score=score, reason=reason)


def failed(reason: str, score: float = 0.0) -> VerdictResult:
    return VerdictResult(status="fail", score=score, reason=reason)


def errored(reason: str) -> VerdictResult:
    return VerdictResult(status="error", score=0.0, reason=reason)


@dataclass(frozen=True, slots=True)
class VerifierCtx:
    """What one verifier gets (seed T4.2 ``VerifierCtx``).

    Attributes:
        run: the run id.
        step: the step judged (the spec's ``step``, default the workflow's last step).
        attempt: that step's final attempt (the succeeded one, else the last); ``None``
            when the step never ran (skipped after an earlier failure).
        episode: the frozen view of the judged branch at ``snapshot_lsn``; owned and
            immutable, it never changes while the verifier holds it.
        blobs: a lazy handle: prompt/output bodies are fetched only if asked for.
        deadline: ``time.monotonic()`` seconds by which the verifier must answer.
        snapshot_lsn: the LSN of the ``run_verifying`` commit the view was built at.
    """

    run: RunId
    step: StepId
    attempt: AttemptNo | None
    episode: EpisodeView
    blobs: BlobReader
    deadline: float
    snapshot_lsn: LSN

    @property
    def branch(self) -> BranchId:
        """The judged branch."""
        return self.episode.branch_id

    @property
    def step_view(self) -> StepView:
        """The judged step in the frozen view."""
        return self.episode.step(self.step)

    @property
    def attempt_view(self) -> AttemptView | None:
        """The judged attempt in the frozen view."""
        return next((a for a in self.step_view.attempts if a.attempt == self.attempt), None)

    def remaining_s(self) -> float:
        """Seconds left before :attr:`deadline` (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    async def output(self) -> bytes | None:
        """The judged attempt's output body (one blob read), or ``None`` if it has none."""
        a = self.attempt_view
        if a is None or a.status != "succeeded" or a.output_ref is None:
            return None
        return await self.blobs.get(a.output_ref)


def make_ctx(episode: EpisodeView, *, step: str | None, blobs: BlobReader, timeout_s: float,
             now: float | None = None) -> VerifierCtx:
    """The ctx for a verifier judging ``step`` (default: the last step) of ``episode``.

    Raises:
        KeyError: ``step`` is not a step of the view.
    """
    sv = episode.step(step) if step is not None else episode.steps[-1]
    final = sv.final_attempt
    start = time.monotonic() if now is None else now
    return VerifierCtx(run=episode.run_id, step=sv.step_id, attempt=final.attempt if final else None,
                       episode=episode, blobs=blobs, deadline=start + timeout_s, snapshot_lsn=episode.snapshot_lsn)


class Verifier(Protocol):
    """A verifier: ``name``, ``version`` and an async ``verify``.

    ``verify`` must be cooperative (await, not block the loop): it is cancelled at
    its deadline. Raising is allowed and becomes an ``error`` verdict.
    """

    name: str
    version: str

    async def verify(self, ctx: VerifierCtx) -> VerdictResult: ...


def _no_output(ctx: VerifierCtx) -> VerdictResult:
    a = ctx.attempt_view
    if a is None:
        return failed(f"step {ctx.step} never ran")
    return failed(f"step {ctx.step} has no output (attempt {a.attempt} {a.status})")


class OutputRegex:
    """Passes iff ``pattern`` matches (``re.search``) the judged attempt's output."""

    def __init__(self, spec: VerifierSpec) -> None:
        self.name, self.version = spec.label, spec.version
        try:
            self._re = re.compile(spec.pattern or "")
        except re.error as exc:
            raise VerifierInvalid(f"verifier {spec.label}: invalid regex {spec.pattern!r}: {exc}") from exc

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        body = await ctx.output()
        if body is None:
            return _no_output(ctx)
        m = self._re.search(body.decode("utf-8", errors="replace"))
        if m is None:
            return failed(f"/{self._re.pattern}/ does not match the output of {ctx.step}#{ctx.attempt}")
        return passed(f"/{self._re.pattern}/ matches {m.group(0)[:80]!r} at offset {m.start()}")


class OutputJsonSchema:
    """Passes iff the judged attempt's output is JSON valid against ``json_schema``."""

    def __init__(self, spec: VerifierSpec) -> None:
        self.name, self.version = spec.label, spec.version
        schema = spec.json_schema or {}
        cls = jsonschema.validators.validator_for(schema)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise VerifierInvalid(f"verifier {spec.label}: invalid JSON Schema: {exc.message}") from exc
        self._validator = cls(schema)

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        body = await ctx.output()
        if body is None:
            return _no_output(ctx)
        try:
            doc = json.loads(body)
        except ValueError as exc:
            return failed(f"output of {ctx.step}#{ctx.attempt} is not JSON: {exc}")
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(doc))
        if error is not None:
            where = "$" + "".join(f"[{p!r}]" for p in error.absolute_path)
            return failed(f"schema violation at {where}: {error.message}")
        return passed(f"output of {ctx.step}#{ctx.attempt} matches the schema")


class CommandVerifier:
    """Runs ``argv`` with the output on stdin and in ``$REEL_OUTPUT_FILE``; exit 0 passes.

    The command also gets ``REEL_RUN_ID``, ``REEL_BRANCH_ID``, ``REEL_STEP_ID``,
    ``REEL_ATTEMPT`` and ``REEL_SNAPSHOT_LSN``. It runs in its own process group,
    killed whole at ``timeout_s`` (or the ctx deadline, whichever is first) → ``error``.
    """

    def __init__(self, spec: VerifierSpec) -> None:
        self.name, self.version = spec.label, spec.version
        self._argv, self._timeout_s = spec.argv, spec.timeout_s

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        body = await ctx.output()
        if body is None:
            return _no_output(ctx)
        with tempfile.TemporaryDirectory(prefix="reel-verify-") as tmp:
            path = Path(tmp) / "output"
            path.write_bytes(body)
            env = {**os.environ, OUTPUT_FILE_ENV: str(path), "REEL_RUN_ID": ctx.run, "REEL_BRANCH_ID": ctx.branch,
                   "REEL_STEP_ID": ctx.step, "REEL_ATTEMPT": str(ctx.attempt),
                   "REEL_SNAPSHOT_LSN": str(ctx.snapshot_lsn)}
            # stop a little before the ctx deadline, so the kill is ours and the reason says so
            budget_s = min(self._timeout_s, ctx.remaining_s())
            return await self._run(body, env, budget_s - min(KILL_MARGIN_S, budget_s / 2))

    async def _run(self, stdin: bytes, env: Mapping[str, str], timeout_s: float) -> VerdictResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env=dict(env), start_new_session=True,
            )
        except OSError as exc:
            return errored(f"cannot run {self._argv[0]!r}: {exc.strerror}")
        try:
            out, _ = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
        except TimeoutError:
            return errored(f"{self._argv[0]} did not finish within its {self._timeout_s:g}s timeout (killed)")
        finally:
            if proc.returncode is None:  # timed out or cancelled: kill the whole group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        tail = out.decode("utf-8", errors="replace").strip().splitlines()[-1:] or [""]
        if proc.returncode == 0:
            return passed(f"{self._argv[0]} exited 0" + (f": {tail[0][:200]}" if tail[0] else ""))
        return failed(f"{self._argv[0]} exited {proc.returncode}" + (f": {tail[0][:200]}" if tail[0] else ""))


class ContextRequires:
    """Passes iff ``item`` is ``packed`` in the judged attempt's ContextPartition.

    Answered from the partition inline in the view: it never touches ``ctx.blobs``.
    """

    def __init__(self, spec: VerifierSpec) -> None:
        self.name, self.version = spec.label, spec.version
        self._item = spec.item or ""

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        a = ctx.attempt_view
        if a is None:
            return failed(f"step {ctx.step} never ran")
        p = a.context
        if p is None:
            return errored(f"step {ctx.step} is a {ctx.step_view.kind} step: it has no context partition")
        where = f"{ctx.step}#{a.attempt}"
        if self._item in p.packed:
            return passed(f"{self._item} packed in {where} (position {p.packed.index(self._item) + 1}/{len(p.packed)})")
        if self._item in p.available:
            return failed(f"{self._item} was available but not packed in {where} (token budget)")
        if self._item in p.dropped:
            return failed(f"{self._item} was dropped by policy in {where}")
        return failed(f"{self._item} was not a candidate of {where}")


class RecordedOutcome:
    """For replayed trajectories: passes iff the recording's own label says the agent succeeded.

    ``expect`` is the label as a boolean (set by the trajectory loader); ``label``
    (built from the workflow's ``source``: outcome, reward, the file it came from)
    is quoted in the reason.
    """

    def __init__(self, spec: VerifierSpec, label: str | None = None) -> None:
        self.name, self.version = spec.label, spec.version
        self._expect = bool(spec.expect)
        self._label = label if label is not None else ("success" if self._expect else "failure")

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        if self._expect:
            return passed(f"the recording's outcome label is {self._label!r}: the agent succeeded")
        return failed(f"the recording's outcome label is {self._label!r}: the agent did not succeed")


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


def _outcome_label(source: Mapping[str, Any]) -> str | None:
    """The recording's own outcome label as the trajectory loader put it in ``source``.

    E.g. ``outcome=false from django-10999.report.json`` or ``outcome=true reward=1.0``.
    """
    if source.get("outcome") is None:
        return None
    parts = [f"outcome={json.dumps(source['outcome'])}"]
    if source.get("reward") is not None:
        parts.append(f"reward={source['reward']}")
    if source.get("outcome_from"):
        parts.append(f"from {Path(str(source['outcome_from'])).name}")
    return " ".join(parts)


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
            return RecordedOutcome(spec, _outcome_label(source or {}))
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
    """
    task = asyncio.ensure_future(verifier.verify(ctx))
    try:
        done, _ = await asyncio.wait({task}, timeout=ctx.remaining_s())
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
    return _checked(verifier.name, task.result())


def _discard_result(task: asyncio.Future[VerdictResult]) -> None:
    """Retrieve an abandoned verify task's outcome so asyncio does not warn about it."""
    if not task.cancelled():
        task.exception()


def _checked(name: str, result: object) -> VerdictResult:
    if not isinstance(result, VerdictResult):
        return errored(f"verifier {name} returned {type(result).__name__}, not a VerdictResult")
    if result.status not in ("pass", "fail", "error"):
        return errored(f"verifier {name} returned status {result.status!r}")
    if not 0.0 <= result.score <= 1.0:
        return errored(f"verifier {name} returned score {result.score} outside 0..1")
    return msgspec.structs.replace(result, reason=result.reason[:MAX_REASON_CHARS])


def derive_outcome(*, step_failed: bool, statuses: Sequence[VerdictStatus]) -> RunOutcome:
    """The run's outcome from its branch and the verdicts for one snapshot (pure).

    A step failed after its last attempt → ``failed``; else no verifier →
    ``succeeded``; all pass → ``passed``; any fail → ``failed``; else (some
    error, no fail) → ``error``.
    """
    if step_failed:
        return "failed"
    if not statuses:
        return "succeeded"
    if all(s == "pass" for s in statuses):
        return "passed"
    if any(s == "fail" for s in statuses):
        return "failed"
    return "error"
