"""Durable timers' pure core: the fold of run_sleeping / run_woke, the waker's decision, the planner around a
sleep step and a resume_after attempt, a command's resume request, the sleep step's validation."""

from __future__ import annotations

import re

import msgspec
import pytest

from reel.shared.core.decision import Skip
from reel.shared.core.errors import InvalidTransition, WorkflowInvalid
from reel.shared.core.mutators import cancel
from reel.shared.core.run import planning as plan
from reel.shared.core.run import timers
from reel.shared.core.run.events import Commit, RunWoke
from reel.shared.core.run.fold import apply_commit, fold
from reel.shared.core.run.ids import CommitId, RunId
from reel.shared.core.run.persistent import FrozenMap
from reel.shared.core.run.state import RESTING, RunState
from reel.shared.core.wire.commands import CancelRun
from reel.shared.core.workflow.spec import parse_workflow
from tests.golden.regen import GOLDEN_DIR, read_log

LOG = read_log(GOLDEN_DIR / "hand_sleep.jsonl")  # nap sleeps at 103, woken 104; poll asks to resume at 107
T = 1790000000000


def at(lsn: int) -> RunState:
    state = fold(LOG, upto_lsn=lsn)
    assert state is not None
    return state


def test_a_sleeping_run_rests_with_its_wake_time_and_nothing_in_flight() -> None:
    asleep = at(103)
    assert asleep.status == "sleeping" and asleep.status in RESTING
    assert timers.next_wake(asleep.status, asleep.active) == T + 60_003
    assert timers.next_due(asleep.status, asleep.branches["main"]) == T + 60_003
    assert not plan.has_open_intent(asleep)
    assert isinstance(plan.next_action(asleep, "x-aaaa"), plan.Rest)


def test_the_waker_fires_at_the_time_and_not_before() -> None:
    asleep = at(103)
    assert isinstance(timers.due_events(asleep, T + 60_002), Skip)
    fired = timers.due_events(asleep, T + 60_003)
    assert fired == (RunWoke(branch_id="main", step_id="nap", at_ms=T + 60_003),)


def test_a_cancelled_or_woken_run_is_not_due() -> None:
    asleep = at(103)
    decided = cancel.decide(asleep, CancelRun(run_id=RunId(asleep.run_id)), at_ms=T + 10)
    assert not isinstance(decided, Skip)  # cancel is legal while it sleeps
    cancelled = apply_commit(asleep, 200, Commit(commit_id=CommitId("c"), run_id=asleep.run_id, events=decided))
    assert cancelled.status == "cancelled"
    assert isinstance(timers.due_events(cancelled, T + 10**9), Skip)
    assert timers.next_due(cancelled.status, cancelled.branches["main"]) is None
    assert isinstance(timers.due_events(at(104), T + 10**9), Skip)


def test_a_woken_sleep_step_is_recorded_once_then_the_next_step_runs() -> None:
    woke = at(105)  # woken, then claimed by x-bbbb
    action = plan.next_action(woke, "x-bbbb")
    assert action == plan.FinishSleep(branch_id="main", step_id="nap", attempt=1, wake_ms=T + 60_003,
                                      woke_ms=T + 60_020)
    assert plan.next_action(at(102), "x-aaaa") == plan.Sleep("main", "nap", "sleep")  # wake_ms: the executor's


def test_a_resume_after_attempt_waits_for_its_timer_then_runs_again() -> None:
    asked = at(107)
    assert asked.status == "sleeping"
    poll = asked.branches["main"].attempts["poll"]
    assert poll[-1].error_kind == "resume_after" and poll[-1].resume_at_ms == T + 90_100
    assert asked.branches["main"].attempts and plan.own_status(asked.branches["main"], asked.step_decl("poll")) \
        == "retrying"  # not a try of a max_attempts=1 step
    woke = at(108)
    assert plan.next_action(woke, "x-bbbb") == plan.Dispatch("main", "poll", 2)
    # a branch that inherits the attempt but not the timer sleeps again until the time it asked for
    unwoken = without_timer(woke)
    assert plan.next_action(unwoken, "x-bbbb") == plan.Sleep("main", "poll", "resume_after", T + 90_100)


def without_timer(state: RunState) -> RunState:
    branch = msgspec.structs.replace(state.branches["main"], timer=msgspec.UNSET)
    return msgspec.structs.replace(state, branches=FrozenMap.of({"main": branch}))


