"""Fork edits, pure: the codec, which edits a turn sees, and the packer with restores and drops."""

from __future__ import annotations

import msgspec
import pytest

from reel.shared.core.agent.forkcontext import DROPPED_BY_FORK, TurnEdits, edited_agent, pack_edited, turn_edits
from reel.shared.core.agent.turncontext import TurnItem
from reel.shared.core.pack.packer import Candidate, PackPolicy, pack
from reel.shared.core.run.events import BranchForked, Commit, decode_commit, encode_commit
from reel.shared.core.run.forkedits import (
    BranchEdits,
    ContextEdit,
    Drop,
    Instructions,
    Model,
    Param,
    Restore,
    ToolResult,
    carried,
)
from reel.shared.core.run.ids import LSN, BranchId, CommitId, ContextItemId, RunId, StepId
from reel.shared.core.run.state import BranchState
from reel.shared.core.workflow.spec import AgentStep, ModelSpec

EDITS: tuple[ContextEdit, ...] = (Restore(item=ContextItemId("old-notes")), Drop(item=ContextItemId("layout")),
                                  Instructions(text="Be brief."), Model(name="m2"),
                                  Param(key="temperature", value=0.5),
                                  ToolResult(call=StepId("fix:t1:c1"), text="OK"))


def test_fork_edits_round_trip_and_a_plain_rewind_encodes_as_before() -> None:
    fork = BranchForked(branch_id=BranchId("b-1"), parent_branch_id=BranchId("main"), fork_lsn=LSN(4),
                        from_step=StepId("fix:t2"), at_ms=1, edits=EDITS)
    body = encode_commit(Commit(commit_id=CommitId("c"), run_id=RunId("r"), writer="rewind", events=(fork,)))
    assert decode_commit(body).events == (fork,)
    assert b'"edit":"restore"' in body and b'"edit":"tool_result"' in body
    plain = msgspec.structs.replace(fork, edits=msgspec.UNSET)
    assert b"edits" not in encode_commit(Commit(commit_id=CommitId("c"), run_id=RunId("r"), writer="rewind",
                                                events=(plain,)))


def _branch(*edits: BranchEdits) -> BranchState:
    return BranchState(branch_id=BranchId("b"), created_lsn=LSN(5), edits=edits)


def test_restores_apply_to_the_fork_turn_and_lasting_edits_from_it_on() -> None:
    b = _branch(BranchEdits(at_step=StepId("fix:t2"), edits=EDITS))
    at = turn_edits(b, StepId("fix:t2"))
    assert at is not None and at.restore == {"old-notes"} and at.drop == {"layout"}
    assert (at.instructions, at.model, dict(at.params), dict(at.tool_results)) == (
        "Be brief.", "m2", {"temperature": 0.5}, {"fix:t1:c1": "OK"})
    later = turn_edits(b, StepId("fix:t3"))
    assert later is not None and not later.restore and not later.drop and later.model == "m2"
    assert turn_edits(b, StepId("fix:t1")) is None  # before the fork turn
    assert turn_edits(b, StepId("other:t3")) is None  # another agent
    assert turn_edits(BranchState(branch_id=BranchId("m"), created_lsn=LSN(1)), StepId("fix:t2")) is None


def test_a_child_inherits_the_lasting_edits_it_continues_from() -> None:
    positions = {StepId("fix"): 0}
    parent = (BranchEdits(at_step=StepId("fix:t2"), edits=EDITS),)
    later = carried(positions, parent, LSN(5), LSN(9), StepId("fix:t3"), ())
    assert later == (BranchEdits(at_step=StepId("fix:t2"), edits=EDITS, own=False),)
    t3 = turn_edits(_branch(*later), StepId("fix:t3"))
    assert t3 is not None and t3.model == "m2" and not t3.restore  # the parent's restore was for its own turn
    assert carried(positions, parent, LSN(5), LSN(9), StepId("fix:t1"), ()) == ()  # forks before the edit
    assert carried(positions, parent, LSN(5), LSN(3), StepId("fix:t3"), ()) == ()  # forks in inherited records
    own = (Model(name="m3"),)
    mine = carried(positions, parent, LSN(5), LSN(9), StepId("fix:t3"), own)
    t3 = turn_edits(_branch(*mine), StepId("fix:t3"))
    assert t3 is not None and t3.model == "m3"  # its own edit over the inherited one


def test_edited_agent_changes_instructions_model_and_params() -> None:
    agent = AgentStep(id="fix", model=ModelSpec(adapter="scripted", params={"top_p": 1}), instructions="old")
    edited = edited_agent(agent, TurnEdits(instructions="new", model="m2", params={"temperature": 0}))
    assert edited.instructions == "new" and edited.model.model == "m2"
    assert edited.model.request_params == {"top_p": 1, "temperature": 0}
    assert edited_agent(agent, None) is agent


