"""The OpenAI Agents SDK on Reel: ``await run(agent, input, client=client)`` in place of ``Runner.run``.

The SDK's runner loop runs in the caller's process, as under ``Runner.run``; the run it drives is a Reel run
of one ``kind: agent`` step (the agent's name as its step id), and the two go in lockstep:

- each model call the SDK makes is Reel turn *n* (``<step>:t<n>``): Reel's executor calls this module's
  model adapter (``reel.contrib.openai_agents:bridge_model``), which makes the SDK's own call (the agent's
  ``Model``, a name resolved by the run config's provider, or an instance such as
  ``OpenAIChatCompletionsModel``) with the SDK's exact arguments and records, as the turn's output
  message, the SDK's request (instructions, input items, tool and handoff names) and its output items;
- each function-tool call is Reel call ``<step>:t<n>:c<i>``, the turn's calls numbered in call-id order;
  Reel's executor records the intent, then calls a proxy that runs the SDK's tool invocation (with the
  SDK's own ``ToolContext``), then records the outcome; a handoff is a call too (``transfer_to_…``,
  its result naming the agent handed to), so it is in the timeline;
- a tool with ``needs_approval`` is gated by Reel (its calls wait as input requests: ``reel pending`` /
  ``reel approve``), not by the SDK's interruptions; a rejection's text is the SDK's tool output.

Re-running ``run`` with the same ``key`` after the process died resumes the Reel run: every turn and call
already recorded is answered from the run's log (the SDK is not asked to repeat it; journal replay), the
rest run as before. Code outside model and tool calls (guardrails, hooks, dynamic instructions) runs again.
After a rewind of the Reel run (:func:`run_id` of the key) at ``<step>:t1``, the same call runs the SDK again
on the new branch.

Needs the ``openai-agents`` package (``pip install 'reel[openai-agents]'``); docs/integrations.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any

import msgspec
from agents import Agent, FunctionTool, Handoff, Runner, RunResult
from agents.handoffs import handoff as make_handoff
from agents.items import ModelResponse, TResponseInputItem
from agents.models.interface import Model, ModelTracing
from agents.run import RunConfig
from agents.usage import Usage
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseTextDeltaEvent,
)
from pydantic import TypeAdapter

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
from reel.shared.core.wire.livemessages import StreamChunk, ToolCallDelta
from reel.shared.core.workflow.agentspec import AgentToolSpec
from reel.shared.core.workflow.spec import ModelSpec
from reel.shared.models.base import DeltaSink

ADAPTER = "reel.contrib.openai_agents:bridge_model"
"""The ``module:factory`` model adapter of the Reel run (what its workflow names)."""

RECORD_KEY = "openai_agents"
"""The key of a turn's output message under which the SDK's request and output items are recorded."""

BRIDGE_WAIT_S = 120.0
"""How long the model adapter waits for the SDK runner of its run to ask for a turn (s) before failing the
attempt (retryable: the runner of a resumed run may be starting)."""

_OUTPUT_ITEMS: TypeAdapter[list[ResponseOutputItem]] = TypeAdapter(list[ResponseOutputItem])


class _Bridge(TurnCalls):
    """The meeting point of one Reel run's executor side and the SDK runner driving it (one per run id)."""

    def __init__(self) -> None:
        super().__init__()
        self.asks: dict[int, asyncio.Future[tuple[Model, dict[str, Any]] | None]] = {}
        self.answers: dict[int, asyncio.Future[ModelResponse]] = {}
        self.calls: dict[str, asyncio.Future[tuple[FunctionTool, Any, str]]] = {}
        self.done: dict[str, asyncio.Future[Any]] = {}
        self.finished: str | None = None

    def ask(self, turn: int) -> asyncio.Future[tuple[Model, dict[str, Any]] | None]:
        return self.asks.setdefault(turn, asyncio.get_running_loop().create_future())

    def answer(self, turn: int) -> asyncio.Future[ModelResponse]:
        return self.answers.setdefault(turn, asyncio.get_running_loop().create_future())

    def call(self, call_id: str) -> asyncio.Future[tuple[FunctionTool, Any, str]]:
        return self.calls.setdefault(call_id, asyncio.get_running_loop().create_future())

    def result(self, call_id: str) -> asyncio.Future[Any]:
        return self.done.setdefault(call_id, asyncio.get_running_loop().create_future())