def test_the_fold_refuses_a_timer_that_could_not_have_been_written() -> None:
    woke_again = Commit(commit_id=CommitId("x"), run_id=at(104).run_id,
                        events=(RunWoke(branch_id="main", step_id="nap", at_ms=T),))
    with pytest.raises(InvalidTransition, match="run_woke"):
        apply_commit(at(104), 104 + 100, woke_again)  # not sleeping any more
    sleeping_again = LOG[3][1]
    with pytest.raises(InvalidTransition, match="run_sleeping"):
        apply_commit(at(103), 300, sleeping_again)  # already sleeping


@pytest.mark.parametrize(("stdout", "expected"), [
    ('{"reel": {"resume_after_s": 30}}', (30.0, "")),
    ('  {"reel": {"resume_after_s": 0.5, "reason": "not yet"}}\n', (0.5, "not yet")),
    ('{"reel": {"other": 1}}', None),
    ('{"reel": {"resume_after_s": 3}, "more": 1}', None),
    ("resume_after_s", None),
    ("{not json resume_after_s", None),
])
def test_a_command_asks_to_be_resumed_only_with_the_documented_shape(stdout: str,
                                                                     expected: tuple[float, str] | None) -> None:
    assert timers.resume_request(stdout) == expected


@pytest.mark.parametrize("bad", ['"soon"', "-1", "true", "1e12"])
def test_a_malformed_resume_request_says_why(bad: str) -> None:
    with pytest.raises(ValueError, match="resume_after_s"):
        timers.resume_request('{"reel": {"resume_after_s": ' + bad + "}}")


def _sleep(**fields: object) -> dict[str, object]:
    return {"name": "w", "steps": [{"id": "nap", "kind": "sleep", **fields}]}


@pytest.mark.parametrize(("fields", "message"), [
    ({}, "exactly one of `for_s` or `until`"),
    ({"for_s": 1, "until": "2026-01-01T00:00:00Z"}, "exactly one of"),
    ({"for_s": -1}, "for_s must be between"),
    ({"until": "tomorrow"}, "not an ISO-8601 time (at `$.steps[0].until`)"),
    ({"until": "2026-01-01T00:00:00"}, "has no UTC offset"),
])
def test_a_sleep_step_is_validated_naming_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(WorkflowInvalid, match=re.escape(message)):
        parse_workflow(_sleep(**fields))


def test_a_sleep_step_wakes_for_s_after_it_is_reached_or_at_its_time() -> None:
    nap = parse_workflow(_sleep(for_s=1.5)).sleep("nap")
    assert nap.wake_ms(1000) == 2500
    until = parse_workflow(_sleep(until="2026-12-02T08:00:00+01:00")).sleep("nap")
    assert until.wake_ms(0) == until.wake_ms(10**13) == 1796194800000


def test_reel_show_and_the_ui_say_when_a_sleeping_run_wakes() -> None:
    from rich.console import Console

    from reel.services.timeline.render import event_line, timeline, utc
    from reel.services.ui.app import _env
    from reel.services.ui.runview import run_page

    asleep, at_time = at(103), utc(T + 60_003)
    assert at_time == "2026-09-21T14:14:20.003Z"
    console = Console(width=200, record=True)
    console.print(timeline(asleep))
    shown = console.export_text()
    assert f"status sleeping  wakes {at_time} (nap)" in shown
    assert str(event_line(103, LOG[3][1].events[0])).endswith(f"sleeping until {at_time} (60 s; nap)")
    html = _env().get_template("_run_body.html").render(p=run_page(asleep), branch_param="main", page_bytes=100)
    assert f'<dd id="run-wakes">{at_time} (nap)</dd>' in html and 'class="badge s-sleeping">sleeping<' in html
    assert "run-wakes" not in _env().get_template("_run_body.html").render(p=run_page(at(104)), branch_param="main",
                                                                              page_bytes=100)


def test_the_step_a_run_sleeps_on_reads_sleeping_until_it_wakes() -> None:
    from reel.shared.core.run.views import build_episode_view

    def status_of(lsn: int, step: str) -> str:
        return next(s.status for s in build_episode_view(at(lsn)).steps if s.step_id == step)

    assert status_of(103, "nap") == "sleeping" and status_of(104, "nap") == "pending"
    assert status_of(107, "poll") == "sleeping" and status_of(108, "poll") == "retrying"
