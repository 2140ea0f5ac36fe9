"""What Reel's framework integrations share: one Reel run driven in lockstep with a framework's own runner.

An integration's ``run`` starts a Reel run of one ``kind: agent`` step mirroring the framework's agent
(:func:`mirror_agent`), then runs the framework's loop in the caller's process. Reel's executor, in the same
process, calls the integration's model adapter for each turn ``<step>:t<n>`` and a proxy function
(:class:`Proxies`) for each tool call ``<step>:t<n>:c<i>``. The two sides meet in the run's bridge, one per run
id (:class:`Bridges`), whose futures whichever side comes first makes; every bridge holds each turn's call ids
(:class:`TurnCalls`), so that the proxy of call ``c<i>`` knows the framework's id of its call. On resume, the
runner is answered from the log (:func:`read_journal`) for what is already recorded. Nothing here knows a
framework: the integrations build their own objects from the JSON and text it hands them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from reel._agent import Agent as ReelAgent
from reel._client import Client
from reel._tool import FunctionTool as ReelFunctionTool
from reel.shared.core.agent.turnstate import AgentRecord
from reel.shared.core.chat.messages import ChatResponse, ToolCall
from reel.shared.core.errors import ModelError
from reel.shared.core.input import requestfold
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.ids import StepId, run_id_for_key
from reel.shared.core.run.persistent import FrozenMap
from reel.shared.core.run.state import BranchState, RunState
from reel.shared.core.workflow.agentspec import AgentToolSpec
from reel.shared.core.workflow.spec import ModelSpec

WATCH_POLL_S = 0.2
"""How often :func:`watch_step` reads the run's log for a new state (s)."""


class TurnCalls:
    """The part of a run's bridge every integration has: each turn's call ids, in id order (Reel's ``c0``,
    ``c1``, …), one future per turn, which the runner's side sets once it has the turn's response."""

    def __init__(self) -> None:
        self.turn_calls: dict[int, asyncio.Future[list[str]]] = {}

    def calls_of(self, turn: int) -> asyncio.Future[list[str]]:
        """The call ids of ``turn``'s response in id order."""
        return self.turn_calls.setdefault(turn, asyncio.get_running_loop().create_future())

    def set_calls(self, turn: int, call_ids: list[str]) -> None:
        """Set ``turn``'s call ids (the first setting holds)."""
        fut = self.calls_of(turn)
        if not fut.done():
            fut.set_result(call_ids)

    async def call_id(self, turn: int, index: int, wait_s: float) -> str:
        """The id of call ``c<index>`` of ``turn``, once the runner has the turn's response.

        Raises:
            TimeoutError: the runner did not set the turn's calls within ``wait_s`` seconds.
        """
        return (await asyncio.wait_for(asyncio.shield(self.calls_of(turn)), wait_s))[index]


B = TypeVar("B", bound=TurnCalls)
K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
C = TypeVar("C")


class Bridges(Generic[B]):
    """The bridges of an integration's runs, by run id: ``of(run_id)`` makes one on first use, by whichever
    side comes first (the runner, or a resumed run's executor); ``run`` drops it when it returns."""

    def __init__(self, make: Callable[[], B]) -> None:
        self._make = make
        self._held: dict[str, B] = {}

    def of(self, run_id: str) -> B:
        """The bridge of ``run_id``."""
        held = self._held.get(run_id)
        if held is None:
            held = self._held[run_id] = self._make()
        return held

    def drop(self, run_id: str) -> None:
        """Forget ``run_id``'s bridge (its runner has returned)."""
        self._held.pop(run_id, None)


def call_of(idempotency_key: str) -> tuple[str, int, int]:
    """``<run>/<branch>/<step>:t<n>:c<i>`` (a proxy call's idempotency key) → (run id, turn *n*, call *i*:
    0-based, the turn's calls in id order)."""
    run_id, step = idempotency_key.split("/", 1)[0], idempotency_key.rsplit("/", 1)[-1]
    turn_part, call_part = step.split(":")[-2:]
    return run_id, int(turn_part[1:]), int(call_part[1:])


def proxy_path(module: str, prefix: str, text: str) -> str:
    """The ``python:`` path ``<module>:<prefix><12 hex digits of text's sha-256>`` a proxy is named by (stable
    across processes, so a resumed run's workflow names the same function)."""
    return f"{module}:{prefix}{hashlib.sha256(text.encode()).hexdigest()[:12]}"


class Proxies(Generic[K]):
    """One proxy function per key (a tool name, …): what the in-process executor serves under its spec's
    ``python:`` path, the same object for every run (it routes by the call's run id), so runs of one process
    never serve two functions under one path."""

    def __init__(self) -> None:
        self._held: dict[K, Callable[..., Awaitable[str]]] = {}

    def tool(self, key: K, spec: AgentToolSpec, route: Callable[[str], Awaitable[str]]) -> ReelFunctionTool[..., Any]:
        """The Reel function tool of ``spec``: the proxy held for ``key``, else a new one named after
        ``spec.python``, whose call ``route(idempotency_key)`` answers (the call's arguments are the framework's
        own, which its runner has already: the proxy takes them by keyword and leaves them)."""
        held = self._held.get(key)
        if held is None:
            assert spec.python is not None  # a proxy's spec names it by its path

            async def call(*, idempotency_key: str, **arguments: Any) -> str:
                return await route(idempotency_key)

            call.__name__ = call.__qualname__ = spec.python.rpartition(":")[2]
            held = self._held[key] = call
        return ReelFunctionTool(held, spec, None)


def step_id(name: str) -> str:
    """The Reel step id of an agent named ``name``: ``[A-Za-z0-9_-]``, other characters ``_``, 64 at most."""
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:64] or "agent"


