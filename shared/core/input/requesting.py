"""Human input, the pure builders: which declared calls ask a human, and their requests.

:func:`request_events` is what the commit of a turn's answer carries for its calls that
ask first (:func:`reel.shared.core.agent.commits.turn_outcome`): one
:class:`~reel.shared.core.input.requestevents.InputRequested` per call of an ``ask_user`` tool or of a
tool that needs approval. A call that cannot run anyway — an unknown tool, arguments that
are not a JSON object or fail the tool's ``parameters`` — asks nobody: it runs and fails
as the usual ``invalid_arguments`` observation. :func:`argument_error` is the one schema
check, shared with the respond decision's edited arguments (:mod:`reel.shared.core.input.respond`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from reel.shared.core.chat.messages import ToolCall
from reel.shared.core.input.requestevents import InputRequested
from reel.shared.core.run.events import DeclaredStep
from reel.shared.core.run.ids import BranchId, request_id_for
from reel.shared.core.wire import limits
from reel.shared.core.workflow.agentspec import AgentToolSpec, ApprovalPolicy
from reel.shared.core.workflow.spec import AgentStep


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    return jsonschema.validators.validator_for(schema)(schema)


def argument_error(schema: Mapping[str, Any], arguments: object, where: str = "$") -> str | None:
    """Why ``arguments`` do not fit the JSON Schema ``schema`` (the first violation, naming its path under
    ``where``, e.g. ``'x' is a required property (at `$.arguments`)``), or ``None`` when they do."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__} (at `{where}`)"
    error = jsonschema.exceptions.best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(arguments))
    if error is None:
        return None
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return f"{error.message} (at `{where}{path}`)"


def parsed(arguments: str) -> object:
    """The decoded JSON of a call's raw arguments (``{}`` for an empty string; ``None`` when not JSON or nested
    deeper than :data:`~reel.shared.core.wire.limits.MAX_DEPTH`)."""
    if limits.json_deeper_than(arguments):
        return None
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return None


def request_events(run_id: str, branch_id: BranchId, agent: AgentStep, approval: ApprovalPolicy | None,
                   decls: Sequence[DeclaredStep], calls: Sequence[ToolCall], *, at_ms: int
                   ) -> tuple[InputRequested, ...]:
    """The requests of the calls ``decls`` (declared from ``calls``, in the same order) that ask a human first.

    Args:
        approval: the workflow's approval policy (tools needing approval by name), if any.
        at_ms: the commit's time (epoch ms); a request's deadline is ``at_ms + timeout_s``.
    """
    tools: dict[str, AgentToolSpec] = {t.name: t for t in agent.tools}
    out: list[InputRequested] = []
    for d, call in zip(decls, calls, strict=True):
        tool = tools.get(d.tool_name or "")
        how = tool.asks(approval) if tool is not None else None
        if tool is None or how is None:
            continue
        args = parsed(call.arguments)
        if argument_error(tool.schema, args) is not None:
            continue
        kind, spec = how
        question = str(args.get("question", "")) if kind == "question" and isinstance(args, dict) else ""
        deadline = at_ms + round(spec.timeout_s * 1000) if spec.timeout_s is not None else None
        out.append(InputRequested(
            branch_id=branch_id, request_id=request_id_for(run_id, branch_id, d.step_id), step_id=d.step_id,
            kind=kind, tool_name=tool.name, call_id=d.call_id or "", asked=spec.ask, question=question,
            deadline_ms=deadline, default=spec.default if deadline is not None else None,
            default_note=spec.note if deadline is not None else "", at_ms=at_ms))
    return tuple(out)
