"""Verifier specs of a workflow and their load-time checks (see docs/verifiers.md).

Re-exported by :mod:`reel.shared.core.workflow.spec`, where a workflow's ``verifiers:`` are declared.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from reel.shared.core.env.toolenv import check_process_env
from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.run.stepids import parse_step_id
from reel.shared.core.workflow.schemacheck import schema_problem

VerifierType = Literal[
    "output_regex", "output_json_schema", "command", "context_requires", "recorded_outcome", "python"
]


class VerifierSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A verifier configured on a workflow (see docs/verifiers.md).

    Attributes:
        type: built-in kind, or ``python`` with ``path`` = ``module:callable``.
        name: unique name (default: the type).
        step: the step judged (default: the last step).
        pattern: regex for ``output_regex``; ``json_schema`` for ``output_json_schema``.
        argv: command for ``command`` (output on stdin and in ``$REEL_OUTPUT_FILE``).
        item: context item id for ``context_requires``.
        expect: the recording's own outcome label for ``recorded_outcome``.
        timeout_s: deadline of this verifier (s).
        env, pass_env: a ``command`` verifier's own variables, and the names passed through from the
            verifier service's environment (:mod:`reel.shared.core.env.toolenv`; ``REEL_NATS_*`` refused at load).
    """

    type: VerifierType
    name: str | None = None
    step: str | None = None
    pattern: str | None = None
    json_schema: dict[str, Any] | None = None
    argv: tuple[str, ...] = ()
    item: str | None = None
    expect: bool | None = None
    path: str | None = None
    version: str = "1"
    timeout_s: float = 30.0
    env: dict[str, str] | msgspec.UnsetType = msgspec.UNSET
    pass_env: tuple[str, ...] | msgspec.UnsetType = msgspec.UNSET

    @property
    def label(self) -> str:
        return self.name or self.type


def check_verifiers(verifiers: tuple[VerifierSpec, ...], steps: set[str], agents: set[str]) -> None:
    """Semantic checks of a workflow's verifiers.

    Args:
        steps: the workflow's step ids; ``agents`` those of its agent steps, whose
            turns and calls (``solve:t2``, ``solve:t2:c0``) a verifier may judge too.

    Raises:
        WorkflowInvalid: naming the field path (``$.verifiers[i]...``) of the first problem.
    """
    names: set[str] = set()
    for i, v in enumerate(verifiers):
        at = f"$.verifiers[{i}]"
        if v.label in names:
            raise WorkflowInvalid(f"duplicate verifier name {v.label!r} (at `{at}.name`)")
        names.add(v.label)
        parsed = parse_step_id(v.step) if v.step is not None else None
        if v.step is not None and v.step not in steps and (parsed is None or parsed[0] not in agents):
            raise WorkflowInvalid(f"verifier step {v.step!r} is not a step of the workflow (at `{at}.step`)")
        _check_verifier_params(v, at)
        check_process_env(v, v.type == "command", at)
        need = {"output_regex": v.pattern, "output_json_schema": v.json_schema, "context_requires": v.item,
                "python": v.path, "command": v.argv or None, "recorded_outcome": v.expect}
        if need.get(v.type) is None:
            field = {"output_regex": "pattern", "output_json_schema": "json_schema", "context_requires": "item",
                     "python": "path", "command": "argv", "recorded_outcome": "expect"}[v.type]
            raise WorkflowInvalid(f"verifier {v.type} needs `{field}` (at `{at}.{field}`)")


def _check_verifier_params(v: VerifierSpec, at: str) -> None:
    if v.pattern is not None:
        try:
            re.compile(v.pattern)
        except re.error as exc:
            raise WorkflowInvalid(f"invalid regex {v.pattern!r}: {exc} (at `{at}.pattern`)") from exc
    if v.json_schema is not None:
        problem = schema_problem(v.json_schema)
        if problem is not None:
            raise WorkflowInvalid(f"invalid JSON Schema: {problem} (at `{at}.json_schema`)")
    if v.timeout_s <= 0:
        raise WorkflowInvalid(f"timeout_s must be > 0 (at `{at}.timeout_s`)")