def mirror_agent(name: str, instructions: str, model: ModelSpec, tools: list[ReelFunctionTool[..., Any]],
                 max_turns: int) -> ReelAgent:
    """The Reel agent step mirroring a framework's agent ``name`` (its step id :func:`step_id`): its model the
    integration's adapter, its tools the proxies, up to 16 calls of a turn at once."""
    return ReelAgent(name=name, step_id=step_id(name), instructions=instructions, model=model, tools=tools,
                     max_turns=max_turns, max_parallel_tools=16)


def run_key(prefix: str, name: str, task: str) -> str:
    """The default idempotency key of a run of agent ``name`` on ``task``: ``prefix`` and 32 hex digits of
    their sha-256 (the same call resumes the same run)."""
    return prefix + hashlib.sha256(f"{name}\0{task}".encode()).hexdigest()[:32]


def run_id(key: str) -> str:
    """The id of the Reel run an integration's ``run`` drives under ``key`` (``reel show``/``reel pending`` it,
    or ``client.get(run_id(key))``)."""
    return str(run_id_for_key(key))


def output_text(out: Any) -> str:
    """A framework run's final output as the Reel step's answer: a string as it is, else JSON (a pydantic model
    dumped first)."""
    return out if isinstance(out, str) else json.dumps(
        out.model_dump(mode="json") if hasattr(out, "model_dump") else out, default=str)


def model_error(exc: Exception) -> ModelError:
    """Reel's ``model_error`` for a framework model's exception: retryable unless an HTTP 4xx other than 429."""
    status = getattr(exc, "status_code", None)
    return ModelError(f"{type(exc).__name__}: {exc}", kind="model_error",
                      retryable=not (isinstance(status, int) and 400 <= status < 500 and status != 429))


def turn_response(text: str, calls: tuple[ToolCall, ...], record_key: str, record: dict[str, Any], *,
                  input_tokens: int, output_tokens: int, model: str) -> ChatResponse:
    """A turn's response to Reel: ``text`` and ``calls``, its output message an assistant message holding
    ``record`` (the framework's request and response, JSON) under ``record_key``, which :func:`read_journal`
    reads back on resume."""
    message: dict[str, Any] = {"role": "assistant", "content": text, record_key: record}
    if calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    return ChatResponse(text=text, tool_calls=calls, finish_reason="tool_calls" if calls else "stop",
                        input_tokens=input_tokens, output_tokens=output_tokens, model=model, message=message)


def agent_step(state: RunState, step: str) -> tuple[BranchState, AgentRecord | None]:
    """The active branch of ``state`` and the record of agent step ``step`` on it (``None`` before its first
    turn)."""
    branch = state.active
    return branch, branch.agents.get(StepId(step)) if isinstance(branch.agents, FrozenMap) else None


async def watch_step(client: Client, run_id: str, step: str
                     ) -> AsyncIterator[tuple[BranchState, AgentRecord | None]]:
    """:func:`agent_step` of each state the run moves to (read every :data:`WATCH_POLL_S`); never ends."""
    async for state in client._rc.watch(run_id, poll_s=WATCH_POLL_S):
        yield agent_step(state, step)


def succeeded(branch: BranchState, step: StepId) -> BlobRef | None:
    """The output blob of ``step``'s last succeeded attempt on ``branch``, if any."""
    done = [a for a in branch.attempts.get(step, ()) if a.status == "succeeded" and a.output_ref]
    return done[-1].output_ref if done else None


@dataclass
class Journal(Generic[T, C]):
    """What the Reel run's log holds of an agent step's earlier turns and calls (read once, when ``run`` starts,
    by :func:`read_journal`), as the framework's own objects.

    Attributes:
        turns: turn *n* → its recorded response, for each turn with a succeeded attempt whose output message holds
            the integration's record.
        calls: call id → its recorded result, for the calls of those turns: a succeeded attempt's output, or (when
            asked for) the text the model was told of a call a human's answer ended (a rejection:
            ``error (rejected): …``).
    """

    turns: dict[int, T] = field(default_factory=dict)
    calls: dict[str, C] = field(default_factory=dict)


async def read_journal(client: Client, state: RunState, step: str, record_key: str, *,
                       turn: Callable[[dict[str, Any]], T], call: Callable[[str], C],
                       ended: Callable[[str], C] | None = None) -> Journal[T, C]:
    """The journal of agent step ``step`` on ``state``'s active branch.

    Args:
        turn: a turn's record (the JSON object its output message holds under ``record_key``) → its response.
        call: the output (text) of a call's last succeeded attempt → its result.
        ended: a call with no succeeded attempt that a human's answer ended → its result from the text the model
            was told (``None``: such calls are left out).
    """
    j: Journal[T, C] = Journal()
    branch, rec = agent_step(state, step)
    if rec is None:
        return j
    blobs = client._rc.blobs
    assert blobs is not None  # a Client always has its blob store
    for t in rec.turns:
        ref = succeeded(branch, t.decl.step_id)
        body = json.loads(await blobs.get_text(ref)) if ref is not None else None
        record = body.get(record_key) if isinstance(body, dict) else None
        if record is None:
            continue
        j.turns[t.decl.turn] = turn(record)
        for c in t.calls:
            if c.decl.call_id is None:
                continue
            ref = succeeded(branch, c.decl.step_id)
            observed = requestfold.observation(branch, c.decl.step_id) if ended is not None else None
            if ref is not None:
                j.calls[c.decl.call_id] = call(await blobs.get_text(ref))
            elif ended is not None and observed is not None:
                j.calls[c.decl.call_id] = ended(observed[0])
    return j
