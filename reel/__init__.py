"""Reel: durable, rewindable, verifiable AI-agent runs on NATS JetStream.

The public Python API (docs/python.md) is the names below; everything else — ``reel.shared`` (the event
model, fold, views, packer and adapters) and ``reel.services`` (the executor, mutators, verifier, CLI and UI
processes) — is importable but internal. A minimal run::

    import reel

    @reel.tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.\"\"\"
        return a + b

    agent = reel.Agent(name="adder", instructions="Use the tools.", tools=[add],
                       model=reel.ScriptedModel(turns=[{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
                                                       {"text": "5"}]))
    print(reel.run_sync(agent, input="What is 2 + 3?").output)

Names are loaded on first use (``import reel`` itself stays light: the ``reel`` command imports it first).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reel import edits as edits
    from reel import events as events
    from reel._agent import Agent as Agent
    from reel._agent import Model as Model
    from reel._agent import OpenAIModel as OpenAIModel
    from reel._agent import ScriptedModel as ScriptedModel
    from reel._client import Client as Client
    from reel._client import RunHandle as RunHandle
    from reel._client import Startable as Startable
    from reel._errors import CommandRefused as CommandRefused
    from reel._errors import CommandTimeout as CommandTimeout
    from reel._errors import IdempotencyConflict as IdempotencyConflict
    from reel._errors import InvalidCommand as InvalidCommand
    from reel._errors import InvalidTransition as InvalidTransition
    from reel._errors import LsnNotInLineage as LsnNotInLineage
    from reel._errors import ReelError as ReelError
    from reel._errors import RequestAnswered as RequestAnswered
    from reel._errors import RequestNotFound as RequestNotFound
    from reel._errors import RunNotFound as RunNotFound
    from reel._errors import RunTimeout as RunTimeout
    from reel._errors import ServiceUnavailable as ServiceUnavailable
    from reel._errors import StepNotFound as StepNotFound
    from reel._errors import WorkflowInvalid as WorkflowInvalid
    from reel._local import Worker as Worker
    from reel._local import block_on as block_on
    from reel._local import local as local
    from reel._local import run as run
    from reel._local import run_sync as run_sync
    from reel._tool import FunctionTool as FunctionTool
    from reel._tool import Tool as Tool
    from reel._tool import ask_user as ask_user
    from reel._tool import command_tool as command_tool
    from reel._tool import mcp_tools as mcp_tools
    from reel._tool import recorded_tool as recorded_tool
    from reel._tool import resume_after as resume_after
    from reel._tool import tool as tool
    from reel._types import CancelReply as CancelReply
    from reel._types import CommitEvent as CommitEvent
    from reel._types import Outcome as Outcome
    from reel._types import PendingRequest as PendingRequest
    from reel._types import RespondReply as RespondReply
    from reel._types import RewindReply as RewindReply
    from reel._types import RunResult as RunResult
    from reel._types import RunStatus as RunStatus
    from reel._types import StartReply as StartReply
    from reel._types import Token as Token
    from reel.shared.core.run.eventfields import Budget as Budget
    from reel.shared.core.run.eventfields import Usage as Usage
    from reel.shared.core.run.eventfields import Verdict as Verdict
    from reel.shared.core.workflow.agentspec import InputSpec as Ask
    from reel.shared.core.workflow.spec import AgentStep as AgentStep
    from reel.shared.core.workflow.spec import ContextItemSpec as ContextItem
    from reel.shared.core.workflow.spec import ModelSpec as ModelSpec
    from reel.shared.core.workflow.spec import ModelStep as ModelStep
    from reel.shared.core.workflow.spec import PolicySpec as Policy
    from reel.shared.core.workflow.spec import Price as Price
    from reel.shared.core.workflow.spec import SleepStep as SleepStep
    from reel.shared.core.workflow.spec import ToolSpec as ToolSpec
    from reel.shared.core.workflow.spec import ToolStep as ToolStep
    from reel.shared.core.workflow.spec import VerifierSpec as Verifier
    from reel.shared.core.workflow.spec import WorkflowSpec as Workflow
    from reel.shared.core.workflow.spec import WorkspaceSpec as Workspace
    from reel.shared.core.workflow.spec import load_workflow as load_workflow

_WHERE: dict[str, tuple[str, str]] = {
    **{n: ("reel._agent", n) for n in ("Agent", "Model", "OpenAIModel", "ScriptedModel")},
    **{n: ("reel._client", n) for n in ("Client", "RunHandle", "Startable")},
    **{n: ("reel._errors", n) for n in (
        "CommandRefused", "CommandTimeout", "IdempotencyConflict", "InvalidCommand", "InvalidTransition",
        "LsnNotInLineage", "ReelError", "RequestAnswered", "RequestNotFound", "RunNotFound", "RunTimeout",
        "ServiceUnavailable", "StepNotFound", "WorkflowInvalid")},
    **{n: ("reel._local", n) for n in ("Worker", "block_on", "local", "run", "run_sync")},
    **{n: ("reel._tool", n) for n in ("FunctionTool", "Tool", "ask_user", "command_tool", "mcp_tools",
                                           "recorded_tool", "resume_after", "tool")},
    **{n: ("reel._types", n) for n in (
        "CancelReply", "CommitEvent", "Outcome", "PendingRequest", "RespondReply", "RewindReply", "RunResult",
        "RunStatus", "StartReply", "Token")},
    "Budget": ("reel.shared.core.run.eventfields", "Budget"),
    "Usage": ("reel.shared.core.run.eventfields", "Usage"),
    "Verdict": ("reel.shared.core.run.eventfields", "Verdict"),
    "Ask": ("reel.shared.core.workflow.agentspec", "InputSpec"),
    "ContextItem": ("reel.shared.core.workflow.spec", "ContextItemSpec"),
    "ModelSpec": ("reel.shared.core.workflow.spec", "ModelSpec"),
    "Policy": ("reel.shared.core.workflow.spec", "PolicySpec"),
    "Price": ("reel.shared.core.workflow.spec", "Price"),
    **{n: ("reel.shared.core.workflow.spec", n) for n in ("AgentStep", "ModelStep", "SleepStep", "ToolSpec",
                                                          "ToolStep")},
    "Verifier": ("reel.shared.core.workflow.spec", "VerifierSpec"),
    "Workflow": ("reel.shared.core.workflow.spec", "WorkflowSpec"),
    "Workspace": ("reel.shared.core.workflow.spec", "WorkspaceSpec"),
    "load_workflow": ("reel.shared.core.workflow.spec", "load_workflow"),
}

__all__ = ["Agent", "AgentStep", "Ask", "Budget", "CancelReply", "Client", "CommandRefused", "CommandTimeout",
           "CommitEvent", "ContextItem", "FunctionTool", "IdempotencyConflict", "InvalidCommand", "InvalidTransition",
           "LsnNotInLineage", "Model", "ModelSpec", "ModelStep", "OpenAIModel", "Outcome", "PendingRequest",
           "Policy", "Price", "ReelError", "RequestAnswered", "RequestNotFound", "RespondReply", "RewindReply",
           "RunHandle", "RunNotFound", "RunResult", "RunStatus", "RunTimeout", "ScriptedModel", "ServiceUnavailable",
           "SleepStep", "StartReply", "Startable", "StepNotFound", "Token", "Tool", "ToolSpec", "ToolStep", "Usage",
           "Verdict", "Verifier", "Worker", "Workflow", "WorkflowInvalid", "Workspace", "ask_user", "block_on",
           "command_tool", "edits", "events", "load_workflow", "local", "mcp_tools", "recorded_tool", "resume_after",
           "run", "run_sync", "tool"]


_MODULES = frozenset({"edits", "events"})
"""Public submodules, loaded on first use too (``reel.events``: the typed events of a run's log; ``reel.edits``: the
edits of a fork)."""


def __getattr__(name: str) -> Any:
    """Load a public name on first use (PEP 562)."""
    if name in _MODULES:
        return importlib.import_module(f"reel.{name}")
    try:
        module, attr = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'reel' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
