"""Recorded agent trajectories → replayable Reel workflows (see docs/trajectories.md).

:func:`load_trajectories` reads one trajectory file, detects its format
(:func:`detect_format`) and returns one :class:`~shared.core.workflow.WorkflowSpec` per
recorded run in it. Pure: no NATS, no clock; the only I/O is reading the file and,
for mini-swe-agent, its companion SWE-bench ``report.json`` (the outcome label).

The mapping is the same for every format:

* each recorded model turn (assistant message) → a model step ``tNN-model`` with
  the ``replay`` adapter, ``output`` = the recorded text (tool calls rendered as
  ``<tool_call>{"name": …, "arguments": …}</tool_call>`` lines) and the recorded
  usage where the file has it;
* each environment answer to that turn (tool observation; in tau-bench also the
  simulated user's reply to a text turn) → a ``recorded`` tool step ``tNN-tool``;
* the candidate context of turn N = every earlier message, in order: literal
  ``text`` for what no step produced (``system``, ``task``, ``demo``, other
  ``message``s) and ``from_step`` references for earlier model outputs
  (kind ``output``) and tool results (kind ``observation``, or ``message`` for a
  simulated user). A workflow therefore grows O(n) with the turns, not O(n²).

Context item ids are stable across turns: ``m0003`` is message 3 of the file
(``e0042`` is OpenHands event 42), so partitions of successive turns can be diffed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec

from shared.core.errors import TrajectoryFormatError
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from shared.core.workflow import (
    ContextItemSpec,
    ModelSpec,
    ModelStep,
    PolicySpec,
    RecordedUsage,
    Step,
    ToolSpec,
    ToolStep,
    VerifierSpec,
    WorkflowSpec,
    encode_workflow,
    validate_workflow,
)

TrajectoryFormat = Literal["mini-swe-agent", "swe-agent", "tau-bench", "openhands"]
FORMATS: tuple[TrajectoryFormat, ...] = ("mini-swe-agent", "swe-agent", "tau-bench", "openhands")
MAX_WORKFLOW_BYTES = 8 * 1024 * 1024
"""Largest encoded workflow the loader returns (bytes); larger raises TrajectoryFormatError."""

PRIORITY = {"system": 3.0, "task": 2.0, "demo": 1.0}
"""Packing priority per context kind; every other kind is 0 (ties go to the more recent item)."""

EXCLUDED_KINDS = ("demo",)
"""Kinds the loader's policy drops outright (SWE-agent in-context demonstrations)."""

_EXPECTED = (
    "expected one of: mini-swe-agent (JSON object with `trajectory_format: \"mini-swe-agent-1\"` and `messages`), "
    "SWE-agent `.traj` (JSON object with `trajectory` and `history` lists), "
    "tau-bench (JSON list of episodes with `traj` and `reward`), "
    "OpenHands (JSONL, one record per line with `instance_id` and `history`)"
)
_T = TypeVar("_T")


# ---------------------------------------------------------------- file shapes (validated with msgspec at the edge)
class _Fn(msgspec.Struct):
    name: str = ""
    arguments: str | dict[str, Any] = ""


class _ToolCall(msgspec.Struct):
    function: _Fn
    id: str = ""


class _Msg(msgspec.Struct):
    """An OpenAI-style chat message (mini-swe-agent, tau-bench, OpenHands model responses)."""

    role: str = "assistant"
    content: str | list[Any] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    extra: dict[str, Any] = {}


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None


class _Choice(msgspec.Struct):
    message: _Msg


class _Response(msgspec.Struct):
    id: str = ""
    model: str = ""
    choices: list[_Choice] = []
    usage: _Usage | None = None


class _MiniTraj(msgspec.Struct):
    messages: list[_Msg]
    trajectory_format: str = ""
    instance_id: str | None = None
    info: dict[str, Any] = {}


class _SweMsg(msgspec.Struct):
    role: str
    content: str | list[Any]
    agent: str = "primary"
    is_demo: bool = False
    action: str | None = None


class _SweStep(msgspec.Struct):
    response: str = ""
    action: str = ""
    observation: str = ""


class _SweTraj(msgspec.Struct):
    trajectory: list[_SweStep]
    history: list[_SweMsg]
    info: dict[str, Any] = {}
    environment: str = ""


class _TauEpisode(msgspec.Struct):
    traj: list[_Msg]
    reward: float | None = None
    task_id: int | str | None = None
    trial: int | None = None


