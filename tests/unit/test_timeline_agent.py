"""What ``reel run`` / ``reel show`` print for agent runs (services/timeline/render.py), on the golden agent log."""

from __future__ import annotations

import re

from rich.console import Console

from reel.services.timeline.render import event_line, timeline
from reel.shared.core.run.events import AttemptSucceeded
from reel.shared.core.run.fold import fold
from tests.golden.regen import GOLDEN_DIR, fold_log, read_log


def _text(renderable: object) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_progress_lines_name_turns_and_tool_calls() -> None:
    lines = "".join(_text(event_line(lsn, ev)) for lsn, c in read_log(GOLDEN_DIR / "hand_agent_rewind.jsonl")
                    for ev in c.events)
    assert "turn 1 of solve: solve:t1" in lines and "turn 2 of solve: solve:t2" in lines
    assert 'solve:t1:c0 tool call read_file({"path": "calc/ops.py"})  id call_a1' in lines
    assert "solve:t1:c1 tool call run_tests({})  id call_b2" in lines
    assert "agent solve succeeded after 2 turns" in lines
    assert "agent solve failed after 2 turns: turn_failed:" in lines


def test_timeline_lists_turns_calls_and_the_agent_summary() -> None:
    state, _ = fold_log(GOLDEN_DIR / "hand_agent_rewind.jsonl")
    shown = _text(timeline(state, "main"))
    assert "│ solve:t1:c0 (call_a1) │ tool read_file │" in shown and "│ solve:t2              │ turn" in shown
    assert "agent solve: succeeded, 2 turns, 2 tool calls (1 error observation)" in shown


def test_runs_without_agents_print_as_before() -> None:
    state, _ = fold_log(GOLDEN_DIR / "recorded_linear.jsonl")
    shown = _text(timeline(state))
    assert "agent " not in shown and " turn " not in shown and "tool call" not in shown


def test_an_error_too_long_for_its_cell_is_printed_whole_below_the_table() -> None:
    state, _ = fold_log(GOLDEN_DIR / "hand_cancel_in_flight.jsonl")
    shown = _text(timeline(state))
    assert "interrupted: see [1] below" in shown
    assert ("[1] fetch#1: interrupted: executor x-cs1 shut down: the drain deadline (45 s) passed before the attempt "
            "finished; its process group was killed") in shown
    assert "pressed stop" in shown and "[2]" not in shown  # a short one stays in its cell (wrapped), no note


def test_a_tool_attempts_progress_line_shows_its_time_not_zero_tokens() -> None:
    lines = [_text(event_line(lsn, ev)) for lsn, c in read_log(GOLDEN_DIR / "hand_agent_rewind.jsonl")
             for ev in c.events if isinstance(ev, AttemptSucceeded)]
    turns = [line for line in lines if re.search(r":t\d+#", line)]  # solve:t1#2 (a model turn)
    tools = [line for line in lines if line not in turns]  # prep#1, solve:t1:c0#1 (tool steps, tool calls)
    assert tools and turns
    assert all(" tok" not in line and " ms" in line for line in tools), tools
    assert all(" tok" in line for line in turns), turns


def test_an_agent_waiting_for_an_answer_says_so() -> None:
    commits = read_log(GOLDEN_DIR / "hand_agent_approval.jsonl")
    waiting = fold(commits[:6])
    assert waiting.status == "awaiting_input"
    assert "agent ship: running (awaiting input), 1 turn" in _text(timeline(waiting))
    assert "(awaiting input)" not in _text(timeline(fold(commits[:7])))  # running again
