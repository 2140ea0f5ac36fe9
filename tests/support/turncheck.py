"""Every agent turn of a log, rebuilt in full and incrementally, compared (shared/core/agent/memo.py).

:func:`check_turns` folds a log commit by commit. At each commit carrying a turn's intent
(``attempt_dispatched`` of a ``<agent>:t<n>`` step, with its partition and prompt ref) it
rebuilds that turn's context on the state before the commit, with the call outcomes the
commit records before the intent (what the executor passed as ``outcomes``), twice: in
full (:func:`reel.shared.core.agent.turncontext.build_turn`) and with one
:class:`~reel.shared.core.agent.memo.ContextMemo` carried over the whole log (branch changes
included). Both must give the same partition and the same wire request, byte for byte —
and, with ``recorded``, the partition and prompt the log holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from reel.shared.core.agent.actions import DispatchTurn
from reel.shared.core.agent.memo import ContextMemo
from reel.shared.core.agent.turncontext import build_turn, needed_blobs
from reel.shared.core.chat.messages import wire_request
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.run.events import AttemptDispatched, AttemptEnd, AttemptFailed, AttemptSucceeded, Commit
from reel.shared.core.run.fold import apply_commit
from reel.shared.core.run.ids import AttemptNo, StepId
from reel.shared.core.run.planning import TextFacts
from reel.shared.core.run.state import RunState
from reel.shared.core.run.stepids import parse_step_id
from reel.shared.core.workflow.spec import WorkflowSpec


@dataclass
class Checked:
    """What :func:`check_turns` compared: turns, and those whose partition left items out (available/dropped)."""

    turns: int = 0
    over_budget: int = 0
    dropped: int = 0
    branches: set[str] = field(default_factory=set)
    rebuilt: int = 0  # earlier turns the memo rebuilt (the rest it kept)
    kept: int = 0


def check_turns(log: Sequence[tuple[int, Commit]], spec: WorkflowSpec, blobs: Mapping[str, bytes], *,
                recorded: bool, outputs: Callable[[RunState, str], Mapping[str, str]] | None = None) -> Checked:
    """Compare full and incremental contexts on every turn intent of ``log`` (see the module docstring).

    Raises:
        AssertionError: a turn's contexts differ (the message names the turn, branch and LSN).
    """
    facts = TextFacts(DEFAULT_COUNTER)
    memo = ContextMemo(TextFacts(DEFAULT_COUNTER))
    out = Checked()
    state: RunState | None = None
    for lsn, commit in log:
        before = state
        state = apply_commit(state, lsn, commit)
        pending: list[AttemptEnd] = []
        for e in commit.events:
            if isinstance(e, AttemptSucceeded | AttemptFailed):
                pending.append(e)
            parsed = parse_step_id(e.step_id) if isinstance(e, AttemptDispatched) else None
            if not isinstance(e, AttemptDispatched) or parsed is None or parsed[2] >= 0 or e.prompt_ref is None:
                continue
            assert before is not None
            agent_id, turn = parsed[0], parsed[1]
            agent = spec.agent(agent_id)
            action = DispatchTurn(branch_id=e.branch_id, agent=StepId(agent_id), step_id=e.step_id, turn=turn,
                                  attempt=AttemptNo(e.attempt), declare=False)
            run_outputs = outputs(before, e.branch_id) if outputs is not None else {}
            needed = {r.sha256: blobs[r.sha256] for r in needed_blobs(before, e.branch_id, action.agent, turn,
                                                                       pending)}
            full = build_turn(before, action, agent, spec, run_outputs=run_outputs, blobs=needed, facts=facts,
                              outcomes=pending)
            rebuilt = memo.rebuilt
            todo = memo.plan(before, e.branch_id, action.agent, turn, pending)
            inc = memo.build(todo, before, action, agent, spec, run_outputs=run_outputs,
                             blobs={r.sha256: blobs[r.sha256] for r in todo.refs}, outcomes=pending)
            where = f"{e.step_id}#{e.attempt} on {e.branch_id} at LSN {lsn}"
            out.rebuilt += memo.rebuilt - rebuilt
            out.kept += len(todo.groups) - len(todo.stale)
            body = msgspec.json.encode(wire_request(full.request))
            assert msgspec.json.encode(wire_request(inc.request)) == body, f"prompt differs: {where}"
            assert inc.packed == full.packed, f"partition differs: {where}"
            assert inc.items == full.items, f"items differ: {where}"
            if recorded:
                assert e.context == full.packed.partition, f"recorded partition differs from a full rebuild: {where}"
                sha = hashlib.sha256(body).hexdigest()
                assert e.prompt_ref.sha256 == sha, f"recorded prompt differs from a full rebuild: {where}"
            out.turns += 1
            out.over_budget += bool(full.packed.partition.available)
            out.dropped += bool(full.packed.partition.dropped)
            out.branches.add(e.branch_id)
    return out