class _OhTcm(msgspec.Struct):
    function_name: str = ""
    tool_call_id: str = ""
    model_response: _Response = msgspec.field(default_factory=_Response)


class _OhEvent(msgspec.Struct):
    id: int
    source: str = ""
    message: str = ""
    action: str | None = None
    observation: str | None = None
    cause: int | None = None
    content: str = ""
    args: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    tool_call_metadata: _OhTcm | None = None


class _OhRecord(msgspec.Struct):
    instance_id: str
    history: list[_OhEvent]
    metadata: dict[str, Any] = {}
    error: str | None = None


# ---------------------------------------------------------------- the format-neutral recording
class _Lit(msgspec.Struct, frozen=True):
    """A message no step produced: literal text in every later context."""

    id: str
    kind: str
    text: str


class _Turn(msgspec.Struct, frozen=True):
    """A recorded model turn."""

    id: str
    output: str
    usage: RecordedUsage | None = None


class _Obs(msgspec.Struct, frozen=True):
    """The environment's answer to the latest turn (a recorded tool step)."""

    id: str
    name: str
    input: str
    output: str
    kind: str = "observation"


_Entry = _Lit | _Turn | _Obs


class _Recording(msgspec.Struct, kw_only=True):
    name: str
    where: str
    model: str
    entries: list[_Entry]
    source: dict[str, Any]
    outcome: bool | None = None


# ---------------------------------------------------------------- public API
def detect_format(data: Any) -> TrajectoryFormat:
    """The trajectory format of already-decoded JSON (a JSONL file decodes to a list of records).

    Args:
        data: the decoded document: a dict (mini-swe-agent, SWE-agent, a one-line
            OpenHands file) or a list (tau-bench episodes, OpenHands JSONL records).

    Returns:
        One of :data:`FORMATS`.

    Raises:
        TrajectoryFormatError: unknown shape; the message says what was found and what is expected.
    """
    if isinstance(data, dict):
        tf = data.get("trajectory_format")
        info = data.get("info")
        if (isinstance(tf, str) and tf.startswith("mini-swe-agent")) or (
            "messages" in data and isinstance(info, dict) and "mini_version" in info
        ):
            return "mini-swe-agent"
        if isinstance(data.get("trajectory"), list) and isinstance(data.get("history"), list):
            return "swe-agent"
        if isinstance(data.get("history"), list) and "instance_id" in data:
            return "openhands"
    elif isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        if all(isinstance(x.get("traj"), list) for x in data):
            return "tau-bench"
        if all(isinstance(x.get("history"), list) and "instance_id" in x for x in data):
            return "openhands"
    raise TrajectoryFormatError(f"unknown trajectory format: found {_shape(data)}; {_EXPECTED}")


def load_trajectories(
    path: str | Path, *, budget_tokens: int = 8000, limit: int | None = None
) -> list[WorkflowSpec]:
    """Turn a recorded trajectory file into replayable workflows, one per recorded run.

    Args:
        path: a mini-swe-agent ``*.traj.json``, a SWE-agent ``*.traj``, a tau-bench
            episode list (``*.json``) or an OpenHands ``output.jsonl``; the format is detected.
        budget_tokens: context budget of every model step (tokens); the per-item cap
            is a quarter of it, but never below the largest system/task item.
        limit: keep only the first ``limit`` runs of a multi-run file (None = all).

    Returns:
        Validated workflows in file order. ``name`` is the instance id (tau-bench:
        ``<file stem>-task<id>-trial<n>``); ``source`` holds ``file``, ``format``,
        ``agent``, ``model``, ``instance_id``, ``exit_status`` and ``outcome``
        (bool, or None when the file has no label). With a label, a
        ``recorded_outcome`` verifier expects it.

    Raises:
        TrajectoryFormatError: unreadable file, invalid JSON/JSONL, unknown format, a
            recording that does not match its format's schema, a run with no model
            turns, or a workflow over :data:`MAX_WORKFLOW_BYTES`. The message names the file.
        ValueError: ``budget_tokens < 1`` or ``limit < 0``.
    """
    if budget_tokens < 1:
        raise ValueError("budget_tokens must be >= 1")
    if limit is not None and limit < 0:
        raise ValueError("limit must be >= 0")
    p = Path(path)
    data = _read(p)
    try:
        fmt = detect_format(data)
    except TrajectoryFormatError as exc:
        raise TrajectoryFormatError(f"{p}: {exc.message}") from None
    recordings = _PARSERS[fmt](data, p, limit)
    return [_build(r, budget_tokens, DEFAULT_COUNTER) for r in recordings]


