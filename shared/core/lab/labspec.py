"""A lab's SPEC (``reel lab SPEC``; docs/forks.md): which runs, one edit, the point to make it at, the verdict.

A SPEC is a YAML mapping::

    runs:                       # exactly one of ids / label / recordings
      recordings: ${REEL_DATA_DIR:-../../../shared/data}   # a folder (or file) of recordings, replayed first
      budget_tokens: 8000       # the replays' context budget (recordings only)
      limit: 10                 # at most this many runs (optional)
    at: {judged_by: task-in-final-context}   # exactly one point (see below)
    edit: {drop: {kind: task}}  # exactly one edit (reel fork's vocabulary)
    verifier: task-in-final-context           # optional: the verifier(s) a verdict is made of

``runs.ids`` lists run ids; ``runs.label`` is ``key=value`` (or ``key``: any value) on the runs' labels.
A ``recordings`` path is relative to the SPEC's folder after ``$VAR`` / ``${VAR}`` / ``${VAR:-default}``
expansion (the expansion is the caller's: :func:`parse_spec` takes the environment it expands from).

Points (``at``): ``turn: K`` (the K-th turn, 1-based; negative counts from the last turn, ``last`` is -1),
``judged_by: VERIFIER`` (the turn that verifier's verdict judged), ``after_first_failing_tool: true`` (the turn
after the one whose tool call first failed), ``first_dropped: ITEM`` (the first turn whose packer dropped ITEM).

Edits (``edit``, one key): ``restore: ITEM``, ``drop: ITEM``, ``instructions: FILE`` (relative to the SPEC's
folder), ``model: NAME``, ``param: {KEY: VALUE}`` (one pair), ``tool_result: {call: CALL, file: FILE}`` (or
``text: …``). An ITEM is a context item id (``old-notes``) or ``{kind: K}``: the agent's one context item of
kind K (a recording's task is ``{kind: task}``; its id differs from recording to recording).

Pure: :func:`parse_spec` takes the SPEC's text, its folder and an environment; it reads only the files the
edit names (an instructions or tool-result file), as ``reel fork`` does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import yaml

from reel.shared.core.errors import ReelError
from reel.shared.core.run.forkedits import ContextEdit, Instructions, Model, Param, ToolResult, describe
from reel.shared.core.run.ids import StepId
from reel.shared.core.workflow.fieldhint import with_field_hint


class LabSpecError(ReelError):
    """A SPEC that cannot be run: unreadable, not YAML, a missing or unknown key, two points, no edit…"""

    code = "lab_spec"


class ItemOfKind(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The agent's one context item of ``kind`` (its id is the run's: a recording's task id differs per file)."""

    kind: str


ItemRef = str | ItemOfKind
"""A context item: its id, or the agent's one item of a kind."""


class TurnPoint(msgspec.Struct, frozen=True, kw_only=True):
    """The ``turn``-th turn of the agent (1-based); negative: counted from its last turn (-1 is the last)."""

    turn: int


class JudgedPoint(msgspec.Struct, frozen=True, kw_only=True):
    """The turn ``verifier``'s latest verdict on the branch judged."""

    verifier: str


class AfterFailingTool(msgspec.Struct, frozen=True, kw_only=True):
    """The turn after the turn whose tool call failed first (in step order)."""


class FirstDropped(msgspec.Struct, frozen=True, kw_only=True):
    """The first turn whose partition has ``item`` in its dropped bucket."""

    item: ItemRef


Point = TurnPoint | JudgedPoint | AfterFailingTool | FirstDropped
"""Where a lab forks each run."""


class ItemEdit(msgspec.Struct, frozen=True, kw_only=True):
    """A ``restore`` or ``drop`` (``op``) of ``item``, resolved per run (an item of a kind has the run's id)."""

    op: str
    item: ItemRef


EditTemplate = ItemEdit | Instructions | Model | Param | ToolResult
"""The SPEC's one edit: an item edit resolved per run, or a fork edit as it is sent."""


