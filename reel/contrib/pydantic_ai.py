"""Pydantic AI on Reel: ``await run(agent, prompt, client=client)`` in place of ``agent.run(prompt)``.

The agent carries :class:`ReelDurability`, Pydantic AI's own durable-execution extension point (a
``BaseDurabilityCapability`` with a callable operation backend, as its Temporal, DBOS and Prefect
integrations are built): every model request and function-tool call the agent makes goes through the
backend, and while :func:`run` drives the agent the backend makes each a unit of a Reel run of one
``kind: agent`` step (the agent's name as its step id), the two in lockstep:

- model request *n* is Reel turn *n* (``<step>:t<n>``): when Reel's executor starts the turn, its model
  adapter (``reel.contrib.pydantic_ai:bridge_model``) lets the agent's request run and records, as the
  turn's output message, the messages Pydantic AI sent and its ``ModelResponse`` (JSON);
- each function-tool call is Reel call ``<step>:t<n>:c<i>`` (the turn's calls in tool-call-id order):
  Reel records the intent, then lets the agent's call run, then records its result;
- a tool with ``requires_approval`` is a Reel input request (``reel pending`` / ``reel approve`` /
  ``reel reject``): Pydantic AI defers the call (``DeferredToolRequests``), :func:`run` waits for Reel's
  decision and continues the agent with it (``DeferredToolResults``: approved, with edited arguments
  if the approver edited them, or denied with the rejection's text).

Re-running :func:`run` with the same ``key`` after the process died resumes the Reel run: every request and
call already recorded is answered from the run's log (the model and the tool are not asked again), the rest
run as before. Code outside model requests and tool calls (instructions functions, output validators,
hooks) runs again. After a rewind of the Reel run (:func:`run_id` of the key) at ``<step>:t1``, the same
call runs the agent again on the new branch.

Needs the ``pydantic-ai-slim`` package (``pip install 'reel[pydantic-ai]'``); docs/integrations.md.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, FunctionToolset, ToolApproved, ToolDenied
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
)
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import AbstractToolset

from reel._agent import Agent as ReelAgent
from reel._client import Client
from reel._tool import FunctionTool as ReelFunctionTool
from reel.contrib._bridge import (
    Bridges,
    Journal,
    Proxies,
    TurnCalls,
    call_of,
    mirror_agent,
    model_error,
    output_text,
    read_journal,
    run_key,
    turn_response,
    watch_step,
)
from reel.contrib._bridge import proxy_path as _proxy_path
from reel.contrib._bridge import run_id as run_id
from reel.shared.core.chat.messages import ChatRequest, ChatResponse, ToolCall
from reel.shared.core.errors import ModelError
from reel.shared.core.input import requestfold
from reel.shared.core.pack.tokencount import TokenCounter
from reel.shared.core.workflow.agentspec import AgentToolSpec
from reel.shared.core.workflow.spec import ModelSpec

ADAPTER = "reel.contrib.pydantic_ai:bridge_model"
"""The ``module:factory`` model adapter of the Reel run (what its workflow names)."""

RECORD_KEY = "pydantic_ai"
"""The key of a turn's output message under which Pydantic AI's request and response are recorded."""

BRIDGE_WAIT_S = 120.0
"""How long Reel's executor waits for the agent driven by :func:`run` to reach a turn or call (s) before
failing the attempt (retryable: the runner of a resumed run may be starting)."""


class _Unit:
    """One model request or tool call, met by both sides: the agent reaches it (``reached``), Reel's executor
    lets it run (``go``), the agent's side hands back its result or error (``result``)."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.reached: asyncio.Future[Any] = loop.create_future()
        self.go: asyncio.Future[None] = loop.create_future()
        self.result: asyncio.Future[Any] = loop.create_future()