# ---------------------------------------------------------------- reading
def _read(p: Path) -> Any:
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise TrajectoryFormatError(f"cannot read trajectory {p}: {exc.strerror or exc}") from None
    if not raw.strip():
        raise TrajectoryFormatError(f"{p}: empty file; {_EXPECTED}")
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        whole = str(exc)
    lines = [ln for ln in raw.splitlines() if ln.strip()]
    if len(lines) > 1:
        records = []
        for line in lines:
            try:
                records.append(msgspec.json.decode(line))
            except msgspec.DecodeError:
                break
        else:
            return records
    raise TrajectoryFormatError(f"{p}: not JSON or JSON Lines ({whole}); {_EXPECTED}")


def _shape(data: Any) -> str:
    if isinstance(data, dict):
        keys = ", ".join(list(map(str, data))[:8]) or "none"
        return f"a JSON object with keys {keys}"
    if isinstance(data, list):
        first = f"; first item: {_shape(data[0])}" if data else ""
        return f"a JSON list of {len(data)} items{first}"
    return f"a JSON {type(data).__name__}"


def _convert(data: Any, typ: type[_T], where: str, fmt: str) -> _T:
    try:
        return msgspec.convert(data, typ)
    except msgspec.ValidationError as exc:
        raise TrajectoryFormatError(f"{where}: looks like {fmt} but does not match its schema: {exc}") from None


def _text(content: str | list[Any] | None) -> str:
    """Message content as text; a list of content parts keeps its ``text`` parts."""
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)


def _args_text(arguments: str | dict[str, Any]) -> str:
    return arguments if isinstance(arguments, str) else msgspec.json.encode(arguments).decode()


def _render(content: str, calls: Sequence[_ToolCall]) -> str:
    """A model output as text: its content, then one ``<tool_call>`` line per native tool call."""
    parts = [content] if content else []
    for c in calls:
        args: Any = c.function.arguments
        if isinstance(args, str) and (parsed := _maybe_json(args)) is not None:
            args = parsed
        call = msgspec.json.encode({"name": c.function.name, "arguments": args}).decode()
        parts.append(f"<tool_call>{call}</tool_call>")
    return "\n".join(parts)


def _response(raw: Any) -> _Response | None:
    try:
        return msgspec.convert(raw, _Response) if isinstance(raw, dict) else None
    except msgspec.ValidationError:
        return None


def _usage(resp: _Response | None) -> RecordedUsage | None:
    u = resp.usage if resp else None
    if u is None or (u.prompt_tokens is None and u.completion_tokens is None):
        return None
    return RecordedUsage(input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens, cost_usd=u.cost or 0.0)


def _dig(d: Any, *keys: str) -> Any:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


# ---------------------------------------------------------------- mini-swe-agent
_BASH = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)


def _parse_mini(data: Any, p: Path, limit: int | None) -> list[_Recording]:
    t = _convert(data, _MiniTraj, str(p), "a mini-swe-agent trajectory")
    instance = t.instance_id or p.name.removesuffix(".json").removesuffix(".traj")
    model = _str_or_none(_dig(t.info, "config", "model", "model_name")) or ""
    entries: list[_Entry] = []
    prev = ""
    for i, m in enumerate(t.messages):
        mid, text = f"m{i:04d}", _text(m.content)
        if m.role == "assistant":
            resp = _response(m.extra.get("response"))
            model = model or (resp.model if resp else "")
            entries.append(_Turn(mid, text, _usage(resp)))
        elif m.role == "user" and prev == "assistant":
            cmds = _BASH.findall(entries[-1].output if isinstance(entries[-1], _Turn) else "")
            entries.append(_Obs(mid, "bash", cmds[0].strip() if len(cmds) == 1 else "", text))
        else:
            kind = m.role if m.role == "system" else "task" if not _has_kind(entries, "task") else "message"
            entries.append(_Lit(mid, kind, text))
        prev = m.role
    outcome, label_file = _swebench_label(p, instance)
    version = _str_or_none(t.info.get("mini_version"))
    source = _source(p, "mini-swe-agent", f"mini-swe-agent {version}" if version else "mini-swe-agent", model,
                     instance, _str_or_none(t.info.get("exit_status")), outcome)
    if label_file:
        source["outcome_from"] = label_file
    return [_Recording(name=instance, where=str(p), model=model, entries=entries, source=source, outcome=outcome)]


def _has_kind(entries: list[_Entry], kind: str) -> bool:
    return any(isinstance(e, _Lit) and e.kind == kind for e in entries)


