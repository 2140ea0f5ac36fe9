"""Replay as an agent step: every recorded file of the data folder through the agent loop's pure core.

The loop is driven by the in-memory reference driver (tests/unit/agent_sim.py: the executor's contract with
the recorded tools answering by call id); the end-to-end ``reel replay`` runs are in tests/integration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reel.shared.core.agent.turncontext import model_items, turn_candidates
from reel.shared.core.pack.packer import pack
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.run.events import ContextPartition
from reel.shared.core.run.planning import TextFacts, policy_for
from reel.shared.core.trajectories import load_trajectories
from reel.shared.core.trajectories.builder import AGENT_STEP, CLOSING_TEXT, RESPOND
from reel.shared.core.trajectories.loader import PARSERS, _read, detect_format
from reel.shared.core.trajectories.recording import Lit, Obs, Recording, Turn
from reel.shared.core.workflow.agentspec import AgentToolSpec
from reel.shared.core.workflow.spec import AgentStep, ModelStep, ToolStep, WorkflowSpec
from tests.unit.agent_sim import Sim
from tests.unit.test_trajectories import FILES, MINI_FAIL, MINI_OK, MODEL_TURNS, OH, SWE, TAU, TOOL_STEPS, _mini, _raw


def _agent(w: WorkflowSpec) -> AgentStep:
    (step,) = w.steps
    assert isinstance(step, AgentStep) and step.id == AGENT_STEP
    return step


def _tools(w: WorkflowSpec) -> dict[str, AgentToolSpec]:
    return {t.name: t for t in _agent(w).tools}


def _result(w: WorkflowSpec, name: str, call_id: str) -> str:
    rec = _tools(w)[name].recorded
    assert rec is not None
    return rec.by_call_id[call_id]


def _recordings(path: Path) -> list[Recording]:
    data = _read(path)
    return PARSERS[detect_format(data)](data, path, None)


@pytest.fixture(scope="module")
def loaded(data_dir: Path) -> dict[str, list[WorkflowSpec]]:
    return {name: load_trajectories(data_dir / name) for name in FILES}


# ---------------------------------------------------------------- shape
@pytest.mark.data
def test_one_agent_step_replaying_every_turn_and_call(loaded: dict[str, list[WorkflowSpec]]) -> None:
    for name, workflows in loaded.items():
        recorded = [len(_agent(w).model.scripted_turns) - w.source["closing_turn"] for w in workflows]
        calls = [sum(len(t.tool_calls) for t in _agent(w).model.scripted_turns) for w in workflows]
        if name in MODEL_TURNS:
            assert recorded == MODEL_TURNS[name], name
            # every recorded result answers a call; OpenHands `finish` is a call the recording never answered
            unanswered = [0 if name != OH else int(w.source["exit_status"] == "finished") for w in workflows]
            assert calls == [n + u for n, u in zip(TOOL_STEPS[name], unanswered, strict=True)], name
        for w in workflows:
            agent = _agent(w)
            turns = agent.model.scripted_turns
            assert agent.model.adapter == "replay" and agent.max_turns == len(turns)
            assert w.source["closing_turn"] == (turns[-1].text == CLOSING_TEXT and not turns[-1].tool_calls)
            assert all(t.tool_calls for t in turns[:-1]) and not turns[-1].tool_calls  # only the last ends the loop
            ids = [c.id for t in turns for c in t.tool_calls]
            assert len(ids) == len(set(ids)) and all(ids)
            tools = _tools(w)
            assert all(t.recorded is not None and t.retry_safe for t in tools.values())
            for t in turns:
                for c in t.tool_calls:
                    _result(w, c.name, c.id)  # every call has its recorded result
    assert sum(len(_agent(w).model.scripted_turns) - 1 for w in loaded[TAU]) == 2454


@pytest.mark.data
def test_taubench_function_calls_are_tool_calls(data_dir: Path, loaded: dict[str, list[WorkflowSpec]]) -> None:
    for ep, w in zip(_raw(data_dir / TAU)[:20], loaded[TAU][:20], strict=True):
        turns = iter(_agent(w).model.scripted_turns)
        seen: set[str] = set()
        turn: Any = None
        for prev, m in zip([None, *ep["traj"]], ep["traj"], strict=False):
            if m["role"] == "assistant":
                turn = next(turns)
                assert turn.text == (m["content"] or "")
                native = m.get("tool_calls") or []
                if native:
                    got = [(c.name, json.loads(c.arguments)) for c in turn.tool_calls]
                    assert got == [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in native]
                    for c, rc in zip(turn.tool_calls, native, strict=True):  # provider ids kept unless repeated
                        assert c.id == rc["id"] or rc["id"] in seen
                        seen.add(rc["id"])
            elif m["role"] == "tool":
                call = next(c for c in turn.tool_calls if c.name == m["name"])
                assert _result(w, m["name"], call.id) == m["content"]
            elif m["role"] == "user" and prev and prev["role"] == "assistant" and not prev.get("tool_calls"):
                (call,) = turn.tool_calls
                assert (call.name, call.arguments) == (RESPOND, "{}")
                assert _result(w, RESPOND, call.id) == m["content"]


@pytest.mark.data
@pytest.mark.parametrize("name", [MINI_OK, MINI_FAIL, SWE])
def test_shell_actions_are_bash_calls(data_dir: Path, loaded: dict[str, list[WorkflowSpec]], name: str) -> None:
    (w,) = loaded[name]
    linear = {s.id: s for s in load_trajectories(data_dir / name, form="linear")[0].steps}
    recorded = _agent(w).model.scripted_turns[:-1]
    for n, turn in enumerate(recorded, 1):
        model, tool = linear[f"t{n:02d}-model"], linear[f"t{n:02d}-tool"]
        assert isinstance(model, ModelStep) and isinstance(tool, ToolStep)
        assert turn.text == model.model.output and turn.usage == model.model.usage
        (call,) = turn.tool_calls
        assert call.name == "bash" and json.loads(call.arguments) == {"command": tool.tool.input}
        assert _result(w, "bash", call.id) == tool.tool.output


@pytest.mark.data
def test_openhands_actions_keep_their_function_names(loaded: dict[str, list[WorkflowSpec]]) -> None:
    names = {c.name for w in loaded[OH] for t in _agent(w).model.scripted_turns for c in t.tool_calls}
    assert names == {"execute_bash", "str_replace_editor", "think", "finish"}
    for w in loaded[OH]:
        finish = [c for t in _agent(w).model.scripted_turns for c in t.tool_calls if c.name == "finish"]
        assert [_result(w, "finish", c.id) for c in finish] == [""] * len(finish)


@pytest.mark.data
def test_verifiers(loaded: dict[str, list[WorkflowSpec]]) -> None:
    for name, workflows in loaded.items():
        linear = {w.name: w for w in load_trajectories(Path(workflows[0].source["file"]), form="linear")}
        for w in workflows:
            old = linear[w.name].verifiers
            assert [(v.type, v.name, v.expect, v.item) for v in w.verifiers] == \
                   [(v.type, v.name, v.expect, v.item) for v in old], name
            recorded = len(_agent(w).model.scripted_turns) - w.source["closing_turn"]
            assert [v.step for v in w.verifiers if v.type == "context_requires"] == [f"{AGENT_STEP}:t{recorded}"]


# ---------------------------------------------------------------- the loop: partitions of every turn
def _id_map(rec: Recording) -> dict[str, str]:
    """Recorded entry id → the agent context's item id (a text answering no call joins the latest result)."""
    out: dict[str, str] = {}
    turn, last, system = 0, "", False
    for e in rec.entries:
        if isinstance(e, Turn):
            turn += 1
            out[e.id] = last = f"{AGENT_STEP}:t{turn}:msg"
        elif not turn:
            first_system = isinstance(e, Lit) and e.kind == "system" and not system
            system = system or first_system
            out[e.id] = "instructions" if first_system else e.id
        elif isinstance(e, Obs) and e.call is not None:
            out[e.id] = last = f"{AGENT_STEP}:t{turn}:c{e.call}:obs"
        else:
            out[e.id] = last
    return out