class _Bridge(TurnCalls):
    """The meeting point of one Reel run's executor side and the agent driven against it (one per run id)."""

    def __init__(self) -> None:
        super().__init__()
        self.units: dict[str, _Unit] = {}
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def unit(self, key: str) -> _Unit:
        """The unit of turn ``t<n>`` or of the tool call of that id."""
        return self.units.setdefault(key, _Unit())

    async def reached(self, key: str, what: str, run_id: str) -> _Unit | None:
        """The unit once the agent reached it, or ``None`` when the agent ended without it.

        Raises:
            ModelError: the agent did not reach it within :data:`BRIDGE_WAIT_S` (``runner_absent``, retryable).
        """
        unit = self.unit(key)
        done, _ = await asyncio.wait({unit.reached, self.ended}, timeout=BRIDGE_WAIT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        if unit.reached in done:
            return unit
        if self.ended in done:
            return None
        raise ModelError(f"no Pydantic AI agent reached {what} of run {run_id} within {BRIDGE_WAIT_S:g} s "
                         "(re-run reel.contrib.pydantic_ai.run with its key to resume it)",
                         kind="runner_absent", retryable=True)


_BRIDGES: Bridges[_Bridge] = Bridges(_Bridge)


def _tool_call_ids(payload: Any, tools: frozenset[str] | None) -> list[tuple[str, str, str]]:
    """``(id, name, arguments JSON)`` of a recorded ``ModelResponse``'s function-tool calls, in id order (output
    tools and unknown names left out: Reel runs only the calls it has tools for)."""
    calls = []
    for part in payload.get("parts", ()):
        if part.get("part_kind") != "tool-call" or (tools is not None and part.get("tool_name") not in tools):
            continue
        args = part.get("args")
        calls.append((str(part.get("tool_call_id")), str(part["tool_name"]),
                      args if isinstance(args, str) else json.dumps(args or {})))
    return sorted(calls)


class _Drive:
    """One agent driven against one Reel run: its turn counter, the journal and the bridge."""

    def __init__(self, run_id: str, journal: Journal[Any, Any], bridge: _Bridge, tools: frozenset[str]) -> None:
        self.run_id, self.journal, self.bridge, self.tools = run_id, journal, bridge, tools
        self.turn = 0

    async def model_request(self, messages: Any, body: Callable[[], Awaitable[object]]) -> object:
        """Model request *n*: its recorded response, else run once Reel's turn *n* lets it."""
        self.turn += 1
        turn = self.turn
        recorded = self.journal.turns.get(turn)
        if recorded is not None:
            self.bridge.set_calls(turn, [c[0] for c in _tool_call_ids(recorded, self.tools)])
            return recorded
        sent = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json") if messages is not None else []
        payload = await self._unit(f"t{turn}", sent, body)
        self.bridge.set_calls(turn, [c[0] for c in _tool_call_ids(payload, self.tools)])
        return payload

    async def tool_call(self, call_id: str, body: Callable[[], Awaitable[object]]) -> object:
        """A function-tool call: its recorded result, else run once Reel's call step of it lets it."""
        recorded = self.journal.calls.get(call_id)
        if recorded is not None:
            return recorded
        return await self._unit(call_id, None, body)

    async def _unit(self, key: str, sent: Any, body: Callable[[], Awaitable[object]]) -> object:
        unit = self.bridge.unit(key)
        unit.reached.set_result(sent)
        await unit.go
        try:
            payload = await body()
        except BaseException as exc:
            if not unit.result.done():
                unit.result.set_exception(exc if isinstance(exc, Exception) else RuntimeError("cancelled"))
            raise
        unit.result.set_result(payload)
        return payload


_DRIVE: ContextVar[_Drive | None] = ContextVar("reel_pydantic_ai_drive", default=None)


class _Backend(JournalCallableOperationBackend[None]):
    """Model requests and function-tool calls as Reel turns and call steps; every other operation (argument
    validation, message compaction) runs in place."""

    async def execute(self, *, operation_id: DurableOperationId, name: str, body: Callable[[], Awaitable[object]],
                      cache_key: tuple[object, ...], config: None) -> object:
        drive = _DRIVE.get()
        if drive is None:
            return await body()
        if isinstance(operation_id, ModelRequestId):
            if operation_id.streaming:
                raise UserError("reel.contrib.pydantic_ai runs agent.run's non-streamed requests only")
            return await drive.model_request(cache_key[1], body)
        if isinstance(operation_id, ToolsetCallToolId) and operation_id.toolset_kind == "function":
            ctx = next(c for c in cache_key if isinstance(c, RunContext))
            return await drive.tool_call(str(ctx.tool_call_id), body)
        return await body()


class ReelDurability(BaseDurabilityCapability[Any]):
    """The capability that makes a Pydantic AI agent durable on Reel: ``Agent(…, capabilities=[ReelDurability()])``.

    Outside :func:`run` the agent runs as it would without it; under :func:`run` its model requests and
    function-tool calls are Reel turns and call steps (module docs). The agent needs a ``name`` (or pass
    ``name=``) and function tools only (its own ``tools=`` and ``FunctionToolset``\\ s with an ``id``).
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="Reel", durable_unit_noun="step", durable_container_noun="run", codec=JSON_CODEC,
        wrapped_toolset_kinds=frozenset({"function"}), toolset_lifecycles={"function": "enter-always"},
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        journal_discovery=False, sequential_tools_in_durable_context=False)

    @property
    def in_durable_context(self) -> bool:
        return _DRIVE.get() is not None

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        return _Backend(agent_name=self.name, default_model_id=self.default_model_id,
                        config=RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None))


class _BridgeModel:
    """The Reel model adapter of a Pydantic AI run: turn *n* lets the agent's *n*-th model request run."""

    def __init__(self, spec: ModelSpec, counter: TokenCounter) -> None:
        self.name = spec.name or "pydantic-ai"

    async def complete_chat(self, request: ChatRequest) -> ChatResponse:
        """Let the agent's request of this turn run; its response is the turn's.

        Raises:
            ModelError: no agent reached the turn within :data:`BRIDGE_WAIT_S` (retryable, ``runner_absent``);
                the model raised (retryable unless it is a 4xx other than 429: ``model_error``).
        """
        bridge = _BRIDGES.of(request.run_id)
        unit = await bridge.reached(f"t{request.turn}", f"turn {request.turn}", request.run_id)
        if unit is None:  # the agent ended without this turn (its last call's result was final)
            return ChatResponse(text=bridge.ended.result(), finish_reason="stop", model=self.name)
        if not unit.go.done():
            unit.go.set_result(None)
        try:
            payload = await asyncio.shield(unit.result)
        except Exception as exc:  # the agent raises it too (as agent.run would); Reel records the failure
            raise model_error(exc) from exc
        return _response(payload, unit.reached.result(), _TOOLS.get(request.run_id), self.name)


def _response(payload: Any, sent: Any, tools: frozenset[str] | None, name: str) -> ChatResponse:
    """Reel's record of a ``ModelResponse`` (JSON): its text, its function-tool calls, the request and response."""
    calls = tuple(ToolCall(id=i, name=n, arguments=a) for i, n, a in _tool_call_ids(payload, tools))
    text = "".join(str(p.get("content", "")) for p in payload.get("parts", ()) if p.get("part_kind") == "text")
    usage = payload.get("usage") or {}
    return turn_response(text, calls, RECORD_KEY, {"request": sent, "response": payload},
                         input_tokens=int(usage.get("input_tokens", 0)),
                         output_tokens=int(usage.get("output_tokens", 0)),
                         model=str(payload.get("model_name") or name))


def bridge_model(spec: ModelSpec, counter: TokenCounter) -> _BridgeModel:
    """The ``module:factory`` adapter Reel's executor loads for a Pydantic AI run (:data:`ADAPTER`)."""
    return _BridgeModel(spec, counter)


_TOOLS: dict[str, frozenset[str]] = {}
"""The function-tool names of each driven run (the calls of a response Reel runs)."""


async def _proxy_call(tool_name: str, idempotency_key: str) -> str:
    """What Reel's call step of ``tool_name`` runs: it lets the agent's call run and returns its result."""
    run_id, turn, index = call_of(idempotency_key)
    bridge = _BRIDGES.of(run_id)
    try:
        call_id = await bridge.call_id(turn, index, BRIDGE_WAIT_S)
    except TimeoutError:
        raise RuntimeError(f"no Pydantic AI agent made turn {turn} of run {run_id} within {BRIDGE_WAIT_S:g} s"
                           ) from None
    unit = await bridge.reached(call_id, f"call {tool_name} ({call_id})", run_id)
    if unit is None:
        raise RuntimeError(f"the Pydantic AI agent of run {run_id} ended without calling {tool_name} ({call_id})")
    if not unit.go.done():
        unit.go.set_result(None)
    return json.dumps(await asyncio.shield(unit.result))


_PROXIES: Proxies[str] = Proxies()
"""One proxy function per tool name."""


def proxy_path(tool_name: str) -> str:
    """The ``python:`` path the Reel tool of ``tool_name`` names its proxy by."""
    return _proxy_path(__name__, "pyd_tool_", tool_name)


def _proxy(spec: AgentToolSpec) -> ReelFunctionTool[..., Any]:
    """The Reel function tool of ``spec``: a call of it runs :func:`_proxy_call`."""
    return _PROXIES.tool(spec.name, spec, functools.partial(_proxy_call, spec.name))


def _function_toolsets(agent: Agent[Any, Any]) -> list[FunctionToolset[Any]]:
    """The agent's leaf toolsets, each a ``FunctionToolset``.

    Raises:
        TypeError: a leaf toolset is not a function toolset (MCP, dynamic: not yet supported).
    """
    leaves: list[AbstractToolset[Any]] = []
    for ts in agent.toolsets:
        ts.apply(leaves.append)
    for leaf in leaves:
        if not isinstance(leaf, FunctionToolset):
            raise TypeError(f"reel.contrib.pydantic_ai runs function tools only; agent {agent.name!r} has a "
                            f"{type(leaf).__name__}")
    return [leaf for leaf in leaves if isinstance(leaf, FunctionToolset)]


def _reel_agent(agent: Agent[Any, Any], *, max_turns: int) -> ReelAgent:
    """The Reel agent step mirroring ``agent``: each function tool proxied (``requires_approval`` → gated)."""
    tools: dict[str, ReelFunctionTool[..., Any]] = {}
    for ts in _function_toolsets(agent):
        for name, t in ts.tools.items():
            if name not in tools:
                spec = AgentToolSpec(name=name, description=t.description or name,
                                     parameters=dict(t.function_schema.json_schema), python=proxy_path(name),
                                     retry_safe=True, needs_approval=bool(t.requires_approval))
                tools[name] = _proxy(spec)
    assert agent.name is not None
    return mirror_agent(agent.name, f"(the instructions of Pydantic AI agent {agent.name})",
                        ModelSpec(adapter=ADAPTER, name=f"pydantic-ai:{agent.name}"), list(tools.values()), max_turns)


async def _decisions(client: Client, rid: str, step_id: str, call_ids: Sequence[str]
                     ) -> dict[str, bool | ToolApproved | ToolDenied]:
    """Reel's decision on each gated call: approved (with the approver's edited arguments, if any) or denied
    (the rejection's text, as Reel's own agent loop tells its model)."""
    async for branch, rec in watch_step(client, rid, step_id):
        steps = {c.decl.call_id: c.decl.step_id for t in (rec.turns if rec is not None else ()) for c in t.calls}
        out: dict[str, bool | ToolApproved | ToolDenied] = {}
        for call_id in call_ids:
            req = requestfold.request_of(branch, steps[call_id]) if call_id in steps else None
            if req is None or req.response is None:
                break
            if req.response.decision == "approve":
                edited = req.response.arguments
                out[call_id] = True if edited is None else ToolApproved(override_args=json.loads(edited))
            else:
                ended = requestfold.observation(branch, steps[call_id])
                out[call_id] = ToolDenied(ended[0] if ended is not None else "rejected")
        else:
            return out
    raise AssertionError("unreachable: watch never ends")


async def run(agent: Agent[Any, Any], prompt: str, *, client: Client, key: str | None = None, deps: Any = None,
              max_turns: int = 10, timeout_s: float | None = None) -> AgentRunResult[Any]:
    """``agent.run(prompt)``, durably: a Reel run records each model request and tool call (module docs).

    Args:
        agent: a Pydantic AI ``Agent`` with :class:`ReelDurability` among its capabilities, and a ``name``.
        prompt: the user prompt (the Reel run's task).
        client: a :class:`reel.Client` whose executor runs in this process (``reel.local()``, or one a
            ``reel.Worker`` serves): the model adapter and the tool proxies meet the agent here.
        key: the Reel run's idempotency key: the same key resumes that run (default: the prompt and the
            agent's name hashed).
        deps: the agent's dependencies (``agent.run(deps=…)``), not recorded.
        max_turns: bound on the Reel step's turns (model requests).
        timeout_s: bound on the whole run (s; ``None``: none).

    Returns:
        the agent's ``AgentRunResult`` (a deferred approval already settled through Reel).

    Raises:
        TypeError: the agent lacks :class:`ReelDurability`, or holds a toolset that is not a function toolset.
        as ``agent.run`` and ``Client.start`` (``WorkflowInvalid`` …).
    """
    if ReelDurability.from_agent(agent) is None:
        raise TypeError(f"agent {agent.name!r} has no ReelDurability capability: "
                        "Agent(..., capabilities=[ReelDurability()])")
    mirror = _reel_agent(agent, max_turns=max_turns)
    assert agent.name is not None  # _reel_agent checked it
    handle = await client.start(mirror, input=prompt, key=key or run_key("pyd-", agent.name, prompt))
    bridge = _BRIDGES.of(handle.run_id)
    tools = frozenset(t.name for t in mirror.tools)
    _TOOLS[handle.run_id] = tools
    journal = await read_journal(client, await handle.state(), mirror.id, RECORD_KEY,
                                 turn=lambda record: record["response"], call=json.loads)
    drive = _Drive(handle.run_id, journal, bridge, tools)
    output_type: Any = agent.output_type
    types = list(output_type) if isinstance(output_type, Sequence) and not isinstance(output_type, str) \
        else [output_type]
    if DeferredToolRequests not in types:  # a gated call defers; Reel's decision settles it below
        types.append(DeferredToolRequests)
    token = _DRIVE.set(drive)
    try:
        async with asyncio.timeout(timeout_s):
            result: AgentRunResult[Any] = await agent.run(prompt, deps=deps, output_type=types)
            while isinstance(result.output, DeferredToolRequests):
                if result.output.calls:
                    raise TypeError("reel.contrib.pydantic_ai settles approvals only, not external (CallDeferred) "
                                    f"calls: {[c.tool_name for c in result.output.calls]}")
                approvals = await _decisions(client, handle.run_id, mirror.id,
                                             [a.tool_call_id for a in result.output.approvals])
                result = await agent.run(message_history=result.all_messages(), deps=deps,
                                         deferred_tool_results=DeferredToolResults(approvals=approvals),
                                         output_type=types)
            bridge.ended.set_result(output_text(result.output))
            await handle.wait(("completed", "cancelled"), timeout_s=60)
            return result
    finally:
        _DRIVE.reset(token)
        _BRIDGES.drop(handle.run_id)
        _TOOLS.pop(handle.run_id, None)
