"""``reel chaos``'s pure core: the crash points of a run, the state a run ended in, the per-tool report.

Crash points (``REEL_EXECUTOR_CRASH_AT``) name one boundary of one attempt,
``<step_id>:<attempt>:<where>``; an executor whose variable holds that name dies there
(services/executor/attempts.py). ``where`` is one of :data:`WHERES`:

=================  ========================================================================
``before_intent``  the commit carrying the attempt's intent is not sent (nothing of it is stored)
``after_intent``   the intent is committed; the side effect has not started
``after_run``      the side effect (the tool's process, the model call) has ended; nothing of its
                   result is stored yet — the window where at-least-once shows
``after_output``   the output blob and the recovery marker are stored; the outcome commit is not sent
``after_outcome``  the outcome is committed (with whatever intents rode along); nothing after it
=================  ========================================================================

and ``verifying:after_commit``: ``run_verifying`` is committed, the verifier's trigger is not sent.
Plain steps (services/executor/plain.py) and agent turns and tool calls (services/executor/agent.py)
name the same boundaries; several names can be one boundary (a commit carrying an outcome and the
next intents): :func:`crash_points` lists one name per boundary of a reference run's log.

A run's *end state* (:func:`end_state`) is its folded view without what legitimately differs between
runs of one workflow — ids, LSNs, times, executors, the attempts a crash added: run status, each
step's status, error kind, error flag and final output (by sha256), and the verdicts. Fields that
differ between two unkilled runs are nondeterministic (:func:`nondeterministic`) and not compared.

Side effects are counted from the ledger the executors write (shared/proc/ledger.py): one
:class:`SideEffect` per process a command tool started and per call of a Python tool. Pure (no I/O).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Literal

import msgspec

from reel.shared.core.run.events import AnyEvent, AttemptDispatched, AttemptFailed, AttemptSucceeded, RunVerifying
from reel.shared.core.run.views import EpisodeView
from reel.shared.core.workflow.spec import AgentStep, ToolStep, WorkflowSpec

CRASH_ENV = "REEL_EXECUTOR_CRASH_AT"
"""The executor's crash point: ``<step_id>:<attempt>:<where>`` or :data:`VERIFYING_POINT`; the process dies there
(``os._exit(137)``, or a real SIGKILL with :data:`CRASH_SIGNAL_ENV`)."""
CRASH_SIGNAL_ENV = "REEL_EXECUTOR_CRASH_SIGNAL"
"""``KILL``: at its crash point the executor sends itself a real SIGKILL (``reel chaos``), not ``os._exit(137)``."""
Where = Literal["before_intent", "after_intent", "after_run", "after_output", "after_outcome"]
WHERES: tuple[Where, ...] = ("before_intent", "after_intent", "after_run", "after_output", "after_outcome")
VERIFYING_POINT = "verifying:after_commit"
Safety = Literal["retry-safe", "keyed", "no"]
"""How a tool may repeat: declared ``retry_safe``; a Python tool taking ``idempotency_key`` (it can dedupe on the
key, the same for every attempt of a call); neither."""


def point_name(step_id: str, attempt: int, where: Where) -> str:
    """The crash point ``<step_id>:<attempt>:<where>``."""
    return f"{step_id}:{attempt}:{where}"


class CommitPoints(msgspec.Struct, frozen=True, kw_only=True):
    """The crash point names of one commit's boundaries (:func:`commit_points`).

    Attributes:
        before_intent: die before anything of the commit is sent (one name per intent in it).
        after_output: die once its blobs and markers are stored, before it is sent (one per outcome).
        after_commit: die once it is committed (``after_outcome`` per outcome, ``after_intent`` per intent).
    """

    before_intent: tuple[str, ...] = ()
    after_output: tuple[str, ...] = ()
    after_commit: tuple[str, ...] = ()


def commit_points(events: Sequence[AnyEvent]) -> CommitPoints:
    """The crash points of a commit of ``events`` (an executor checks them around the commit)."""
    intents = [e for e in events if isinstance(e, AttemptDispatched)]
    outcomes = [e for e in events if isinstance(e, AttemptSucceeded | AttemptFailed)]
    return CommitPoints(
        before_intent=tuple(point_name(e.step_id, e.attempt, "before_intent") for e in intents),
        after_output=tuple(point_name(e.step_id, e.attempt, "after_output") for e in outcomes),
        after_commit=(*(point_name(e.step_id, e.attempt, "after_outcome") for e in outcomes),
                      *(point_name(e.step_id, e.attempt, "after_intent") for e in intents)))


def crash_points(commits: Iterable[Sequence[AnyEvent]], side_effects: Set[str]) -> tuple[str, ...]:
    """One crash point per intent/outcome boundary of a reference run, in log order.

    Args:
        commits: the events of each commit of an unkilled run of the workflow, in LSN order.
        side_effects: the step ids whose attempts run a tool with a side effect (their ``after_run`` is a
            boundary of its own; a model call's is not listed: nothing is counted there).

    Per commit with intents or outcomes: ``before_intent`` of its first intent, ``after_output`` of its first
    outcome, then one name for the moment after it (``after_outcome`` of its first outcome, else
    ``after_intent`` of its first intent); ``after_run`` before the commit of each side-effect outcome not
    recovered; :data:`VERIFYING_POINT` after ``run_verifying``.
    """
    out: list[str] = []
    for events in commits:
        outcomes = [e for e in events if isinstance(e, AttemptSucceeded | AttemptFailed) and not e.recovered]
        out += [point_name(e.step_id, e.attempt, "after_run") for e in outcomes if e.step_id in side_effects]
        pts = commit_points([e for e in events if not isinstance(e, AttemptSucceeded | AttemptFailed)
                             or not e.recovered])
        out += [*pts.before_intent[:1], *pts.after_output[:1], *pts.after_commit[:1]]
        if any(isinstance(e, RunVerifying) for e in events):
            out.append(VERIFYING_POINT)
    return tuple(dict.fromkeys(out))


# ---- end states --------------------------------------------------------------------------------------------
EndState = Mapping[str, str]
"""A run's end state: field → value (``status``, ``<step>.status``, ``<step>.output``, ``verdict.<name>`` …)."""


def end_state(view: EpisodeView) -> dict[str, str]:
    """The fields of ``view`` two equivalent runs agree on (see module doc); step ids are the workflow's."""
    out = {"status": str(view.status)}
    for s in view.steps:
        out[f"{s.step_id}.status"] = str(s.status)
        final = s.final_attempt
        ref = final.output_ref if final is not None and final.status == "succeeded" else None
        output = s.output_ref if not isinstance(s.output_ref, msgspec.UnsetType) else ref
        out[f"{s.step_id}.output"] = output.sha256 if output is not None else "-"
        if not isinstance(s.is_error, msgspec.UnsetType):
            out[f"{s.step_id}.is_error"] = str(s.is_error)
        kind = s.error_kind if not isinstance(s.error_kind, msgspec.UnsetType) else None
        kind = kind or (final.error_kind if final is not None and final.status == "failed" else None)
        if kind:
            out[f"{s.step_id}.error_kind"] = kind
    for v in view.verdicts:
        out[f"verdict.{v.verifier}"] = str(v.status)
    return out


def nondeterministic(references: Sequence[EndState]) -> frozenset[str]:
    """The fields whose values differ between unkilled runs (or that some of them lack)."""
    keys = {k for r in references for k in r}
    return frozenset(k for k in keys if len({r.get(k) for r in references}) > 1)


def differences(reference: EndState, other: EndState, masked: Set[str] = frozenset()) -> tuple[str, ...]:
    """``field: reference value ≠ other value`` for each field (not ``masked``) that differs, sorted."""
    keys = sorted((set(reference) | set(other)) - set(masked))
    return tuple(f"{k}: {reference.get(k, '∅')} ≠ {other.get(k, '∅')}" for k in keys
                 if reference.get(k) != other.get(k))


# ---- the report --------------------------------------------------------------------------------------------
class Tool(msgspec.Struct, frozen=True, kw_only=True):
    """A tool with a side effect: ``label`` (a plain step's id, an agent tool's name), ``kind``
    (``command``/``python``), ``safety`` (:data:`Safety`), ``agent`` (its agent step; ``""``: a plain step)."""

    label: str
    kind: str
    safety: Safety
    agent: str = ""


def tools_of(spec: WorkflowSpec, keyed: Set[tuple[str, str]] = frozenset()) -> tuple[Tool, ...]:
    """The tools of ``spec`` that have a side effect (``command`` tool steps, agent ``python``/``command``
    tools), in workflow order; ``keyed``: ``(agent step, tool name)`` of Python tools that take
    ``idempotency_key``."""
    out: list[Tool] = []
    for s in spec.steps:
        if isinstance(s, ToolStep) and s.tool.type == "command":
            out.append(Tool(label=s.id, kind="command", safety="retry-safe" if s.tool.retry_safe else "no"))
        elif isinstance(s, AgentStep):
            for t in s.tools:
                if t.type in ("python", "command"):
                    safety: Safety = "retry-safe" if t.retry_safe else "keyed" if (s.id, t.name) in keyed else "no"
                    out.append(Tool(label=t.name, kind=t.type, safety=safety, agent=s.id))
    return tuple(out)


def side_effect_steps(view: EpisodeView, tools: Sequence[Tool]) -> frozenset[str]:
    """The step ids of ``view`` whose attempts run one of ``tools`` (plain tool steps, agent tool calls)."""
    plain = {t.label for t in tools if not t.agent}
    called = {(t.agent, t.label) for t in tools if t.agent}
    return frozenset(s.step_id for s in view.steps if s.step_id in plain or (
        not isinstance(s.parent_step, msgspec.UnsetType) and not isinstance(s.tool_name, msgspec.UnsetType)
        and (s.parent_step, s.tool_name) in called))


class SideEffect(msgspec.Struct, frozen=True, kw_only=True):
    """One start of a tool's side effect, as the executor's ledger recorded it (shared/proc/ledger.py).

    ``kind``: ``process`` (a command's process started, ``pid``) or ``python`` (a Python tool called).
    """

    kind: str
    run_id: str
    branch_id: str = ""
    step_id: str
    attempt: int
    tool: str = ""
    pid: int = 0


def label_of(effect: SideEffect, tools: Sequence[Tool]) -> str | None:
    """The tool ``effect`` belongs to: a plain step by its step id, an agent call by its agent and tool name."""
    agent = effect.step_id.split(":", 1)[0] if ":" in effect.step_id else ""
    for t in tools:
        if (t.agent == "" and t.label == effect.step_id) or (t.agent and t.agent == agent and t.label == effect.tool):
            return t.label
    return None


class ChaosRun(msgspec.Struct, frozen=True, kw_only=True):
    """One run of the workflow: ``point`` (``""``: an unkilled reference run), ``reached`` (the executor died
    there), ``finished`` (the run came to rest within the time allowed), its :func:`end_state`; ``lease_lost``:
    an executor of the run lost its lease without being killed (its heartbeats came late: it killed its tools
    and let the run go — a second kill, not the crash point's)."""

    point: str
    run_id: str
    reached: bool = False
    finished: bool = True
    lease_lost: bool = False
    state: dict[str, str] = msgspec.field(default_factory=dict)


class ToolRow(msgspec.Struct, frozen=True, kw_only=True):
    """One line of the table: side-effect starts in the killed runs, expected (the reference run's × the killed
    runs), the crash points after which a call ran more often than in the reference, the verdict."""

    tool: Tool
    runs: int
    expected: int
    repeated_at: tuple[str, ...]
    ok: bool

    @property
    def verdict(self) -> str:
        """``exactly once``, ``repeated (retry-safe)``/``repeated (keyed)``, or ``RAN TWICE``."""
        if not self.repeated_at:
            return "exactly once"
        return f"repeated ({self.tool.safety})" if self.ok else "RAN TWICE"


class Report(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one ``reel chaos``: per-tool rows, the killed runs whose end state differs from the
    reference (point → differences), points never reached, runs that did not finish, the fields masked, the
    runs (their points; ``""``: a reference) in which an executor lost its lease on its own."""

    rows: tuple[ToolRow, ...]
    differing: dict[str, tuple[str, ...]]
    unreached: tuple[str, ...]
    unfinished: tuple[str, ...]
    masked: frozenset[str]
    killed: int
    lease_lost: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No tool that is neither retry-safe nor keyed ran twice, every killed run ended as the reference did."""
        return all(r.ok for r in self.rows) and not self.differing and not self.unfinished


def _per_call(effects: Iterable[SideEffect]) -> Counter[str]:
    return Counter(e.step_id for e in effects)


def report(tools: Sequence[Tool], references: Sequence[ChaosRun], killed: Sequence[ChaosRun],
           effects: Sequence[SideEffect]) -> Report:
    """Compare the ``killed`` runs with the first of the ``references`` (unkilled runs of the same workflow).

    A call (a step id: a plain step, an agent's tool call) "ran twice" in a killed run when its side effect
    started more often there than in the reference. A point the executor never reached still counts its
    run (it is a run without a crash).

    Raises:
        ValueError: no reference run.
    """
    if not references:
        raise ValueError("no reference run")
    by_run: dict[str, list[SideEffect]] = {}
    for e in effects:
        by_run.setdefault(e.run_id, []).append(e)
    ref = references[0]
    ref_calls = _per_call(by_run.get(ref.run_id, ()))
    masked = nondeterministic([r.state for r in references]) if len(references) > 1 else frozenset()
    rows = []
    for tool in tools:
        mine = [e for e in effects if label_of(e, tools) == tool.label]
        ref_n = sum(1 for e in mine if e.run_id == ref.run_id)
        runs = sum(1 for e in mine if e.run_id in {k.run_id for k in killed})
        repeated = tuple(k.point for k in killed if any(
            n > ref_calls.get(step, 0) for step, n in _per_call(e for e in mine if e.run_id == k.run_id).items()))
        rows.append(ToolRow(tool=tool, runs=runs, expected=ref_n * len(killed), repeated_at=repeated,
                            ok=not repeated or tool.safety != "no"))
    differing = {k.point: d for k in killed if k.finished and (d := differences(ref.state, k.state, masked))}
    return Report(rows=tuple(rows), differing=differing, unreached=tuple(k.point for k in killed if not k.reached),
                  unfinished=tuple(k.point for k in killed if not k.finished), masked=masked, killed=len(killed),
                  lease_lost=tuple(r.point for r in (*references, *killed) if r.lease_lost))
