"""Durable timers' pure core: when a sleeping run is due, what wakes it, and what a woken step does next.

A run sleeps for two reasons (:data:`~reel.shared.core.run.events.TimerReason`):

* a ``kind: sleep`` step (``for_s`` / ``until``): the executor commits ``run_sleeping`` with the wake
  time it computed (``for_s`` from its clock as it reaches the step, ``until`` as written); once woken it
  records the step's one attempt — intent and success in one commit, its output ``{"wake_ms", "woke_ms",
  "late_ms"}``;
* a tool's result that asks to be run again later (``reel.resume_after(seconds)`` from a Python tool, a
  command's stdout ``{"reel": {"resume_after_s": N}}``): the attempt is recorded ``attempt_failed`` with
  error kind ``resume_after`` and ``resume_at_ms`` (not a try of the step), and ``run_sleeping`` rides the
  same commit; once woken the step (or agent call) gets a new attempt.

While it sleeps the run rests (``sleeping``: :data:`~reel.shared.core.run.state.RESTING`, ``LIVE``): no
executor drives it and no process holds it; the wake time is in the log. The waker is recovery's sweep
(services/recovery): :func:`wake_events` is a pure decision over the folded state and the time it read,
committed fenced on the head, so a timer fires once, and a cancel or a rewind committed first makes it
not due (a cancelled run stays cancelled; a rewound one runs on its new branch, where a sleep step sleeps
again — ``for_s`` counted from the rewind, ``until`` the same time). No clock, I/O or randomness here.
"""

from __future__ import annotations

import msgspec

from reel.shared.core.decision import Decision, Skip, events_or_skip
from reel.shared.core.errors import ToolError
from reel.shared.core.input import respond
from reel.shared.core.run.events import AnyEvent, AttemptEnd, AttemptFailed, RunWoke, TimerReason
from reel.shared.core.run.ids import AttemptNo, BranchId, StepId
from reel.shared.core.run.state import (
    LIVE,
    RESUME_AFTER,
    SLEEPING,
    AttemptState,
    AttemptStatus,
    BranchState,
    RunState,
    RunStatus,
    Timer,
)

RESUME_AFTER_KEY = "resume_after_s"
"""The key of a command tool's stdout that asks to be resumed: ``{"reel": {"resume_after_s": N}}``
(docs/workflow.md)."""
MAX_RESUME_AFTER_S = 366 * 24 * 3600.0
"""The longest wait a tool may ask for (seconds)."""


class Sleep(msgspec.Struct, frozen=True):
    """Commit ``run_sleeping`` for ``step_id`` on ``branch_id``: a sleep step's timer (``wake_ms`` ``None``: the
    executor computes it from the step's ``for_s`` / ``until`` and its clock), or a ``resume_after`` attempt's
    (``wake_ms``: the time it asked for — a tool step's, or the earliest of an agent turn's waiting calls) when
    nothing else of the branch can run. A wake time already past is committed with its ``run_woke`` at once."""

    branch_id: BranchId
    step_id: StepId
    reason: TimerReason
    wake_ms: int | None = None


class FinishSleep(msgspec.Struct, frozen=True):
    """The sleep step's timer fired: commit attempt ``attempt`` of ``step_id`` — its intent and its success (the
    step's output, :func:`sleep_output`) in one commit."""

    branch_id: BranchId
    step_id: StepId
    attempt: AttemptNo
    wake_ms: int
    woke_ms: int


def timer_of(branch: BranchState) -> Timer | None:
    """The branch's latest timer, if it ever slept."""
    return None if isinstance(branch.timer, msgspec.UnsetType) else branch.timer


def sleeping_timer(status: RunStatus, active: BranchState) -> Timer | None:
    """The timer a run of ``status`` waits on when it is ``sleeping`` (``active``: its active branch), else ``None``."""
    return timer_of(active) if status == SLEEPING else None


def next_wake(status: RunStatus, active: BranchState) -> int | None:
    """When a run of ``status`` is due if it sleeps (epoch ms; ``active``: its active branch), else ``None``."""
    timer = sleeping_timer(status, active)
    return timer.wake_ms if timer is not None else None


def wake_events(state: RunState, now_ms: int) -> Decision:
    """``(run_woke,)`` if ``state`` sleeps and its timer is due at ``now_ms`` (epoch ms), else a Skip (why)."""
    timer = sleeping_timer(state.status, state.active)
    if timer is None:
        return Skip(f"the run is {state.status}, not sleeping")
    if timer.wake_ms > now_ms:
        return Skip(f"the timer of {timer.step_id} is due in {timer.wake_ms - now_ms} ms")
    return (RunWoke(branch_id=state.active_branch, step_id=timer.step_id, at_ms=now_ms),)


def next_due(status: RunStatus, active: BranchState) -> int | None:
    """The earliest time recovery must look at a run again (epoch ms), from its ``status`` and its active branch
    ``active``: its wake time (``sleeping``) or the earliest deadline of an open input request (a live run),
    whichever comes first; ``None``: neither."""
    deadline = respond.earliest_deadline(active) if status in LIVE else None
    times = [t for t in (next_wake(status, active), deadline) if t is not None]
    return min(times) if times else None