_BRIDGES: Bridges[_Bridge] = Bridges(_Bridge)


class _BridgeModel:
    """The Reel model adapter of an SDK run: turn *n* is the SDK's *n*-th model call, made here."""

    def __init__(self, spec: ModelSpec, counter: TokenCounter) -> None:
        self.name = spec.name or "openai-agents"

    async def complete_chat(self, request: ChatRequest, on_delta: DeltaSink | None = None) -> ChatResponse:
        """Wait for the SDK runner's call of this turn, make it, return it as Reel's response. With ``on_delta``
        (the run streams: ``run(…, stream=True)``) the call is the SDK model's ``stream_response``, its text and
        tool-call argument deltas sent to ``on_delta`` as they arrive, its completed response the answer.

        Raises:
            ModelError: no runner asked within :data:`BRIDGE_WAIT_S` (retryable, ``runner_absent``); the
                SDK's model raised (retryable unless it is a 4xx: ``model_error``).
        """
        bridge = _BRIDGES.of(request.run_id)
        ask = bridge.ask(request.turn)
        try:
            asked = await asyncio.wait_for(asyncio.shield(ask), BRIDGE_WAIT_S)
        except TimeoutError:
            if bridge.finished is not None:
                return ChatResponse(text=bridge.finished, finish_reason="stop", model=self.name)
            raise ModelError(f"no OpenAI Agents SDK runner asked for turn {request.turn} of run {request.run_id} "
                             f"within {BRIDGE_WAIT_S:g} s (re-run reel.contrib.openai_agents.run with its key to "
                             "resume it)", kind="runner_absent", retryable=True) from None
        if asked is None:  # the SDK runner finished without this turn (e.g. a tool's output was final)
            return ChatResponse(text=bridge.finished or "", finish_reason="stop", model=self.name)
        model, kwargs = asked
        try:
            response = await (model.get_response(**kwargs) if on_delta is None else _streamed(model, kwargs, on_delta))
        except Exception as exc:  # the SDK's runner raises it too (as Runner.run would); Reel records the failure
            answer = bridge.answer(request.turn)
            if not answer.done():
                answer.set_exception(exc)
            raise model_error(exc) from exc
        calls = sorted((o for o in response.output if isinstance(o, ResponseFunctionToolCall)),
                       key=lambda o: o.call_id)
        bridge.set_calls(request.turn, [c.call_id for c in calls])
        text = "".join(c.text for o in response.output if getattr(o, "type", "") == "message"
                       for c in getattr(o, "content", ()) if getattr(c, "type", "") == "output_text")
        record = {"request": _request_record(kwargs),
                  "output": [o.model_dump(mode="json", exclude_unset=True) for o in response.output],
                  "usage": {"input_tokens": response.usage.input_tokens,
                            "output_tokens": response.usage.output_tokens},
                  "response_id": response.response_id}
        tool_calls = tuple(ToolCall(id=c.call_id, name=c.name, arguments=c.arguments) for c in calls)
        bridge.answer(request.turn).set_result(response)
        return turn_response(text, tool_calls, RECORD_KEY, record, input_tokens=response.usage.input_tokens,
                             output_tokens=response.usage.output_tokens,
                             model=str(getattr(model, "model", "") or self.name))


