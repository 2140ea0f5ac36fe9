"""Workflow specs: what a run executes (YAML or JSON; documented in docs/workflow.md).

A workflow is an ordered list of steps. A **model step** packs candidate context
under a token budget and calls a model adapter; a **tool step** calls a tool; an
**agent step** loops model turns and the tool calls they ask for (see
:mod:`reel.shared.core.workflow.agentspec`); a **sleep step** waits, durably, for a time
(:mod:`reel.shared.core.run.timers`).
Validation happens once at the edge (:func:`parse_workflow`), with an error that
names the offending field, e.g.
``workflow_invalid: Expected `int`, got `str` - at `$.steps[0].max_attempts```.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from reel.shared.core.chat.finish import OnTruncated
from reel.shared.core.env import interpolate
from reel.shared.core.env.toolenv import check_process_env
from reel.shared.core.errors import InvalidCommand, WorkflowInvalid
from reel.shared.core.run.events import Budget, StepDecl
from reel.shared.core.run.ids import StepId
from reel.shared.core.verify.verifierspec import VerifierSpec as VerifierSpec
from reel.shared.core.verify.verifierspec import VerifierType as VerifierType
from reel.shared.core.verify.verifierspec import check_verifiers
from reel.shared.core.wire import limits
from reel.shared.core.wire.subjects import is_token
from reel.shared.core.workflow.agentspec import (
    RESERVED_ITEM_IDS,
    AgentToolSpec,
    ApprovalPolicy,
    check_input,
    check_tool,
    mcp_prefix,
)
from reel.shared.core.workflow.fieldhint import with_field_hint
from reel.shared.core.workflow.mcpspec import SEPARATOR

# Re-exported (`X as X`): these lived here before reel.shared.core.workflow.modelspec.
from reel.shared.core.workflow.modelspec import MODEL_ADAPTERS as MODEL_ADAPTERS
from reel.shared.core.workflow.modelspec import ModelSpec as ModelSpec
from reel.shared.core.workflow.modelspec import Price as Price
from reel.shared.core.workflow.modelspec import RecordedUsage as RecordedUsage
from reel.shared.core.workflow.modelspec import ScriptedFailure as ScriptedFailure
from reel.shared.core.workflow.modelspec import ScriptedOutput as ScriptedOutput
from reel.shared.core.workflow.modelspec import ScriptedToolCall as ScriptedToolCall
from reel.shared.core.workflow.modelspec import ScriptedTurn as ScriptedTurn
from reel.shared.core.workflow.modelspec import check_model_spec
from reel.shared.core.workflow.toolspec import ToolSpec as ToolSpec
from reel.shared.core.workflow.toolspec import check_limits


class ContextItemSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A candidate context item: literal ``text`` or the output of an earlier step (``from_step``)."""

    id: str
    text: str | None = None
    from_step: str | None = None
    kind: str = "message"
    priority: float = 0.0
    stale: bool = False


class PolicySpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Packing policy of one model step (see :mod:`reel.shared.core.pack.packer`); tokens."""

    budget_tokens: int | None = None
    exclude_kinds: tuple[str, ...] = ()
    max_item_tokens: int | None = None
    drop_stale: bool = True
    dedupe: bool = True


class ModelStep(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="model", tag_field="kind"):
    """Pack context, call a model.

    Attributes:
        on_truncated: what an answer cut by the server (finish reason ``length`` or ``content_filter``)
            does: ``fail`` (unset: the default), ``retry`` or ``continue`` (:mod:`reel.shared.core.chat.finish`).
    """

    id: str
    model: ModelSpec
    instructions: str = ""
    context: tuple[ContextItemSpec, ...] = ()
    include_previous_outputs: bool = False
    policy: PolicySpec = PolicySpec()
    max_attempts: int = 1
    on_truncated: OnTruncated | msgspec.UnsetType = msgspec.UNSET

    @property
    def truncation_policy(self) -> OnTruncated:
        """``on_truncated``, ``fail`` when unset."""
        return "fail" if isinstance(self.on_truncated, msgspec.UnsetType) else self.on_truncated


class ToolStep(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="tool", tag_field="kind"):
    """Call a tool."""

    id: str
    tool: ToolSpec
    max_attempts: int = 1


class AgentStep(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="agent",
                tag_field="kind"):
    """A model-driven loop: turn *t* is a model call over the task and the earlier turns; its tool calls
    run as steps of their own and their results feed turn *t+1* (docs/workflow.md).

    Attributes:
        max_turns: the turn that asks for tools at this bound fails the step (``max_turns``).
        max_attempts: attempts of each turn; max_parallel_tools: calls of one turn running at once.
        on_truncated: what a turn whose answer the server cut (finish reason ``length`` or
            ``content_filter``) does: ``fail`` the agent (unset: the default), ``retry`` the turn, or
            ``continue`` with the cut answer (:mod:`reel.shared.core.chat.finish`).
    """

    id: str
    model: ModelSpec
    instructions: str = ""
    context: tuple[ContextItemSpec, ...] = ()
    policy: PolicySpec = PolicySpec()
    tools: tuple[AgentToolSpec, ...] = ()
    max_turns: int = 12
    max_attempts: int = 1
    max_parallel_tools: int = 4
    on_truncated: OnTruncated | msgspec.UnsetType = msgspec.UNSET

    @property
    def truncation_policy(self) -> OnTruncated:
        """``on_truncated``, ``fail`` when unset."""
        return "fail" if isinstance(self.on_truncated, msgspec.UnsetType) else self.on_truncated


class SleepStep(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="sleep",
                tag_field="kind"):
    """Wait, durably: the run rests in ``sleeping`` (no process holds it) until the time, then goes on.

    Exactly one of:

    Attributes:
        for_s: how long (seconds, ≥ 0), counted from when the executor reaches the step.
        until: an ISO-8601 time with a UTC offset (``2026-12-02T08:00:00Z``, ``…+01:00``); a time already
            past does not wait.

    The step's output is a JSON object ``{"wake_ms", "woke_ms", "late_ms"}`` (epoch ms; ``late_ms``: how much
    later than ``wake_ms`` the run woke).
    """

    id: str
    for_s: float | None = None
    until: str | None = None

    @property
    def max_attempts(self) -> int:
        """A sleep step is one attempt (recorded when it wakes)."""
        return 1

    def wake_ms(self, now_ms: int) -> int:
        """When a sleep reached at ``now_ms`` (epoch ms) ends (epoch ms). Pure.

        Raises:
            WorkflowInvalid: ``until`` is not an ISO-8601 time with an offset (checked at load already).
        """
        if self.for_s is not None:
            return now_ms + round(self.for_s * 1000)
        return until_ms(self.until or "", "until")


def until_ms(text: str, where: str) -> int:
    """An ISO-8601 time with a UTC offset as epoch ms (``Z`` is UTC). Pure (no clock).

    Raises:
        WorkflowInvalid: not such a time (naming ``where``).
    """
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError as exc:
        raise WorkflowInvalid(f"{text!r} is not an ISO-8601 time (at `{where}`)") from exc
    if at.tzinfo is None:
        raise WorkflowInvalid(f"{text!r} has no UTC offset: write e.g. {text}Z or {text}+00:00 (at `{where}`)")
    return round(at.timestamp() * 1000)


Step = ModelStep | ToolStep | AgentStep | SleepStep


class WorkspaceSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename={"from_": "from"}):
    """The folder a workflow's tools work in (docs/workspaces.md): every branch gets its own working copy.

    Attributes:
        from_: (``from:``; ``path:`` says the same) the folder each run's workspace starts as, relative to the
            workflow file's folder; it is read once, at start, and never written.
        ignore: glob patterns (``fnmatch``, against each relative path and each of its parts) left out of
            every snapshot: ``__pycache__``, ``.git``, ``*.pyc`` by default.
        max_bytes: the most a snapshot may hold (bytes of files); a bigger workspace is refused at start
            (``workspace_too_large``) and fails the call that grew it past the limit.
        max_files: the most files a snapshot may hold (same rule).
    """

    from_: str | None = None
    path: str | None = None
    ignore: tuple[str, ...] = ("__pycache__", ".git", "*.pyc")
    max_bytes: int = 64 * 1024 * 1024
    max_files: int = 10_000

    @property
    def source(self) -> str:
        """The seed folder (``from:`` or ``path:``). Raises ValueError when neither or both are set."""
        if (self.from_ is None) == (self.path is None):
            raise ValueError("workspace needs exactly one of `from` or `path`")
        return self.from_ or self.path or ""


class WorkflowSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A whole workflow.

    Attributes:
        name: workflow name (free text).
        budget_tokens: default context budget of model steps (tokens).
        steps: executed in order; a step that fails after its last attempt ends the run.
        verifiers: run when the run rests in ``Verifying``.
        source: where a replayed workflow came from (file, format, outcome label).
        approval: the tools (by name, in every agent step) whose calls wait for a human's approval.
        budget: what the run may spend (:class:`~reel.shared.core.run.events.Budget`: tokens, USD, wall seconds,
            tool calls) — not ``budget_tokens``, the context one model call may carry; unset: the namespace's
            default (``REEL_BUDGET``), if any.
        prices: model name → :class:`Price`, extending the built-in table
            (:data:`reel.shared.core.workflow.prices.PRICES`); a model's own ``price`` wins.
        on_code_change: what an attempt does whose code (a Python tool's module, a command's executable, the
            model adapter, Reel's version) differs from what the step's tool ran before in the run:
            ``continue`` (unset: the default; ``reel show`` marks it) or ``fail`` (the run stops there, with
            ``step_halted`` ``code_changed``).
    """

    name: str
    description: str = ""
    budget_tokens: int = 8000
    steps: tuple[Step, ...]
    verifiers: tuple[VerifierSpec, ...] = ()
    labels: dict[str, str] = {}
    source: dict[str, Any] = {}
    approval: ApprovalPolicy | None = None
    budget: Budget | msgspec.UnsetType = msgspec.UNSET
    prices: dict[str, Price] | msgspec.UnsetType = msgspec.UNSET
    on_code_change: Literal["continue", "fail"] | msgspec.UnsetType = msgspec.UNSET
    workspace: WorkspaceSpec | msgspec.UnsetType = msgspec.UNSET

    @property
    def price_table(self) -> dict[str, Price]:
        """``prices``, empty when unset."""
        return self.prices if isinstance(self.prices, dict) else {}

    @property
    def code_change_policy(self) -> Literal["continue", "fail"]:
        """``on_code_change``, ``continue`` when unset."""
        return "continue" if isinstance(self.on_code_change, msgspec.UnsetType) else self.on_code_change

    def step(self, step_id: str) -> ModelStep | ToolStep:
        """The model or tool step named ``step_id`` (what a ``Dispatch`` names). Raises KeyError (also for an
        agent or a sleep step: see :meth:`agent`, :meth:`sleep`)."""
        for s in self.steps:
            if s.id == step_id and isinstance(s, ModelStep | ToolStep):
                return s
        raise KeyError(step_id)

    def sleep(self, step_id: str) -> SleepStep:
        """The sleep step named ``step_id``. Raises KeyError."""
        for s in self.steps:
            if s.id == step_id and isinstance(s, SleepStep):
                return s
        raise KeyError(step_id)

    def agent(self, step_id: str) -> AgentStep:
        """The agent step named ``step_id``. Raises KeyError."""
        for s in self.steps:
            if s.id == step_id and isinstance(s, AgentStep):
                return s
        raise KeyError(step_id)

    def model_key_names(self) -> frozenset[str]:
        """The environment variables holding the API keys of the workflow's models (``api_key_env``, agent and
        plain steps): no tool gets them unless it names them in ``pass_env``; their values are scrubbed from
        what a service records (shared/auth/secrets.py)."""
        return frozenset(s.model.api_key_env for s in self.steps
                         if isinstance(s, ModelStep | AgentStep) and isinstance(s.model.api_key_env, str))

    def decls(self) -> tuple[StepDecl, ...]:
        """What the fold needs to know of the steps."""
        return tuple(
            StepDecl(step_id=StepId(s.id), kind="agent", max_attempts=s.max_attempts, max_turns=s.max_turns,
                     max_parallel_tools=s.max_parallel_tools) if isinstance(s, AgentStep)
            else StepDecl(step_id=StepId(s.id), kind="sleep") if isinstance(s, SleepStep)
            else StepDecl(step_id=StepId(s.id), kind="model" if isinstance(s, ModelStep) else "tool",
                          max_attempts=s.max_attempts)
            for s in self.steps
        )