CANDS = [Candidate(id=ContextItemId("instructions"), kind="system", tokens=5, required=True),
         Candidate(id=ContextItemId("layout"), kind="document", tokens=5, priority=1),
         Candidate(id=ContextItemId("old-notes"), kind="document", tokens=5, stale=True),
         Candidate(id=ContextItemId("fix:t1:msg"), kind="assistant", tokens=50, group="fix:t1"),
         Candidate(id=ContextItemId("fix:t1:c0:obs"), kind="tool", tokens=50, group="fix:t1")]
POLICY = PackPolicy(budget_tokens=40)


def test_restore_packs_a_dropped_item_and_its_group_whatever_the_budget() -> None:
    base = pack(CANDS, POLICY).partition
    assert "old-notes" in base.dropped and "fix:t1:msg" in base.dropped  # stale; the group is over the budget
    part = pack_edited(CANDS, POLICY, TurnEdits(restore=frozenset({ContextItemId("old-notes"),
                                                                   ContextItemId("fix:t1:c0:obs")}))).partition
    assert part.packed == ("instructions", "old-notes", "fix:t1:msg", "fix:t1:c0:obs")
    assert part.restored == ("old-notes", "fix:t1:msg", "fix:t1:c0:obs") and part.dropped == ()
    assert part.available == ("layout",)  # restored items' tokens come off the budget first, as required ones do
    assert isinstance(part.item_tokens, tuple) and len(part.item_tokens) == len(CANDS)


def test_drop_leaves_an_item_out_with_its_reason_and_the_partition_covers_every_candidate() -> None:
    part = pack_edited(CANDS, POLICY, TurnEdits(drop=frozenset({ContextItemId("layout")}))).partition
    assert "layout" not in part.packed and dict(part.dropped_with_reasons())["layout"] == DROPPED_BY_FORK
    assert sorted((*part.packed, *part.available, *part.dropped)) == sorted(c.id for c in CANDS)
    assert isinstance(part.item_tokens, tuple) and len(part.item_tokens) == len(CANDS)
    assert part.restored is msgspec.UNSET
    unedited = pack_edited(CANDS, POLICY, TurnEdits())
    assert unedited == pack(CANDS, POLICY)


@pytest.mark.parametrize("item", [TurnItem(id=ContextItemId("fix:t1:c1:obs"), kind="tool", text="FAILED",
                                           is_error=True, group="fix:t1")])
def test_a_tool_result_edit_replaces_the_text_the_model_reads(item: TurnItem) -> None:
    from reel.shared.core.agent.forkcontext import edited_items

    (edited,) = edited_items([item], TurnEdits(tool_results={StepId("fix:t1:c1"): "OK"}))
    assert (edited.text, edited.is_error) == ("OK", False)


def test_check_edits_refuses_what_does_not_fit_the_turn() -> None:
    from reel.shared.core.mutators.forking import MAX_EDIT_TEXT_BYTES, InvalidEdit, check_edits
    from reel.shared.core.run.eventfields import ContextPartition
    from reel.shared.core.run.persistent import FrozenMap
    from reel.shared.core.run.state import AttemptState, AttemptStatus

    part = ContextPartition(packed=(ContextItemId("task"),), available=(), dropped=(ContextItemId("old-notes"),))
    attempt = AttemptState(step_id=StepId("fix:t2"), attempt=1, status=AttemptStatus.SUCCEEDED,  # type: ignore[arg-type]
                           executor_id="x", dispatched_lsn=LSN(3), dispatched_ms=0, context=part)  # type: ignore[arg-type]
    branch = BranchState(branch_id=BranchId("main"), created_lsn=LSN(1),
                         attempts=FrozenMap({StepId("fix:t2"): (attempt,)}))
    run = "r"
    check_edits(run, branch, StepId("fix:t2"), [Restore(item=ContextItemId("old-notes"))])  # type: ignore[arg-type]
    for at, edits, says in [
            (StepId("fix"), [Model(name="m")], "apply to an agent turn"),
            (StepId("fix:t2"), [Restore(item=ContextItemId("task"))], "packed in turn fix:t2 already"),
            (StepId("fix:t2"), [Drop(item=ContextItemId("old-notes"))], "dropped in turn fix:t2 already"),
            (StepId("fix:t2"), [Restore(item=ContextItemId("nope"))], "has no context item 'nope'"),
            (StepId("fix:t2"), [ToolResult(call=StepId("fix:t2:c0"), text="x")], "not a call of an earlier turn"),
            (StepId("fix:t2"), [Param(key="messages", value=[])], "cannot be set"),
            (StepId("fix:t2"), [Instructions(text="x" * (MAX_EDIT_TEXT_BYTES + 1))], "over the"),
            (StepId("fix:t3"), [Restore(item=ContextItemId("old-notes"))], "recorded no context partition")]:
        with pytest.raises(InvalidEdit, match=says):
            check_edits(run, branch, at, edits)  # type: ignore[arg-type]
