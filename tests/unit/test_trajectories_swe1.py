"""SWE-agent 1.x trajectories: any agent name, ``role: tool`` observations, native tool calls.

The files are synthetic, written from SWE-agent's documented history item
(``sweagent/types.py`` ``HistoryItem``: role, content, agent, message_type, is_demo,
thought, action, tool_calls, tool_call_ids) and how ``sweagent/agent/agents.py`` fills it
(``add_step_to_history``: the assistant message with ``tool_calls``, ``message_type:
action``; the observation as ``role: tool`` with ``tool_call_ids`` when the step had one,
else ``role: user``); real files store the two lists as lists or as their Python repr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reel.shared.core.errors import TrajectoryFormatError
from reel.shared.core.trajectories import detect_format, load_trajectories
from reel.shared.core.trajectories.builder import AGENT_STEP, CLOSING_TEXT
from reel.shared.core.trajectories.swe_agent import listish
from reel.shared.core.workflow.spec import AgentStep, WorkflowSpec

ISSUE = "Fix the off-by-one in pager.py"


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


CALLS = [
    [_call("call_a1", "bash", {"command": "grep -n range pager.py"})],
    [_call("call_b2", "str_replace_editor", {"command": "str_replace", "path": "/repo/pager.py",
                                             "old_str": "n - 1", "new_str": "n"})],
    [_call("call_c3", "submit", {})],
]
OBS = ["12: for i in range(n - 1):", "The file /repo/pager.py has been edited.", "diff --git a/pager.py b/pager.py"]


def _history(agent: str = "main", *, stringify: bool = False, other_agent: bool = False) -> list[dict[str, Any]]:
    h: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant.", "agent": agent, "message_type": "system_prompt"},
        {"role": "user", "content": [{"type": "text", "text": "Here is a demonstration …"}], "agent": agent,
         "is_demo": True, "message_type": "demonstration"},
        {"role": "user", "content": [{"type": "text", "text": ISSUE}], "agent": agent, "message_type": "observation"},
    ]
    for k, (calls, obs) in enumerate(zip(CALLS, OBS, strict=True)):
        h.append({"role": "assistant", "content": f"Thought {k}", "thought": f"Thought {k}",
                  "action": calls[0]["function"]["name"], "agent": agent, "message_type": "action",
                  "tool_calls": repr(calls) if stringify else calls, "thinking_blocks": []})
        if other_agent and k == 0:  # a reviewer's exchange in between: not the replayed agent's
            h.append({"role": "assistant", "content": "review: looks fine", "agent": "reviewer",
                      "message_type": "action"})
        ids = [calls[0]["id"]]
        h.append({"role": "tool", "content": [{"type": "text", "text": obs}], "agent": agent,
                  "message_type": "observation", "tool_call_ids": repr(ids) if stringify else ids})
    return h


def _write(tmp_path: Path, history: list[dict[str, Any]], name: str = "acme__pager-42.traj",
           trajectory: list[dict[str, Any]] | None = None) -> Path:
    doc = {"trajectory": trajectory if trajectory is not None else [
               {"action": c[0]["function"]["name"], "observation": o, "response": f"Thought {k}", "thought": "",
                "execution_time": 0.1, "state": {}, "query": [], "extra_info": {}}
               for k, (c, o) in enumerate(zip(CALLS, OBS, strict=True))],
           "history": history, "info": {"exit_status": "submitted", "swe_agent_version": "1.1.0"},
           "replay_config": json.dumps({"agent": {"model": {"name": "claude-sonnet-4"}}}), "environment": "main"}
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def _agent(w: WorkflowSpec) -> AgentStep:
    (step,) = w.steps
    assert isinstance(step, AgentStep) and step.id == AGENT_STEP
    return step


@pytest.mark.parametrize("stringify", [False, True], ids=["lists", "python-reprs"])
def test_swe_agent_1x_function_calling(tmp_path: Path, stringify: bool) -> None:
    p = _write(tmp_path, _history(stringify=stringify))
    assert detect_format(json.loads(p.read_text())) == "swe-agent"
    (w,) = load_trajectories(p)
    step = _agent(w)
    turns = step.model.scripted_turns
    assert [t.text for t in turns] == ["Thought 0", "Thought 1", "Thought 2", CLOSING_TEXT]
    assert [[(c.id, c.name) for c in t.tool_calls] for t in turns[:3]] == [
        [("call_a1", "bash")], [("call_b2", "str_replace_editor")], [("call_c3", "submit")]]
    assert json.loads(turns[1].tool_calls[0].arguments)["new_str"] == "n"
    tools = {t.name: t.recorded for t in step.tools}
    assert {n: r.by_call_id for n, r in tools.items() if r is not None} == {
        "bash": {"call_a1": OBS[0]}, "str_replace_editor": {"call_b2": OBS[1]}, "submit": {"call_c3": OBS[2]}}
    assert [(c.id, c.kind) for c in step.context] == [("m0001", "demo"), ("m0002", "task")]
    assert step.context[1].text == ISSUE and step.instructions == "You are a helpful assistant."
    assert w.name == "acme__pager-42" and w.source["model"] == "claude-sonnet-4"
    assert w.source["agent"] == "SWE-agent 1.1.0 (main)" and w.source["outcome"] is None
    assert w.labels["context_checks"] == "task-in-final-context"  # a context check, not an outcome


def test_any_agent_name_and_other_agents_left_out(tmp_path: Path) -> None:
    (w,) = load_trajectories(_write(tmp_path, _history("swe-primary-7", other_agent=True)))
    texts = [t.text for t in _agent(w).model.scripted_turns]
    assert texts == ["Thought 0", "Thought 1", "Thought 2", CLOSING_TEXT]  # the reviewer's message is not a turn


def test_thought_action_1x_observations_as_user_messages(tmp_path: Path) -> None:
    h: list[dict[str, Any]] = [
        {"role": "system", "content": "sys", "agent": "main", "message_type": "system_prompt"},
        {"role": "user", "content": ISSUE, "agent": "main", "message_type": "observation"},
        {"role": "assistant", "content": "DISCUSSION\nlook\n```\nls -a\n```", "action": "ls -a\n", "agent": "main",
         "message_type": "action", "tool_calls": None},
        {"role": "user", "content": "OBSERVATION:\n. .. pager.py", "agent": "main", "message_type": "observation"},
        {"role": "assistant", "content": "done\n```\nsubmit\n```", "action": "submit", "agent": "main",
         "message_type": "action", "tool_calls": "None", "tool_call_ids": "None"},
    ]
    traj = [{"action": "ls -a\n", "observation": ". .. pager.py", "response": h[2]["content"]},
            {"action": "submit\n", "observation": "diff --git …", "response": h[4]["content"]}]
    (w,) = load_trajectories(_write(tmp_path, h, name="thought.traj", trajectory=traj))
    step = _agent(w)
    calls = [c for t in step.model.scripted_turns for c in t.tool_calls]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("bash", {"command": "ls -a"}),
                                                                   ("bash", {"command": "submit"})]
    bash = next(t for t in step.tools if t.name == "bash").recorded
    assert bash is not None
    assert sorted(bash.by_call_id.values()) == ["OBSERVATION:\n. .. pager.py", "diff --git …"]
    assert w.name == "thought" and w.source["model"] == "claude-sonnet-4"


def test_listish_parses_literals_and_never_evaluates(tmp_path: Path) -> None:
    assert listish("['call_1']", "x") == ["call_1"]
    assert listish('["call_1"]', "x") == ["call_1"]
    assert listish("[{'id': 'c', 'function': {'name': 'bash', 'arguments': '{}'}, 'x': None}]", "x")[0]["x"] is None
    assert listish(None, "x") == listish("None", "x") == listish("", "x") == []
    marker = tmp_path / "ran"
    with pytest.raises(TrajectoryFormatError, match="not a list literal"):
        listish(f"__import__('pathlib').Path({str(marker)!r}).touch()", "h[3].tool_calls")
    assert not marker.exists()
    with pytest.raises(TrajectoryFormatError, match="expected a list"):
        listish("{'id': 'c'}", "h[3].tool_calls")


def test_a_bad_tool_calls_string_names_the_entry(tmp_path: Path) -> None:
    h = _history()
    h[3]["tool_calls"] = "[{'id': 'call_a1', "  # cut off
    with pytest.raises(TrajectoryFormatError, match=r"history\[3\]\.tool_calls: not a list literal"):
        load_trajectories(_write(tmp_path, h))