_json_encoder = msgspec.json.Encoder()
MAX_SLEEP_S = 366 * 24 * 3600.0
"""The longest ``for_s`` a sleep step takes (a year and a day, seconds)."""


def encode_workflow(spec: WorkflowSpec) -> bytes:
    """Canonical JSON of a spec (what goes into the workflow blob)."""
    return _json_encoder.encode(spec)


def check_budget(budget: Budget, where: str) -> None:
    """A budget's limits are > 0 where set.

    Raises:
        WorkflowInvalid: naming the limit, e.g. ``max_cost_usd must be > 0 (at `$.budget.max_cost_usd`)``.
    """
    for field in budget.__struct_fields__:
        value = getattr(budget, field)
        if value is not None and value <= 0:
            raise WorkflowInvalid(f"{field} must be > 0 (at `{where}.{field}`)")


def validate_workflow(spec: WorkflowSpec) -> WorkflowSpec:
    """Semantic checks msgspec cannot express (unique ids, references to earlier steps…).

    Raises:
        WorkflowInvalid: naming the field path of the first problem.
    """
    if not spec.steps:
        raise WorkflowInvalid("workflow has no steps (at `$.steps`)")
    seen: set[str] = set()
    for i, step in enumerate(spec.steps):
        where = f"$.steps[{i}]"
        if not is_token(step.id):
            raise WorkflowInvalid(f"step id {step.id!r} must match [A-Za-z0-9_-]{{1,128}} (at `{where}.id`)")
        if step.id in seen:
            raise WorkflowInvalid(f"duplicate step id {step.id!r} (at `{where}.id`)")
        if step.max_attempts < 1:
            raise WorkflowInvalid(f"max_attempts must be >= 1 (at `{where}.max_attempts`)")
        if isinstance(step, ModelStep | AgentStep):
            _check_model(step, seen, where)
            if isinstance(step, AgentStep):
                _check_agent(step, where)
        elif isinstance(step, SleepStep):
            _check_sleep(step, where)
        else:
            _check_tool(step, seen, where)
        seen.add(step.id)
    check_verifiers(spec.verifiers, seen, {s.id for s in spec.steps if isinstance(s, AgentStep)})
    if spec.approval is not None:
        check_input(spec.approval, "approval", "$.approval")
    if isinstance(spec.budget, Budget):
        check_budget(spec.budget, "$.budget")
    for name, price in spec.price_table.items():
        for field in ("input_usd_per_mtok", "output_usd_per_mtok"):
            if getattr(price, field) < 0:
                raise WorkflowInvalid(f"price may not be negative (at `$.prices.{name}.{field}`)")
    return spec