def _swebench_label(p: Path, instance: str) -> tuple[bool | None, str | None]:
    """``resolved`` from a SWE-bench harness report beside the trajectory, if there is one.

    Looked for: ``<x>.report.json`` for ``<x>.traj.json``, ``<instance>.report.json``,
    ``report.json`` in the same folder, and the harness layout ``../../logs/<instance>/report.json``.
    A report is flat (``{resolved, …}``, only accepted from the first two names) or keyed by instance id.
    """
    named = [p.with_name(p.name.removesuffix(".traj.json") + ".report.json"), p.with_name(f"{instance}.report.json")]
    shared = [p.with_name("report.json"), p.parent.parent.parent / "logs" / instance / "report.json"]
    for cand in dict.fromkeys([*named, *shared]):
        if cand == p or not cand.is_file():
            continue
        try:
            report = msgspec.json.decode(cand.read_bytes())
        except (OSError, msgspec.DecodeError) as exc:
            raise TrajectoryFormatError(f"{cand}: unreadable SWE-bench report beside {p.name}: {exc}") from None
        resolved = _dig(report, instance, "resolved")
        if resolved is None and cand in named:
            resolved = _dig(report, "resolved")
        if isinstance(resolved, bool):
            return resolved, str(cand)
    return None, None


# ---------------------------------------------------------------- SWE-agent
_SWEBENCH_ID = re.compile(r"([A-Za-z0-9-]+__[A-Za-z0-9_.-]+-\d+)$")


def _parse_swe(data: Any, p: Path, limit: int | None) -> list[_Recording]:
    t = _convert(data, _SweTraj, str(p), "a SWE-agent trajectory")
    hist = [m for m in t.history if m.agent == "primary"]
    entries: list[_Entry] = []
    prev = ""
    for i, m in enumerate(hist):
        mid, text = f"m{i:04d}", _text(m.content)
        if m.role == "assistant":
            entries.append(_Turn(mid, text))
        elif m.role == "user" and prev == "assistant" and not m.is_demo:
            entries.append(_Obs(mid, "bash", _swe_action(hist[i - 1]), text))
        else:
            kind = ("system" if m.role == "system" else "demo" if m.is_demo
                    else "task" if not _has_kind(entries, "task") else "message")
            entries.append(_Lit(mid, kind, text))
        prev = m.role
    last = t.trajectory[-1] if t.trajectory else None
    if prev == "assistant" and last is not None and last.response == _text(hist[-1].content):
        entries.append(_Obs(f"m{len(hist):04d}", "bash", last.action.rstrip("\n"), last.observation))
    found = _SWEBENCH_ID.search(p.name.removesuffix(".traj"))
    instance = found.group(1) if found else p.stem
    agent = f"SWE-agent ({t.environment})" if t.environment else "SWE-agent"
    source = _source(p, "swe-agent", agent, "", instance, _str_or_none(t.info.get("exit_status")), None)
    source["trajectory_steps"] = len(t.trajectory)
    return [_Recording(name=instance, where=str(p), model="", entries=entries, source=source)]


def _swe_action(m: _SweMsg) -> str:
    return (m.action or "").rstrip("\n")


# ---------------------------------------------------------------- tau-bench
_TAU_DOMAINS = ("airline", "retail")


def _parse_tau(data: Any, p: Path, limit: int | None) -> list[_Recording]:
    episodes = data[:limit] if limit is not None else data
    stem = p.stem.removeprefix("taubench_").removeprefix("taubench-")
    domain = next((d for d in _TAU_DOMAINS if stem.endswith(f"-{d}")), None)
    model = stem.removesuffix(f"-{domain}") if domain else ""
    return [_tau_episode(raw, p, i, model, domain) for i, raw in enumerate(episodes)]