def _linear_candidates(w: WorkflowSpec) -> list[tuple[list[str], ContextPartition]]:
    outs: dict[str, str] = {}
    res = []
    for s in w.steps:
        if isinstance(s, ModelStep):
            cands = turn_candidates(model_items(s, w, outs), TextFacts(DEFAULT_COUNTER))
            res.append(([c.id for c in cands], pack(cands, policy_for(s, w)).partition))
            outs[s.id] = s.model.output or ""
        else:
            assert isinstance(s, ToolStep)
            outs[s.id] = s.tool.output or ""
    return res


@pytest.mark.data
@pytest.mark.parametrize("name", sorted(FILES))
def test_every_turn_packs_the_same_items_as_the_linear_replay(data_dir: Path, name: str) -> None:
    """Candidates of turn t = instructions, task, each earlier assistant message and tool result: the same items
    the linear form's model step t had (ids mapped); the partition is over them, instructions and task packed."""
    limit = 25 if name == TAU else None
    linear = load_trajectories(data_dir / name, form="linear", limit=limit)
    agent = load_trajectories(data_dir / name, limit=limit)
    for rec, wl, wa in zip(_recordings(data_dir / name), linear, agent, strict=False):
        state = Sim(wa, {}).run(max_actions=10_000)
        assert state.status == "verifying", wa.name
        attempts = state.active.attempts
        ids = _id_map(rec)
        old = _linear_candidates(wl)
        task = next(c.id for c in _agent(wa).context if c.kind == "task")
        for t, (old_ids, _) in enumerate(old, 1):
            part = attempts[f"{AGENT_STEP}:t{t}"][-1].context  # type: ignore[index]
            assert part is not None
            buckets = [*part.packed, *part.available, *part.dropped]
            assert len(buckets) == len(set(buckets)) == len({ids[i] for i in old_ids}), (wa.name, t)
            assert set(buckets) == {ids[i] for i in old_ids}, (wa.name, t)
            assert task in part.packed and ("instructions" in part.packed) == bool(_agent(wa).instructions)
        assert len(attempts) == len(_agent(wa).model.scripted_turns) + sum(
            len(x.tool_calls) for x in _agent(wa).model.scripted_turns)