def _check_sleep(step: SleepStep, where: str) -> None:
    """Exactly one of ``for_s`` (≥ 0) and ``until`` (an ISO-8601 time with an offset).

    Raises:
        WorkflowInvalid: naming the field, e.g. ``a sleep step needs exactly one of `for_s` or `until```.
    """
    if (step.for_s is None) == (step.until is None):
        raise WorkflowInvalid(f"a sleep step needs exactly one of `for_s` or `until` (at `{where}`)")
    if step.for_s is not None and not 0 <= step.for_s <= MAX_SLEEP_S:
        raise WorkflowInvalid(f"for_s must be between 0 and {MAX_SLEEP_S} seconds (at `{where}.for_s`)")
    if step.until is not None:
        until_ms(step.until, f"{where}.until")


def _check_agent(step: AgentStep, where: str) -> None:
    """The agent-only checks of one ``kind: agent`` step (the model and context checks are shared).

    Raises:
        WorkflowInvalid: naming the field path of the first problem, e.g.
            ``duplicate tool name 'read' (at `$.steps[0].tools[2].name`)``.
    """
    for field in ("max_turns", "max_parallel_tools"):
        if getattr(step, field) < 1:
            raise WorkflowInvalid(f"{field} must be >= 1 (at `{where}.{field}`)")
    for j, item in enumerate(step.context):
        if item.id in RESERVED_ITEM_IDS or ":" in item.id:
            raise WorkflowInvalid(f"context item id {item.id!r} is reserved in an agent step (`instructions` and"
                                  f" ids with `:` name the loop's own items) (at `{where}.context[{j}].id`)")
    if not any(item.kind == "task" for item in step.context):
        raise WorkflowInvalid(f"an agent step needs a context item of kind `task` (the request every turn leads"
                              f" with) (at `{where}.context`)")
    names: set[str] = set()
    for j, tool in enumerate(step.tools):
        at = f"{where}.tools[{j}]"
        name = f"{mcp_prefix(tool)}{SEPARATOR}*" if tool.type == "mcp" else tool.name
        if name in names:
            raise WorkflowInvalid(f"duplicate tool name {name!r} (at `{at}.name`)")
        names.add(name)
        check_tool(tool, at)