class Selection(msgspec.Struct, frozen=True, kw_only=True):
    """Which runs: ``ids``, or those with ``label`` (``key``, ``key=value``), or the recordings under
    ``recordings`` (replayed at ``budget_tokens``); at most ``limit``."""

    ids: tuple[str, ...] = ()
    label: tuple[str, str | None] | None = None
    recordings: Path | None = None
    budget_tokens: int = 8000
    limit: int | None = None


class LabSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed SPEC (see the module docstring).

    Attributes:
        verifiers: the verifiers a branch's verdict is made of (``()``: every verifier of the run).
        agent: the agent step forked (``None``: the run's one agent step).
        branch: the branch forked (``None``: the run's root branch, the run as it was first driven).
    """

    name: str
    runs: Selection
    at: Point
    edit: EditTemplate
    verifiers: tuple[str, ...] = ()
    agent: str | None = None
    branch: str | None = None


class _Runs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    ids: list[str] | None = None
    label: str | None = None
    recordings: str | None = None
    budget_tokens: int = 8000
    limit: int | None = None


class _At(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    turn: int | str | None = None
    judged_by: str | None = None
    after_first_failing_tool: bool | None = None
    first_dropped: str | ItemOfKind | None = None


class _ToolResult(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    call: str
    file: str | None = None
    text: str | None = None


class _Edit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    restore: str | ItemOfKind | None = None
    drop: str | ItemOfKind | None = None
    instructions: str | None = None
    model: str | None = None
    param: dict[str, Any] | None = None
    tool_result: _ToolResult | None = None


class _Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    runs: _Runs
    at: _At
    edit: _Edit
    verifier: str | list[str] | None = None
    agent: str | None = None
    branch: str | None = None
    name: str | None = None


_VAR = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
                  r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


def expand(text: str, env: Mapping[str, str]) -> str:
    """``$VAR``, ``${VAR}`` and ``${VAR:-default}`` in ``text`` from ``env``.

    Raises:
        LabSpecError: a variable that is not set and has no default.
    """
    def one(m: re.Match[str]) -> str:
        name = m.group("braced") or m.group("plain")
        if name in env and (env[name] or m.group("default") is None):
            return env[name]
        if m.group("default") is not None:
            return m.group("default")
        raise LabSpecError(f"${name} is not set (write ${{{name}:-default}} for a default)")
    return _VAR.sub(one, text)


def parse_spec(text: str, *, folder: Path, env: Mapping[str, str], name: str = "lab") -> LabSpec:
    """The lab ``text`` (YAML) says, its relative paths taken from ``folder``.

    Args:
        env: what ``$VAR`` in ``runs.recordings`` expands from (the caller's environment).
        name: the lab's name when the SPEC gives none (the caller passes the file's stem).

    Raises:
        LabSpecError: anything the module docstring does not allow, with where (``$.at``) and why.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LabSpecError(f"not YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise LabSpecError(f"a lab SPEC is a mapping with runs, at and edit; got {type(data).__name__}")
    try:
        raw = msgspec.convert(data, _Spec)
    except msgspec.ValidationError as exc:
        raise LabSpecError(with_field_hint(str(exc), _Spec, data)) from None
    verifiers = (raw.verifier,) if isinstance(raw.verifier, str) else tuple(raw.verifier or ())
    return LabSpec(name=raw.name or name, runs=_selection(raw.runs, folder, env),
                   at=_point(raw.at), edit=_edit(raw.edit, folder), verifiers=verifiers, agent=raw.agent,
                   branch=raw.branch)


def _selection(raw: _Runs, folder: Path, env: Mapping[str, str]) -> Selection:
    given = [k for k, v in (("ids", raw.ids), ("label", raw.label), ("recordings", raw.recordings)) if v is not None]
    if len(given) != 1:
        raise LabSpecError(f"runs needs exactly one of ids, label, recordings; got {', '.join(given) or 'none'}"
                           " - at `$.runs`")
    if raw.limit is not None and raw.limit < 1:
        raise LabSpecError(f"runs.limit must be at least 1, got {raw.limit} - at `$.runs.limit`")
    if raw.budget_tokens < 1:
        raise LabSpecError(f"runs.budget_tokens must be positive, got {raw.budget_tokens}")
    if raw.ids is not None:
        if not raw.ids:
            raise LabSpecError("runs.ids is empty - at `$.runs.ids`")
        return Selection(ids=tuple(raw.ids), limit=raw.limit)
    if raw.label is not None:
        key, eq, value = raw.label.partition("=")
        if not key:
            raise LabSpecError(f"runs.label is key or key=value, got {raw.label!r}")
        return Selection(label=(key, value if eq else None), limit=raw.limit)
    path = Path(expand(raw.recordings or "", env))
    return Selection(recordings=path if path.is_absolute() else folder / path, budget_tokens=raw.budget_tokens,
                     limit=raw.limit)


def _point(raw: _At) -> Point:
    given = [k for k in ("turn", "judged_by", "after_first_failing_tool", "first_dropped")
             if getattr(raw, k) is not None]
    if len(given) != 1:
        raise LabSpecError("at needs exactly one of turn, judged_by, after_first_failing_tool, first_dropped;"
                           f" got {', '.join(given) or 'none'} - at `$.at`")
    if raw.turn is not None:
        turn = -1 if raw.turn == "last" else raw.turn
        if not isinstance(turn, int) or turn == 0:
            raise LabSpecError(f"at.turn is a turn number (1 is the first, -1 or last the last), got {raw.turn!r}")
        return TurnPoint(turn=turn)
    if raw.judged_by is not None:
        return JudgedPoint(verifier=raw.judged_by)
    if raw.first_dropped is not None:
        return FirstDropped(item=raw.first_dropped)
    if raw.after_first_failing_tool is not True:
        raise LabSpecError("at.after_first_failing_tool takes true - at `$.at`")
    return AfterFailingTool()


def _read(folder: Path, path: str, what: str) -> str:
    p = Path(path) if Path(path).is_absolute() else folder / path
    try:
        return p.read_text()
    except OSError as exc:
        raise LabSpecError(f"cannot read {what} file {str(p)!r}: {exc.strerror or exc}") from None


def _edit(raw: _Edit, folder: Path) -> EditTemplate:
    given = [k for k in ("restore", "drop", "instructions", "model", "param", "tool_result")
             if getattr(raw, k) is not None]
    if len(given) != 1:
        raise LabSpecError("edit needs exactly one of restore, drop, instructions, model, param, tool_result;"
                           f" got {', '.join(given) or 'none'} - at `$.edit`")
    if raw.restore is not None:
        return ItemEdit(op="restore", item=raw.restore)
    if raw.drop is not None:
        return ItemEdit(op="drop", item=raw.drop)
    if raw.instructions is not None:
        return Instructions(text=_read(folder, raw.instructions, "instructions"))
    if raw.model is not None:
        return Model(name=raw.model)
    if raw.param is not None:
        if len(raw.param) != 1:
            raise LabSpecError(f"edit.param is one KEY: VALUE pair, got {len(raw.param)} - at `$.edit.param`")
        ((key, value),) = raw.param.items()
        return Param(key=key, value=value)
    tr = raw.tool_result
    assert tr is not None
    if (tr.file is None) == (tr.text is None):
        raise LabSpecError("edit.tool_result needs exactly one of file, text - at `$.edit.tool_result`")
    text = tr.text if tr.text is not None else _read(folder, tr.file or "", "tool result")
    return ToolResult(call=StepId(tr.call), text=text)


def describe_point(point: Point) -> str:
    """The point in a few words (the summary's header)."""
    match point:
        case TurnPoint(turn=t):
            return f"turn {t}" if t > 0 else ("the last turn" if t == -1 else f"turn {t} (from the last)")
        case JudgedPoint(verifier=v):
            return f"the turn {v} judged"
        case AfterFailingTool():
            return "the turn after the first failing tool call"
        case FirstDropped(item=item):
            return f"the first turn that dropped {describe_item(item)}"
    return str(point)


def describe_item(item: ItemRef) -> str:
    """``old-notes``, or ``the kind-task item``."""
    return item if isinstance(item, str) else f"the {item.kind} item"


def describe_template(edit: EditTemplate) -> str:
    """The edit in a few words (``drop the task item``)."""
    if isinstance(edit, ItemEdit):
        return f"{edit.op} {describe_item(edit.item)}"
    one: ContextEdit = edit
    return describe(one)