# ---------------------------------------------------------------- synthetic recordings (no data needed)
def _write(tmp_path: Path, name: str, doc: Any) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("final_observation", [True, False])
def test_synthetic_mini_closing_turn(tmp_path: Path, final_observation: bool) -> None:
    doc = _mini(3)
    if not final_observation:
        doc["messages"].pop()
    (w,) = load_trajectories(_write(tmp_path, "run.traj.json", doc))
    turns = _agent(w).model.scripted_turns
    assert w.source["closing_turn"] is final_observation
    assert len(turns) == 3 + final_observation
    assert [len(t.tool_calls) for t in turns] == ([1, 1, 1, 0] if final_observation else [1, 1, 0])
    assert [c.id for t in turns for c in t.tool_calls] == [f"call_t{n}_0" for n in range(1, 3 + final_observation)]
    if final_observation:
        assert turns[-1].text == CLOSING_TEXT and turns[-1].usage is not None and turns[-1].usage.input_tokens == 0
    state = Sim(w, {}).run()
    assert state.status == "verifying"


def test_synthetic_tau_repeated_ids_unanswered_text_and_uncaused_text(tmp_path: Path) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "a"}'}}
    traj = [{"role": "system", "content": "policy"}, {"role": "user", "content": "task"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "name": "lookup", "content": "A"},
            {"role": "assistant", "content": None, "tool_calls": [call]},  # the provider repeated the id
            {"role": "tool", "tool_call_id": "call_1", "name": "lookup", "content": "B"},
            {"role": "assistant", "content": "hello"},
            {"role": "assistant", "content": "done"}]  # a text turn followed by another turn
    (w,) = load_trajectories(_write(tmp_path, "m-airline.json", [{"traj": traj, "reward": 1.0, "task_id": 1}]))
    turns = _agent(w).model.scripted_turns
    assert [[(c.id, c.name) for c in t.tool_calls] for t in turns] == [
        [("call_1", "lookup")], [("call_t2_0", "lookup")], [("call_t3_0", RESPOND)], []]
    assert (_result(w, "lookup", "call_1"), _result(w, "lookup", "call_t2_0")) == ("A", "B")
    assert _result(w, RESPOND, "call_t3_0") == "" and turns[-1].text == "done" and not w.source["closing_turn"]
    assert _agent(w).instructions == "policy" and [c.id for c in _agent(w).context] == ["m0001"]
