"""Agents and model configs of the Python API: each is the :class:`~reel.shared.core.workflow.spec.WorkflowSpec`
a YAML workflow would be (docs/workflow.md), so a run started from Python logs exactly what its YAML twin logs.

Pure: builds specs, never connects (``lint-imports`` keeps NATS out of it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from reel._tool import FunctionTool, Tool
from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.run.events import Budget
from reel.shared.core.wire.subjects import is_token
from reel.shared.core.workflow.agentspec import ApprovalPolicy
from reel.shared.core.workflow.spec import (
    AgentStep,
    ContextItemSpec,
    ModelSpec,
    PolicySpec,
    Price,
    ScriptedTurn,
    VerifierSpec,
    WorkflowSpec,
    WorkspaceSpec,
    parse_workflow,
)

TASK_ITEM_ID = "task"
"""The id of the context item a string ``input=`` becomes (kind ``task``: every turn leads with it)."""


@dataclass(frozen=True, kw_only=True)
class OpenAIModel:
    """An OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp's server, Ollama, LiteLLM).

    Attributes:
        base_url: the endpoint, e.g. ``http://127.0.0.1:11434/v1`` (``http://`` or ``https://``).
        model: the model name sent, e.g. ``gpt-4o-mini``.
        api_key_env: NAME of the environment variable holding the key (read by the executor; never the key
            itself, which is kept out of every log, prompt and tool environment). ``None``: a placeholder key.
        params: extra request-body fields, e.g. ``{"temperature": 0}``.
        timeout_s: deadline of one HTTP call (s). stream: stream tokens (``RunHandle.stream()``).
        price: USD per million input / output tokens (``None``: cost 0).
        profile: the server's wire profile (``openai``, ``vllm``, ``llama-server``, ``llama-cpp-python``,
            ``ollama``, ``litellm``; docs/models.md); ``None``: plain OpenAI.
    """

    base_url: str
    model: str
    api_key_env: str | None = None
    params: Mapping[str, Any] | None = None
    timeout_s: float | None = None
    stream: bool = False
    price: Price | None = None
    profile: str | None = None
    name: str = ""

    def spec(self) -> ModelSpec:
        """The :class:`ModelSpec` of the YAML ``model: {adapter: openai, …}`` block."""
        return ModelSpec(adapter="openai", name=self.name, base_url=self.base_url, model=self.model,
                         api_key_env=msgspec.UNSET if self.api_key_env is None else self.api_key_env,
                         params=msgspec.UNSET if self.params is None else dict(self.params),
                         timeout_s=msgspec.UNSET if self.timeout_s is None else self.timeout_s,
                         stream=True if self.stream else msgspec.UNSET,
                         price=msgspec.UNSET if self.price is None else self.price,
                         profile=msgspec.UNSET if self.profile is None else self.profile)


@dataclass(frozen=True, kw_only=True)
class ScriptedModel:
    """A model that plays scripted turns (tests, demos): turn *t* answers ``turns[t-1]``, the last one repeats.

    Attributes:
        turns: each ``{"text": str, "tool_calls": [{"name": str, "arguments": {…}}], "failures": [{"error":
            kind, "message": str}]}`` (every key optional; a turn without ``tool_calls`` ends the agent loop;
            ``failures``: its first attempts fail with these).
        name: the model name logged.
    """

    turns: Sequence[Mapping[str, Any] | ScriptedTurn]
    name: str = ""

    def spec(self) -> ModelSpec:
        """The :class:`ModelSpec` of the YAML ``model: {adapter: scripted, turns: […]}`` block.

        Raises:
            WorkflowInvalid: a turn is not of the shape above (naming the field).
        """
        try:
            turns = msgspec.convert([t if isinstance(t, Mapping) else msgspec.to_builtins(t) for t in self.turns],
                                    tuple[ScriptedTurn, ...])
        except msgspec.ValidationError as exc:
            raise WorkflowInvalid(f"invalid scripted turns: {exc}") from exc
        return ModelSpec(adapter="scripted", name=self.name, turns=turns)


Model = OpenAIModel | ScriptedModel | ModelSpec
"""What ``Agent(model=…)`` takes: a config above, or a :class:`ModelSpec` (any adapter of docs/models.md)."""


def model_spec(model: Model) -> ModelSpec:
    """The :class:`ModelSpec` of ``model``."""
    return model if isinstance(model, ModelSpec) else model.spec()


@dataclass(frozen=True, kw_only=True)
class Agent:
    """An agent: a model that calls tools turn by turn until it answers without one (one ``kind: agent`` step).

    Only ``name``, ``instructions`` and ``model`` are needed; a run's task is the ``input=`` string given
    to ``Client.start`` (or a context item of kind ``task``).

    Attributes:
        name: the workflow's name (free text); step_id: the step's id (default: ``name`` when it is a
            token ``[A-Za-z0-9_-]{1,128}``, else ``agent``): its turns are ``<step_id>:t<n>``.
        instructions: the system message. model: :data:`Model`.
        tools: :class:`Tool`\\ s (``@reel.tool`` functions, :func:`reel.command_tool`, …); names unique.
        context: more context items: a string (a ``document``, id ``context-<i>``) or a
            :class:`~reel.shared.core.workflow.spec.ContextItemSpec` (``reel.ContextItem``).
        verifiers: judges of the finished run (``reel.Verifier``, docs/verifiers.md).
        max_turns: turns before the step fails (a turn at the bound that still calls tools fails it).
        max_attempts: attempts of each turn; max_parallel_tools: calls of one turn at once.
        budget_tokens: context budget of each turn (tokens); policy: packing policy (docs/context.md).
        approval: the tools whose calls wait for a human (names or patterns); labels: the run's labels.
        budget: what one run may spend (``reel.Budget``: ``max_tokens``, ``max_cost_usd``, ``max_wall_s``,
            ``max_tool_calls``; docs/workflow.md "Budgets") — not ``budget_tokens``; ``None``: the namespace's.
        prices: model name → ``reel.Price``, extending the built-in price table.
        on_code_change: ``continue`` or ``fail`` (``None``: continue): what an attempt does whose tool's code
            changed since the run's earlier attempts of it.
        workspace: the folder the tools work in (``reel.Workspace(from_=DIR)``; docs/workspaces.md): each branch
            gets its own copy, snapshotted after every tool call; ``None``: none.
    """

    name: str
    instructions: str
    model: Model
    tools: Sequence[Tool] = ()
    context: Sequence[str | ContextItemSpec] = ()
    verifiers: Sequence[VerifierSpec] = ()
    max_turns: int = 12
    max_attempts: int = 1
    max_parallel_tools: int = 4
    budget_tokens: int = 8000
    policy: PolicySpec = field(default_factory=PolicySpec)
    approval: ApprovalPolicy | None = None
    description: str = ""
    step_id: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    budget: Budget | None = None
    prices: Mapping[str, Price] | None = None
    on_code_change: Literal["continue", "fail"] | None = None
    workspace: WorkspaceSpec | None = None

    def __post_init__(self) -> None:
        """Raises TypeError: an entry of ``tools`` that is not a :class:`Tool` (e.g. a plain function)."""
        for i, t in enumerate(self.tools):
            if not isinstance(t, Tool):
                what = f"the function {getattr(t, '__name__', '?')!r}" if callable(t) else f"a {type(t).__name__}"
                hint = (f": decorate it with @reel.tool, or pass reel.tool({getattr(t, '__name__', 'fn')})"
                        if callable(t) else "")
                raise TypeError(f"Agent {self.name!r}: tools[{i}] is {what}, not a reel tool{hint}")

    @property
    def id(self) -> str:
        """The agent step's id (see ``step_id``)."""
        return self.step_id or (self.name if is_token(self.name) else "agent")

    def functions(self) -> dict[str, FunctionTool[..., Any]]:
        """``module:function`` path → each function tool (what an in-process executor serves)."""
        return {t.path: t for t in self.tools if isinstance(t, FunctionTool)}

    def workflow(self, input: str | None = None) -> WorkflowSpec:
        """The one-step workflow of this agent; ``input`` becomes the context item ``task`` (kind ``task``), first.

        Built as the YAML loader builds a file's (:func:`~reel.shared.core.workflow.spec.parse_workflow`), so a
        run of it logs what the same workflow written in YAML logs (e.g. ``priority=1`` is the float ``1.0``).

        Raises:
            WorkflowInvalid: naming the field of the first problem (e.g. no task: neither ``input`` nor a
                context item of kind ``task``; a duplicate tool name).
        """
        items = [ContextItemSpec(id=TASK_ITEM_ID, kind="task", text=input)] if input is not None else []
        items += [ContextItemSpec(id=f"context-{i}", kind="document", text=c) if isinstance(c, str) else c
                  for i, c in enumerate(self.context)]
        step = AgentStep(id=self.id, model=model_spec(self.model), instructions=self.instructions,
                         context=tuple(items), policy=self.policy, tools=tuple(t.spec for t in self.tools),
                         max_turns=self.max_turns, max_attempts=self.max_attempts,
                         max_parallel_tools=self.max_parallel_tools)
        spec = WorkflowSpec(name=self.name, description=self.description, budget_tokens=self.budget_tokens,
                            steps=(step,), verifiers=tuple(self.verifiers), labels=dict(self.labels),
                            approval=self.approval,
                            budget=msgspec.UNSET if self.budget is None else self.budget,
                            prices=msgspec.UNSET if self.prices is None else dict(self.prices),
                            on_code_change=msgspec.UNSET if self.on_code_change is None else self.on_code_change,
                            workspace=msgspec.UNSET if self.workspace is None else self.workspace)
        if input is None and not any(i.kind == "task" for i in items):
            raise WorkflowInvalid(f"agent {self.name!r} has no task: give the request as input=\"...\" (to "
                                  "client.start or reel.run_sync), or a context item of kind `task`")
        return parse_workflow(msgspec.to_builtins(spec))  # decoded as a YAML file is: the same values, types, checks