def _check_model(step: ModelStep | AgentStep, earlier: set[str], where: str) -> None:
    check_model_spec(step.model, f"{where}.model")
    ids: set[str] = set()
    for j, item in enumerate(step.context):
        at = f"{where}.context[{j}]"
        if item.id in ids:
            raise WorkflowInvalid(f"duplicate context item id {item.id!r} (at `{at}.id`)")
        ids.add(item.id)
        if (item.text is None) == (item.from_step is None):
            raise WorkflowInvalid(f"context item needs exactly one of `text` or `from_step` (at `{at}`)")
        if item.from_step is not None and item.from_step not in earlier:
            raise WorkflowInvalid(f"from_step {item.from_step!r} is not an earlier step (at `{at}.from_step`)")


def _check_tool(step: ToolStep, earlier: set[str], where: str) -> None:
    t = step.tool
    if t.type == "recorded" and t.output is None:
        raise WorkflowInvalid(f"recorded tool needs `output` (at `{where}.tool.output`)")
    if t.type == "scripted" and not t.outputs:
        raise WorkflowInvalid(f"scripted tool needs `outputs` (at `{where}.tool.outputs`)")
    if t.type == "command" and not t.argv:
        raise WorkflowInvalid(f"command tool needs `argv` (at `{where}.tool.argv`)")
    if t.stdin_from is not None and t.stdin_from not in earlier:
        raise WorkflowInvalid(f"stdin_from {t.stdin_from!r} is not an earlier step (at `{where}.tool.stdin_from`)")
    check_limits(t, f"{where}.tool")
    check_process_env(t, t.type == "command", f"{where}.tool")


def parse_workflow(
    data: bytes | str | dict[str, Any], *, fmt: Literal["json", "yaml", "auto"] = "auto"
) -> WorkflowSpec:
    """Decode and validate a workflow from JSON/YAML text or an already-parsed mapping.

    A document over :data:`~reel.shared.core.wire.limits.MAX_WORKFLOW_BYTES` or nested deeper than
    :data:`~reel.shared.core.wire.limits.MAX_DEPTH` is refused before (JSON) or right after (YAML) it is decoded.

    Raises:
        WorkflowInvalid: with the field path of the first problem found; ``nested deeper than 64``.
    """
    raw: object = data  # the document as decoded, for an unknown field's hint
    try:
        if isinstance(data, dict):
            limits.check_value(data, what="workflow")
            spec = msgspec.convert(data, WorkflowSpec)
        else:
            text = data.decode() if isinstance(data, bytes) else data
            if fmt == "json" or (fmt == "auto" and text.lstrip().startswith("{")):
                limits.check_json(text, max_bytes=limits.MAX_WORKFLOW_BYTES, what="workflow")
                raw = None
                spec = msgspec.json.decode(text, type=WorkflowSpec)
            else:
                raw = _yaml(text)
                spec = msgspec.convert(raw, WorkflowSpec)
    except InvalidCommand as exc:
        raise WorkflowInvalid(f"invalid workflow: {exc.message}") from exc
    except (msgspec.ValidationError, msgspec.DecodeError, yaml.YAMLError, UnicodeDecodeError) as exc:
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
            mark = exc.problem_mark
            msg = f"YAML syntax error: {exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
        else:
            msg = " ".join(str(exc).split()).replace("Invalid value", "invalid value")
        if not isinstance(data, dict) and fmt != "json" and isinstance(exc, msgspec.ValidationError) \
                and "Expected `object`" in msg and "$." not in msg:
            msg += " (the file must hold one mapping with `name` and `steps`)"
        if "`$.steps[" in msg and ".kind`" in msg:
            msg += " (a step's `kind` must be `model`, `tool`, `agent` or `sleep`)"
        if "Expected `float" in msg and "got `str`" in msg and fmt != "json":
            msg += " (YAML reads a number such as `1e12` as text: write `1.0e+12`, or the plain digits)"
        if "unknown field" in msg or "Invalid enum value" in msg:
            if raw is None:  # JSON: decoded again only to follow the field's path (it is bounded already)
                raw = msgspec.json.decode(text)
            hinted = with_field_hint(msg, WorkflowSpec, raw)
            if hinted != msg:
                msg = hinted
            elif ".tools[" in msg:
                msg += " (a tool's type is one of `python`, `command`, `recorded` or `builtin`)"
        raise WorkflowInvalid(f"invalid workflow: {msg}") from exc
    return validate_workflow(spec)