def _tau_episode(raw: Any, p: Path, index: int, model: str, domain: str | None) -> _Recording:
    where = f"{p} (episode {index})"
    ep = _convert(raw, _TauEpisode, where, "a tau-bench episode")
    entries: list[_Entry] = []
    calls: dict[str, _ToolCall] = {}
    prev: _Msg | None = None
    for i, m in enumerate(ep.traj):
        mid, text = f"m{i:04d}", _text(m.content)
        if m.role == "assistant":
            calls = {c.id: c for c in m.tool_calls or []}
            entries.append(_Turn(mid, _render(text, m.tool_calls or [])))
        elif m.role == "tool" and any(isinstance(e, _Turn) for e in entries):
            c = calls.get(m.tool_call_id or "")
            name = m.name or (c.function.name if c else "tool")
            entries.append(_Obs(mid, name, _args_text(c.function.arguments) if c else "", text))
        elif m.role == "user" and prev is not None and prev.role == "assistant" and not prev.tool_calls:
            entries.append(_Obs(mid, "respond", "", text, kind="message"))
        else:
            kind = ("system" if m.role == "system" else "task" if m.role == "user" and not _has_kind(entries, "task")
                    else "observation" if m.role == "tool" else "message")
            entries.append(_Lit(mid, kind, text))
        prev = m
    outcome = None if ep.reward is None else abs(ep.reward - 1.0) < 1e-6
    instance = f"task{ep.task_id}-trial{ep.trial}" if ep.task_id is not None else f"episode{index}"
    source = _source(p, "tau-bench", "tau-bench tool-calling agent", model, instance, None, outcome)
    source.update(task_id=ep.task_id, trial=ep.trial, reward=ep.reward, domain=domain, episode=index)
    if outcome is not None:
        source["outcome_from"] = "reward"
    return _Recording(name=f"{p.stem}-{instance}", where=where, model=model, entries=entries, source=source,
                      outcome=outcome)


# ---------------------------------------------------------------- OpenHands
def _parse_openhands(data: Any, p: Path, limit: int | None) -> list[_Recording]:
    records = data if isinstance(data, list) else [data]
    if limit is not None:
        records = records[:limit]
    return [_oh_record(raw, p, i) for i, raw in enumerate(records)]


def _oh_record(raw: Any, p: Path, index: int) -> _Recording:
    where = f"{p} (record {index + 1})"
    r = _convert(raw, _OhRecord, where, "an OpenHands output record")
    entries: list[_Entry] = []
    tools: dict[int, tuple[str, str]] = {}
    responses: set[str] = set()
    model = ""
    for ev in r.history:
        eid = f"e{ev.id:04d}"
        tcm = ev.tool_call_metadata
        if ev.action == "system" or (ev.action == "message" and ev.source == "user"):
            text = _str_or_none(ev.args.get("content")) or ev.message
            kind = "system" if ev.action == "system" else "task" if not _has_kind(entries, "task") else "message"
            entries.append(_Lit(eid, kind, text))
        elif ev.action is not None and ev.source == "agent" and tcm is not None:
            resp = tcm.model_response
            if resp.id not in responses or not resp.id:
                responses.add(resp.id)
                model = model or resp.model
                msg = resp.choices[0].message if resp.choices else _Msg()
                entries.append(_Turn(eid, _render(_text(msg.content), msg.tool_calls or []), _usage(resp)))
            tools[ev.id] = (tcm.function_name, _oh_input(tcm))
        elif ev.action == "message" and ev.source == "agent":
            entries.append(_Turn(eid, _str_or_none(ev.args.get("content")) or ev.message))
        elif ev.observation is not None and ev.cause in tools:
            name, tool_input = tools.pop(ev.cause)
            entries.append(_Obs(eid, name or ev.observation, tool_input, ev.content))
        elif ev.observation is not None and (text := _oh_obs_text(ev)):
            entries.append(_Lit(eid, "message" if ev.observation == "recall" else "observation", text))
    model = model or _str_or_none(_dig(r.metadata, "llm_config", "model")) or ""
    exit_status = "error" if r.error else "finished" if any(e.action == "finish" for e in r.history) else None
    agent = _str_or_none(r.metadata.get("agent_class")) or "OpenHands"
    source = _source(p, "openhands", f"OpenHands {agent}", model, r.instance_id, exit_status, None)
    source.update(error=r.error, record=index + 1)
    return _Recording(name=r.instance_id, where=where, model=model, entries=entries, source=source)


def _oh_input(tcm: _OhTcm) -> str:
    """The recorded tool call: the shell command for ``execute_bash``, else the JSON arguments."""
    msg = tcm.model_response.choices[0].message if tcm.model_response.choices else _Msg()
    call = next((c for c in msg.tool_calls or [] if c.id == tcm.tool_call_id), None)
    if call is None:
        return ""
    args = call.function.arguments
    if tcm.function_name == "execute_bash":
        parsed = args if isinstance(args, dict) else _maybe_json(args)
        if isinstance(parsed, dict) and isinstance(parsed.get("command"), str):
            return str(parsed["command"])
    return _args_text(args)


def _maybe_json(s: str) -> Any:
    try:
        return msgspec.json.decode(s)
    except msgspec.DecodeError:
        return None