async def _streamed(model: Model, kwargs: Mapping[str, Any], on_delta: DeltaSink) -> ModelResponse:
    """The SDK model's streamed response to ``kwargs``: each output-text delta and function-call arguments
    delta to ``on_delta`` (a call's id and name first, with its item's index), the completed response built
    as ``get_response`` returns it.

    Raises:
        ModelError: the stream ended without a ``response.completed`` event (retryable, ``stream_incomplete``).
    """
    indexes: dict[int, int] = {}  # output index of a function call → Reel's call index (order of appearance)
    async for event in model.stream_response(**kwargs):
        if isinstance(event, ResponseTextDeltaEvent):
            await on_delta(StreamChunk(seq=0, content=event.delta))
        elif isinstance(event, ResponseOutputItemAddedEvent) and isinstance(event.item, ResponseFunctionToolCall):
            i = indexes.setdefault(event.output_index, len(indexes))
            await on_delta(StreamChunk(seq=0, tool_calls=(ToolCallDelta(index=i, id=event.item.call_id,
                                                                        name=event.item.name),)))
        elif isinstance(event, ResponseFunctionCallArgumentsDeltaEvent):
            i = indexes.setdefault(event.output_index, len(indexes))
            await on_delta(StreamChunk(seq=0, tool_calls=(ToolCallDelta(index=i, arguments=event.delta),)))
        elif isinstance(event, ResponseCompletedEvent):
            r, u = event.response, event.response.usage
            return ModelResponse(output=list(r.output), response_id=r.id, usage=Usage(
                requests=1, input_tokens=u.input_tokens if u else 0, output_tokens=u.output_tokens if u else 0,
                total_tokens=u.total_tokens if u else 0))
    raise ModelError("the model's stream ended before its response completed", kind="stream_incomplete",
                     retryable=True)


def bridge_model(spec: ModelSpec, counter: TokenCounter) -> _BridgeModel:
    """The ``module:factory`` adapter Reel's executor loads for an SDK run (:data:`ADAPTER`)."""
    return _BridgeModel(spec, counter)