def _yaml(text: str) -> Any:
    """The YAML document ``text``, bounded like JSON: its size; its flow collections' brackets (``[``/``{``
    outside double quotes, counted as in JSON before parsing: PyYAML's scanner spends time quadratic in
    their nesting); then, once composed, the depth of what it holds.

    Raises:
        InvalidCommand: over :data:`~reel.shared.core.wire.limits.MAX_WORKFLOW_BYTES` or nested deeper than
            :data:`~reel.shared.core.wire.limits.MAX_DEPTH` (the composer's own recursion included).
        yaml.YAMLError: not YAML.
    """
    if len(text) > limits.MAX_WORKFLOW_BYTES:
        raise InvalidCommand(f"workflow is {len(text)} bytes, over the limit of {limits.MAX_WORKFLOW_BYTES}")
    if limits.json_deeper_than(text):
        raise InvalidCommand(limits.too_deep(" (flow collections in the workflow)"))
    try:
        doc = yaml.safe_load(text)
    except RecursionError as exc:
        raise InvalidCommand(limits.too_deep(" (arrays and objects in the workflow)")) from exc
    limits.check_value(doc, what="workflow")
    return doc


def expand_env(data: Any, env: Mapping[str, str], where: str = "$") -> Any:
    """``data`` (a decoded workflow document) with ``${NAME}`` / ``${NAME:-default}`` replaced from ``env`` in every
    string, innermost first (``${A:-${B}}``); ``$${`` is a literal ``${``. Keys are left alone.

    Raises:
        WorkflowInvalid: a variable without default is not set (naming it and the field).
    """
    if isinstance(data, dict):
        return {k: expand_env(v, env, f"{where}.{k}") for k, v in data.items()}
    if isinstance(data, list):
        return [expand_env(v, env, f"{where}[{i}]") for i, v in enumerate(data)]
    if not isinstance(data, str):
        return data

    return interpolate.expand(data, env, lambda name: WorkflowInvalid(
        f"environment variable {name} is not set and ${{{name}}} has no default (at `{where}`)"))


def load_workflow(path: str | Path, *, env: Mapping[str, str] | None = None) -> WorkflowSpec:
    """Read and validate a workflow file (``.json``, ``.yaml`` or ``.yml``).

    Args:
        env: when given, ``${NAME}`` / ``${NAME:-default}`` in the file's strings are replaced
            from it first (:func:`expand_env`; ``reel run`` passes the environment).

    Raises:
        WorkflowInvalid: unreadable file (or not UTF-8) or invalid content (message names the file).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkflowInvalid(f"cannot read workflow {p}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise WorkflowInvalid(f"cannot read workflow {p}: not UTF-8 text (byte {exc.start})") from None
    fmt: Literal["json", "auto"] = "json" if p.suffix == ".json" else "auto"
    try:
        if env is not None:
            raw = _decoded(text, fmt)
            if isinstance(raw, dict):
                return parse_workflow(expand_env(raw, env))
        return parse_workflow(text, fmt=fmt)
    except WorkflowInvalid as exc:
        raise WorkflowInvalid(f"{p}: {exc.message}") from exc


def _decoded(text: str, fmt: Literal["json", "auto"]) -> Any:
    """The document, or ``None`` when it does not decode (then :func:`parse_workflow` says why)."""
    try:
        if fmt == "json":
            limits.check_json(text, max_bytes=limits.MAX_WORKFLOW_BYTES, what="workflow")
            return msgspec.json.decode(text)
        return _yaml(text)
    except (msgspec.DecodeError, yaml.YAMLError, InvalidCommand):
        return None