def _oh_obs_text(ev: _OhEvent) -> str:
    """An observation no recorded tool call caused (recall, format errors) as the model saw it, roughly."""
    parts = [ev.content or ev.message]
    for k in ev.extras.get("microagent_knowledge") or ():
        if isinstance(k, dict) and isinstance(k.get("content"), str):
            parts.append(k["content"])
    return "\n\n".join(x for x in parts if x)


_PARSERS: dict[str, Callable[[Any, Path, int | None], list[_Recording]]] = {
    "mini-swe-agent": _parse_mini, "swe-agent": _parse_swe, "tau-bench": _parse_tau, "openhands": _parse_openhands,
}


# ---------------------------------------------------------------- building the workflow
def _source(p: Path, fmt: str, agent: str, model: str, instance: str, exit_status: str | None,
            outcome: bool | None) -> dict[str, Any]:
    return {"file": str(p), "format": fmt, "agent": agent, "model": model or None, "instance_id": instance,
            "exit_status": exit_status, "outcome": outcome}


def _policy(entries: list[_Entry], budget_tokens: int, counter: TokenCounter) -> PolicySpec:
    """Exclude demos, dedupe, cap items at a quarter of the budget (never below the system/task items)."""
    instr = max((counter.count(e.text) for e in entries if isinstance(e, _Lit) and e.kind in ("system", "task")),
                default=0)
    cap = min(budget_tokens, max(budget_tokens // 4, instr))
    return PolicySpec(exclude_kinds=EXCLUDED_KINDS, max_item_tokens=cap, dedupe=True)


def _build(rec: _Recording, budget_tokens: int, counter: TokenCounter) -> WorkflowSpec:
    turns = sum(isinstance(e, _Turn) for e in rec.entries)
    if turns == 0:
        raise TrajectoryFormatError(f"{rec.where}: no recorded model turns (no assistant message)")
    width = max(2, len(str(turns)))
    policy = _policy(rec.entries, budget_tokens, counter)
    steps: list[Step] = []
    history: list[ContextItemSpec] = []
    n = tools = 0
    for e in rec.entries:
        if isinstance(e, _Turn):
            n, tools = n + 1, 0
            sid = f"t{n:0{width}d}-model"
            model = ModelSpec(adapter="replay", output=e.output, usage=e.usage, name=rec.model)
            steps.append(ModelStep(id=sid, model=model, context=tuple(history), policy=policy))
            history.append(ContextItemSpec(id=e.id, from_step=sid, kind="output"))
        elif isinstance(e, _Obs) and n > 0:
            tools += 1
            sid = f"t{n:0{width}d}-tool" + (f"-{tools}" if tools > 1 else "")
            steps.append(ToolStep(id=sid, tool=ToolSpec(type="recorded", name=e.name, input=e.input, output=e.output)))
            history.append(ContextItemSpec(id=e.id, from_step=sid, kind=e.kind))
        else:
            kind = e.kind
            history.append(ContextItemSpec(id=e.id, text=e.output if isinstance(e, _Obs) else e.text, kind=kind,
                                           priority=PRIORITY.get(kind, 0.0)))
    verifiers: tuple[VerifierSpec, ...] = ()
    if rec.outcome is not None:
        verifiers += (VerifierSpec(type="recorded_outcome", name="recorded_outcome", expect=rec.outcome),)
    task = next((h.id for h in history if h.kind == "task"), None)
    if task is not None:  # did the agent still have the task in view when it decided its last action?
        last_model = next(s.id for s in reversed(steps) if isinstance(s, ModelStep))
        verifiers += (VerifierSpec(type="context_requires", name="task-in-final-context", step=last_model,
                                   item=task),)
    src = rec.source
    desc = (f"Replay of {src['agent']}{' / ' + rec.model if rec.model else ''} on {src['instance_id']}: "
            f"{turns} model turns" + ("" if rec.outcome is None else f", recorded outcome {rec.outcome}"))
    spec = validate_workflow(WorkflowSpec(
        name=rec.name, description=desc, budget_tokens=budget_tokens, steps=tuple(steps), verifiers=verifiers,
        labels={"format": str(src["format"])}, source=src,
    ))
    size = len(encode_workflow(spec))
    if size > MAX_WORKFLOW_BYTES:
        raise TrajectoryFormatError(f"{rec.where}: workflow {rec.name} would be {size} bytes "
                                    f"(> {MAX_WORKFLOW_BYTES}); the recording is too large to replay as one run")
    return spec