def _request_record(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The SDK's request as recorded: instructions, input items, the tools' and handoffs' names, the schema."""
    items = kwargs["input"]
    schema = kwargs.get("output_schema")
    return {"system_instructions": kwargs.get("system_instructions"),
            "input": items if isinstance(items, str) else json.loads(json.dumps(items, default=str)),
            "tools": [getattr(t, "name", type(t).__name__) for t in kwargs.get("tools", ())],
            "handoffs": [h.tool_name for h in kwargs.get("handoffs", ())],
            "output_schema": None if schema is None else schema.json_schema()}


def _recorded(record: dict[str, Any]) -> ModelResponse:
    """The ``ModelResponse`` of a turn's record (its output items, usage and response id)."""
    u = record.get("usage", {})
    return ModelResponse(output=_OUTPUT_ITEMS.validate_python(record["output"]),
                         usage=Usage(requests=1, input_tokens=int(u.get("input_tokens", 0)),
                                     output_tokens=int(u.get("output_tokens", 0)),
                                     total_tokens=int(u.get("input_tokens", 0)) + int(u.get("output_tokens", 0))),
                         response_id=record.get("response_id"))


class _StubModel(Model):
    """The SDK-side model of every agent of a run: model call *n* is Reel turn *n* (or its recorded answer)."""

    def __init__(self, run: _SdkRun, inner: Model) -> None:
        self._run, self._inner = run, inner

    async def get_response(self, system_instructions: str | None, input: str | list[TResponseInputItem],
                           model_settings: Any, tools: list[Any], output_schema: Any, handoffs: list[Handoff],
                           tracing: ModelTracing, *, previous_response_id: str | None = None,
                           conversation_id: str | None = None, prompt: Any = None) -> ModelResponse:
        run = self._run
        run.turn += 1
        turn = run.turn
        recorded = run.journal.turns.get(turn)
        if recorded is not None:
            run.bridge.set_calls(turn, sorted(o.call_id for o in recorded.output
                                              if isinstance(o, ResponseFunctionToolCall)))
            return recorded
        kwargs = dict(system_instructions=system_instructions, input=input, model_settings=model_settings,
                      tools=tools, output_schema=output_schema, handoffs=handoffs, tracing=tracing,
                      previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt)
        run.bridge.ask(turn).set_result((self._inner, kwargs))
        return await run.bridge.answer(turn)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("reel.contrib.openai_agents runs Runner.run's non-streamed loop")


class _SdkRun:
    """One SDK run driven against one Reel run: the clones of the agents, the bridge and the journal."""

    def __init__(self, client: Client, run_id: str, step_id: str, journal: Journal[ModelResponse, str], bridge: _Bridge,
                 config: RunConfig) -> None:
        self.client, self.run_id, self.step_id = client, run_id, step_id
        self.journal, self.bridge, self.config = journal, bridge, config
        self.turn = 0
        self.clones: dict[int, Agent[Any]] = {}

    def clone(self, agent: Agent[Any]) -> Agent[Any]:
        """``agent`` with the stub model, wrapped tools and cloned handoffs (the user's object untouched)."""
        held = self.clones.get(id(agent))
        if held is not None:
            return held
        inner = agent.model if isinstance(agent.model, Model) else self.config.model_provider.get_model(
            agent.model if isinstance(agent.model, str) else self.config.model if isinstance(self.config.model, str)
            else None)
        copy = agent.clone(model=_StubModel(self, inner))
        self.clones[id(agent)] = copy
        copy.tools = [self._tool(t) for t in agent.tools]
        copy.handoffs = [self._handoff(h) for h in agent.handoffs]
        return copy

    def _tool(self, t: Any) -> FunctionTool:
        if not isinstance(t, FunctionTool):
            raise TypeError(f"reel.contrib.openai_agents runs function tools only; {type(t).__name__} is not one")
        sdk_run = self

        async def invoke(ctx: Any, arguments: str) -> Any:
            return await sdk_run.tool_call(t, ctx, arguments)

        return dataclasses.replace(t, on_invoke_tool=invoke, needs_approval=False)

    def _handoff(self, h: Agent[Any] | Handoff[Any, Any]) -> Handoff[Any, Any]:
        base = make_handoff(h) if isinstance(h, Agent) else h
        original = base.on_invoke_handoff
        sdk_run = self

        async def invoke(ctx: Any, arguments: str) -> Agent[Any]:
            return sdk_run.clone(await original(ctx, arguments))

        return dataclasses.replace(base, on_invoke_handoff=invoke)

    async def tool_call(self, t: FunctionTool, ctx: Any, arguments: str) -> Any:
        """The SDK calls a tool: answer it from the log, else hand it to Reel's call step and wait for it."""
        call_id = str(ctx.tool_call_id)
        recorded = self.journal.calls.get(call_id)
        if recorded is not None:
            return recorded
        self.bridge.call(call_id).set_result((t, ctx, arguments))
        result = self.bridge.result(call_id)
        settled = asyncio.ensure_future(self._settled(call_id))
        try:
            done, _ = await asyncio.wait({result, settled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            settled.cancel()  # not awaited: a log read in flight finishes first; its error is not the call's
            settled.add_done_callback(_quiet)
        return result.result() if result in done else settled.result()

    async def _settled(self, call_id: str) -> str:
        """What the model is told of a call Reel did not hand to the SDK: a human's rejection (the text Reel's own
        agent loop gives, ``error (rejected): …``), or its last failure once a later turn exists (an
        ``outcome_unknown`` after a crash)."""
        async for branch, rec in watch_step(self.client, self.run_id, self.step_id):
            if rec is None:
                continue
            for t in rec.turns:
                for c in t.calls:
                    if c.decl.call_id != call_id:
                        continue
                    ended = requestfold.observation(branch, c.decl.step_id)  # rejected (or answered) by a human
                    if ended is not None:
                        return ended[0]
                    later = any(u.decl.turn > t.decl.turn for u in rec.turns) or rec.finished is not None
                    failed = [a for a in branch.attempts.get(c.decl.step_id, ()) if a.status == "failed"]
                    if later and failed:
                        a = failed[-1]
                        return f"error: {a.error_kind}: {a.error_message or ''}"
        raise AssertionError("unreachable: watch never ends")


def _quiet(task: asyncio.Future[Any]) -> None:
    """Retrieve a dropped watcher's exception (so asyncio does not report it as never retrieved)."""
    if not task.cancelled():
        task.exception()


_PROXIES: Proxies[tuple[str, str | None]] = Proxies()
"""One proxy function per tool name (and handoff target)."""


def proxy_path(tool_name: str, handoff_to: str | None) -> str:
    """The ``python:`` path the Reel tool of ``tool_name`` names its proxy by."""
    return _proxy_path(__name__, "sdk_tool_", f"{tool_name}\0{handoff_to}")


def _proxy(tool_name: str, handoff_to: str | None, spec: AgentToolSpec) -> ReelFunctionTool[..., Any]:
    """The Reel function tool a call of ``tool_name`` runs: the SDK's invocation of that call (handed over by the
    runner's wrapped tool), or, for a handoff, a note naming the agent handed to (the SDK makes the handoff)."""
    return _PROXIES.tool((tool_name, handoff_to), spec, functools.partial(_proxy_call, tool_name, handoff_to))


async def _proxy_call(tool_name: str, handoff_to: str | None, idempotency_key: str) -> str:
    """What Reel's call step of ``tool_name`` runs (:func:`_proxy`)."""
    run_id, turn, index = call_of(idempotency_key)
    if handoff_to is not None:
        return json.dumps({"assistant": handoff_to})
    bridge = _BRIDGES.of(run_id)
    try:
        call_id = await bridge.call_id(turn, index, BRIDGE_WAIT_S)
        tool, ctx, args = await asyncio.wait_for(asyncio.shield(bridge.call(call_id)), BRIDGE_WAIT_S)
    except TimeoutError:
        raise RuntimeError(f"no OpenAI Agents SDK runner called {tool_name} (turn {turn}) of run {run_id} "
                           f"within {BRIDGE_WAIT_S:g} s") from None
    done = bridge.result(call_id)
    try:
        value = await tool.on_invoke_tool(ctx, args)
    except Exception as exc:
        if not done.done():
            done.set_exception(exc)
        raise
    if not done.done():
        done.set_result(value)
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _agents(root: Agent[Any]) -> list[Agent[Any]]:
    """``root`` and every agent reachable by its handoffs, each once, in discovery order."""
    out: list[Agent[Any]] = []
    todo = [root]
    while todo:
        a = todo.pop(0)
        if any(a is b for b in out):
            continue
        out.append(a)
        for h in a.handoffs:
            if isinstance(h, Agent):
                todo.append(h)
    return out


def _reel_agent(root: Agent[Any], *, max_turns: int, retry_safe: bool, stream: bool = False) -> ReelAgent:
    """The Reel agent step mirroring ``root``: every tool and handoff of every reachable agent, proxied."""
    tools: dict[str, ReelFunctionTool[..., Any]] = {}
    for a in _agents(root):
        for t in a.tools:
            if not isinstance(t, FunctionTool):
                raise TypeError(f"reel.contrib.openai_agents runs function tools only: agent {a.name!r} has a "
                                f"{type(t).__name__}")
            if t.name in tools:
                continue
            gated = t.needs_approval is not False
            spec = AgentToolSpec(name=t.name, description=t.description, parameters=dict(t.params_json_schema),
                                 python=proxy_path(t.name, None), retry_safe=retry_safe, needs_approval=gated)
            tools[t.name] = _proxy(t.name, None, spec)
        for h in a.handoffs:
            ho = make_handoff(h) if isinstance(h, Agent) else h
            if ho.tool_name not in tools:
                spec = AgentToolSpec(name=ho.tool_name, description=ho.tool_description,
                                     parameters=dict(ho.input_json_schema) or {"type": "object", "properties": {}},
                                     python=proxy_path(ho.tool_name, ho.agent_name), retry_safe=True)
                tools[ho.tool_name] = _proxy(ho.tool_name, ho.agent_name, spec)
    instructions = root.instructions if isinstance(root.instructions, str) else f"(instructions of {root.name})"
    return mirror_agent(root.name, instructions or root.name,
                        ModelSpec(adapter=ADAPTER, name=f"openai-agents:{root.name}",
                                  stream=True if stream else msgspec.UNSET),
                        list(tools.values()), max_turns)


async def run(agent: Agent[Any], input: str | list[TResponseInputItem], *, client: Client, key: str | None = None,
              context: Any = None, max_turns: int = 10, run_config: RunConfig | None = None,
              retry_safe: bool = True, timeout_s: float | None = None, stream: bool = False) -> RunResult:
    """``Runner.run(agent, input)``, durably: a Reel run records each model call and tool call (module docs).

    Args:
        agent: an SDK ``Agent``, unmodified (function tools, handoffs, ``needs_approval`` tools, an output type;
            its model a name or a ``Model`` instance).
        input: as for ``Runner.run`` (a string, or input items: recorded as the run's task, as JSON).
        client: a :class:`reel.Client` whose executor runs in this process (``reel.local()``, or one a
            ``reel.Worker`` serves): the model adapter and the tool proxies meet the runner here.
        key: the Reel run's idempotency key: the same key resumes that run (default: the input and the agent's
            name hashed — the same call resumes the same run).
        context, max_turns, run_config: passed to ``Runner.run`` (``max_turns`` bounds the Reel step too).
        retry_safe: a tool call an executor crash interrupted runs again on resume (``False``: it is recorded
            ``outcome_unknown`` and the model told).
        timeout_s: bound on the whole run (s; ``None``: none).
        stream: each model call is the SDK model's streamed call, its deltas published on the Reel run's
            stream subjects as they arrive (``handle.stream()``, ``reel ui``); the SDK is still answered with
            the whole response, and the log keeps each whole response.

    Returns:
        the SDK's ``RunResult`` (its ``final_output``, items, last agent); the Reel run is
        :func:`run_id` of the key.

    Raises:
        TypeError: an agent holds a tool that is not a function tool (hosted, MCP: not yet supported).
        as ``Runner.run`` (an SDK error) and ``Client.start`` (``WorkflowInvalid`` …).
    """
    config = run_config or RunConfig()
    task = input if isinstance(input, str) else json.dumps(input, default=str)
    mirror = _reel_agent(agent, max_turns=max_turns + 1, retry_safe=retry_safe, stream=stream)
    handle = await client.start(mirror, input=task, key=key or run_key("oa-", agent.name, task))
    bridge = _BRIDGES.of(handle.run_id)
    journal = await read_journal(client, await handle.state(), mirror.id, RECORD_KEY, turn=_recorded, call=str,
                                 ended=str)
    sdk = _SdkRun(client, handle.run_id, mirror.id, journal, bridge, config)
    try:
        async with asyncio.timeout(timeout_s):
            result = await Runner.run(sdk.clone(agent), input, context=context, max_turns=max_turns,
                                      run_config=config)
            bridge.finished = output_text(result.final_output)
            bridge.ask(sdk.turn + 1)  # Reel's step may ask for one more turn (a tool's output was final):
            for fut in bridge.asks.values():  # it ends with the SDK's output
                if not fut.done():
                    fut.set_result(None)
            await handle.wait(("completed", "cancelled"), timeout_s=60)
            return result
    finally:
        _BRIDGES.drop(handle.run_id)
