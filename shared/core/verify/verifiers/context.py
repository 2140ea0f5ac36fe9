"""What a verifier gets and answers: :class:`VerifierCtx` in, :class:`VerdictResult` out.

A verifier gets a :class:`VerifierCtx` — the run, the step and attempt it judges,
the frozen :class:`~reel.shared.core.run.views.EpisodeView` built at the snapshot LSN, a lazy
blob handle (nothing is fetched unless the verifier asks) and a deadline — and
answers with a :class:`VerdictResult`; :func:`checked` is how an answer is
validated before it is recorded. Pure: the only I/O is the blob handle's, the
only clock ``time.monotonic`` for the deadline (injectable through ``now``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import IO, Protocol

import msgspec

from reel.shared.core.errors import ReelError
from reel.shared.core.run.events import BlobRef, VerdictStatus
from reel.shared.core.run.ids import LSN, AttemptNo, BranchId, RunId, StepId
from reel.shared.core.run.views import AttemptView, EpisodeView, StepView

MAX_REASON_CHARS = 500


class VerifierInvalid(ReelError):
    """A verifier cannot be built from its spec (bad import path, invalid JSON Schema…)."""

    code = "verifier_invalid"


VERIFIER_READ_MAX_BYTES = 16 * 1024 * 1024
"""The largest output :meth:`VerifierCtx.output` reads whole (bytes); a longer one is streamed
(:meth:`VerifierCtx.output_to`: the ``command`` verifier) or cannot be judged in memory (docs/verifiers.md)."""


class OutputTooLarge(ReelError):
    """The judged output is longer than a verifier may read whole (:data:`VERIFIER_READ_MAX_BYTES`)."""

    code = "output_too_large_to_read"


class BlobReader(Protocol):
    """The read side of :class:`~reel.shared.nats.blobstore.BlobStore`: what a verifier may fetch."""

    async def get(self, ref: BlobRef) -> bytes: ...

    async def get_file(self, ref: BlobRef, into: IO[bytes] | None) -> int: ...


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
    """A ``pass`` answer."""
    return VerdictResult(status="pass", score=score, reason=reason)


def failed(reason: str, score: float = 0.0) -> VerdictResult:
    """A ``fail`` answer."""
    return VerdictResult(status="fail", score=score, reason=reason)


def errored(reason: str) -> VerdictResult:
    """An ``error`` answer: the verifier could not judge."""
    return VerdictResult(status="error", score=0.0, reason=reason)


@dataclass(frozen=True, slots=True)
class VerifierCtx:
    """What one verifier gets.

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

    def output_ref(self) -> BlobRef | None:
        """The judged output's ref (its ``size_bytes`` known without a read), or ``None`` if it has none: the
        judged attempt's success, or of an agent step the agent's output (its final turn's answer)."""
        sv = self.step_view
        if sv.kind == "agent":
            return sv.output_ref if isinstance(sv.output_ref, BlobRef) else None
        a = self.attempt_view
        if a is None or a.status != "succeeded" or a.output_ref is None:
            return None
        return a.output_ref

    async def output(self, max_bytes: int = VERIFIER_READ_MAX_BYTES) -> bytes | None:
        """The judged output's body, whole (one blob read), or ``None`` if it has none (:meth:`output_ref`).

        Raises:
            OutputTooLarge: it is longer than ``max_bytes`` (nothing is read; stream it with :meth:`output_to`).
        """
        ref = self.output_ref()
        if ref is None:
            return None
        if ref.size_bytes > max_bytes:
            raise OutputTooLarge(f"the output of {self.step}#{self.attempt} is {ref.size_bytes} bytes, over the "
                                 f"{max_bytes} a verifier reads whole (a command verifier streams it)")
        return await self.blobs.get(ref)

    async def output_to(self, into: IO[bytes]) -> int | None:
        """Stream the judged output's body into ``into`` chunk by chunk (checked against its sha256, never held
        whole); its size (bytes), or ``None`` if it has none."""
        ref = self.output_ref()
        return None if ref is None else await self.blobs.get_file(ref, into)


def make_ctx(episode: EpisodeView, *, step: str | None, blobs: BlobReader, timeout_s: float,
             now: float | None = None) -> VerifierCtx:
    """The ctx for a verifier judging ``step`` (default: the workflow's last step — an agent step itself, not its
    last turn) of ``episode``.

    Raises:
        KeyError: ``step`` is not a step of the view.
    """
    sv = episode.step(step) if step is not None else next(
        s for s in reversed(episode.steps) if s.parent_step is msgspec.UNSET)
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


def checked(name: str, result: object) -> VerdictResult:
    """``result`` if it is a valid answer of verifier ``name`` (its reason cut to 500 chars), else an ``error``.

    Invalid: not a :class:`VerdictResult`, an unknown status, a score outside 0..1.
    """
    if not isinstance(result, VerdictResult):
        return errored(f"verifier {name} returned {type(result).__name__}, not a VerdictResult")
    if result.status not in ("pass", "fail", "error"):
        return errored(f"verifier {name} returned status {result.status!r}")
    if not 0.0 <= result.score <= 1.0:
        return errored(f"verifier {name} returned score {result.score} outside 0..1")
    return msgspec.structs.replace(result, reason=result.reason[:MAX_REASON_CHARS])