def due_events(state: RunState, now_ms: int) -> Decision:
    """Everything due at ``now_ms`` in one commit: the default answer of each input request past its deadline
    (:func:`reel.shared.core.input.respond.deadline_events`), then the timer's ``run_woke``; else a Skip."""
    out: list[AnyEvent] = []
    for decided in (respond.deadline_events(state, now_ms), wake_events(state, now_ms)):
        if not isinstance(decided, Skip):
            out.extend(decided)
    return events_or_skip(out, "nothing due")


def waits(attempt: AttemptState) -> bool:
    """True when ``attempt`` ended asking to be resumed later (error kind ``resume_after``)."""
    return attempt.status == AttemptStatus.FAILED and attempt.error_kind == RESUME_AFTER


def asks_resume(outcome: AttemptEnd | None) -> bool:
    """True when ``outcome`` (about to be committed) is a ``resume_after`` one."""
    return isinstance(outcome, AttemptFailed) and outcome.error_kind == RESUME_AFTER


def resumable(branch: BranchState, attempt: AttemptState) -> bool:
    """True when the ``resume_after`` ``attempt`` of ``branch`` may run again: a timer of the branch woke after
    its outcome, at or after the time it asked for (a fork inherits the attempt but not the timer: it sleeps
    again until that time, at once if it passed)."""
    timer, at = timer_of(branch), attempt.resume_at_ms
    if timer is None or timer.woke_lsn is None or timer.woke_ms is None or attempt.outcome_lsn is None:
        return False
    return timer.woke_lsn > attempt.outcome_lsn and (isinstance(at, msgspec.UnsetType) or timer.woke_ms >= at)


def resume_at(attempt: AttemptState) -> int:
    """When a ``resume_after`` attempt asked to run again (epoch ms; its outcome's time when unrecorded)."""
    at = attempt.resume_at_ms
    return at if isinstance(at, int) else (attempt.finished_ms or 0)


def woke_for(branch: BranchState, step_id: str) -> Timer | None:
    """The timer of the sleep step ``step_id`` on ``branch`` once it fired, else ``None``."""
    timer = timer_of(branch)
    if timer is None or timer.step_id != step_id or timer.reason != "sleep" or timer.woke_lsn is None:
        return None
    return timer


def sleep_output(wake_ms: int, woke_ms: int) -> bytes:
    """A sleep step's output (JSON, epoch ms): when it was due, when it woke, how late."""
    return msgspec.json.encode({"wake_ms": wake_ms, "woke_ms": woke_ms, "late_ms": max(0, woke_ms - wake_ms)})


def resume_request(text: str) -> tuple[float, str] | None:
    """``(seconds, reason)`` when a command tool's whole stdout (``text``, stripped) is the JSON object
    ``{"reel": {"resume_after_s": N, "reason": "…"}}`` (``reason`` optional), else ``None``.

    Raises:
        ValueError: it is that shape but ``N`` is not a number in ``[0, MAX_RESUME_AFTER_S]``.
    """
    body = text.strip()
    if not (body.startswith("{") and RESUME_AFTER_KEY in body and len(body) < 4096):
        return None
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    inner = doc.get("reel") if isinstance(doc, dict) and set(doc) == {"reel"} else None
    if not isinstance(inner, dict) or RESUME_AFTER_KEY not in inner:
        return None
    seconds, reason = inner[RESUME_AFTER_KEY], inner.get("reason", "")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= MAX_RESUME_AFTER_S:
        raise ValueError(f"`reel.{RESUME_AFTER_KEY}` must be a number of seconds in [0, {MAX_RESUME_AFTER_S:.0f}],"
                         f" not {seconds!r}")
    return float(seconds), reason if isinstance(reason, str) else str(reason)


class ResumeAfter(msgspec.Struct, frozen=True, kw_only=True):
    """What a Python tool returns to be run again later (``reel.resume_after``): seconds (≥ 0), reason (free text)."""

    seconds: float
    reason: str = ""


class ResumeRequested(ToolError):
    """A tool's result asked to be run again in ``seconds`` (``reason`` says why): the attempt is recorded
    ``resume_after`` (error kind :data:`~reel.shared.core.run.state.RESUME_AFTER`, not a try of the call)."""

    def __init__(self, seconds: float, reason: str = "") -> None:
        super().__init__(resume_message(seconds, reason), kind=RESUME_AFTER, retryable=True)
        self.seconds, self.reason = seconds, reason


def check_resume(value: ResumeAfter) -> ResumeRequested:
    """The :class:`ResumeRequested` of a Python tool's :class:`ResumeAfter`.

    Raises:
        ToolError: ``invalid_resume`` (not retryable): ``seconds`` is not a number in [0, MAX_RESUME_AFTER_S].
    """
    s = value.seconds
    if isinstance(s, bool) or not isinstance(s, int | float) or not 0 <= s <= MAX_RESUME_AFTER_S:
        raise ToolError(f"reel.resume_after takes seconds in [0, {MAX_RESUME_AFTER_S:.0f}], not {s!r}",
                        kind="invalid_resume", retryable=False)
    return ResumeRequested(float(s), value.reason)


def resume_message(seconds: float, reason: str) -> str:
    """The ``attempt_failed`` message of a ``resume_after`` attempt."""
    return f"the tool asked to be run again in {seconds:g} s" + (f": {reason}" if reason else "")
