"""The built-in verifiers that need nothing but the ctx (docs/verifiers.md).

* ``output_regex`` / ``output_json_schema`` — the judged attempt's output, read whole: one over
  :data:`~reel.shared.core.verify.verifiers.context.VERIFIER_READ_MAX_BYTES` gets an ``error`` verdict (it cannot
  be judged in memory; nothing is read);
* ``context_requires`` — an item id must be ``packed`` in the judged attempt's
  partition (answered from the partition alone: no blob is read);
* ``recorded_outcome`` — a replayed trajectory's own outcome label.

The ``command`` verifier runs a process: it lives in :mod:`reel.shared.proc.verifier`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import jsonschema

from reel.shared.core.verify.verifiers.context import (
    OutputTooLarge,
    VerdictResult,
    VerifierCtx,
    VerifierInvalid,
    errored,
    failed,
    passed,
)
from reel.shared.core.workflow.spec import VerifierSpec


def no_output(ctx: VerifierCtx) -> VerdictResult:
    """The ``fail`` of an output check on a step without output (never ran, or its final attempt failed)."""
    sv = ctx.step_view
    if sv.kind == "agent":  # no attempts of its own: its turns ran
        if sv.status in ("pending", "skipped"):
            return failed(f"agent step {ctx.step} never ran")
        why = f": {sv.error_kind}" if isinstance(sv.error_kind, str) else ""
        return failed(f"agent step {ctx.step} has no output (it {sv.status}{why})")
    a = ctx.attempt_view
    if a is None:
        return failed(f"step {ctx.step} never ran")
    return failed(f"step {ctx.step} has no output (attempt {a.attempt} {a.status})")


class OutputRegex:
    """Passes iff ``pattern`` matches (``re.search``) the judged attempt's output."""

    def __init__(self, spec: VerifierSpec) -> None:
        self.name, self.version = spec.label, spec.version
        try:
            self._re = re.compile(spec.pattern or "")
        except re.error as exc:
            raise VerifierInvalid(f"verifier {spec.label}: invalid regex {spec.pattern!r}: {exc}") from exc

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        try:
            body = await ctx.output()
        except OutputTooLarge as exc:
            return errored(exc.message)
        if body is None:
            return no_output(ctx)
        m = self._re.search(body.decode("utf-8", errors="replace"))
        if m is None:
            return failed(f"/{self._re.pattern}/ does not match the output of {ctx.step}#{ctx.attempt}")
        return passed(f"/{self._re.pattern}/ matches {m.group(0)[:80]!r} at offset {m.start()}")


class OutputJsonSchema:
    """Passes iff the judged attempt's output is JSON valid against ``json_schema``."""

    def __init__(self, spec: VerifierSpec) -> None:
        self.name, self.version = spec.label, spec.version
        schema = spec.json_schema or {}
        cls = jsonschema.validators.validator_for(schema)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise VerifierInvalid(f"verifier {spec.label}: invalid JSON Schema: {exc.message}") from exc
        self._validator = cls(schema)

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        try:
            body = await ctx.output()
        except OutputTooLarge as exc:
            return errored(exc.message)
        if body is None:
            return no_output(ctx)
        try:
            doc = json.loads(body)
        except ValueError as exc:
            return failed(f"output of {ctx.step}#{ctx.attempt} is not JSON: {exc}")
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(doc))
        if error is not None:
            where = "$" + "".join(f"[{p!r}]" for p in error.absolute_path)
            return failed(f"schema violation at {where}: {error.message}")
        return passed(f"output of {ctx.step}#{ctx.attempt} matches the schema")


class ContextRequires:
    """Passes iff ``item`` is ``packed`` in the judged attempt's ContextPartition.

    Answered from the partition inline in the view: it never touches ``ctx.blobs``.
    """

    def __init__(self, spec: VerifierSpec) -> None:
        self.name, self.version = spec.label, spec.version
        self._item = spec.item or ""

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        a = ctx.attempt_view
        if a is None:
            return failed(f"step {ctx.step} never ran")
        p = a.context
        if p is None:
            return errored(f"step {ctx.step} is a {ctx.step_view.kind} step: it has no context partition")
        where = f"{ctx.step}#{a.attempt}"
        if self._item in p.packed:
            return passed(f"{self._item} packed in {where} (position {p.packed.index(self._item) + 1}/{len(p.packed)})")
        if self._item in p.available:
            return failed(f"{self._item} was available but not packed in {where} (token budget)")
        if self._item in p.dropped:
            return failed(f"{self._item} was dropped by policy in {where}")
        return failed(f"{self._item} was not a candidate of {where}")


class RecordedOutcome:
    """For replayed trajectories: passes iff the recording's own label says the agent succeeded.

    ``expect`` is the label as a boolean (set by the trajectory loader); ``label``
    (built from the workflow's ``source``: outcome, reward, the file it came from)
    is quoted in the reason.
    """

    def __init__(self, spec: VerifierSpec, label: str | None = None) -> None:
        self.name, self.version = spec.label, spec.version
        self._expect = bool(spec.expect)
        self._label = label if label is not None else ("success" if self._expect else "failure")

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        if self._expect:
            return passed(f"the recording's outcome label is {self._label!r}: the agent succeeded")
        return failed(f"the recording's outcome label is {self._label!r}: the agent did not succeed")


def outcome_label(source: Mapping[str, Any]) -> str | None:
    """The recording's own outcome label as the trajectory loader put it in ``source``.

    E.g. ``outcome=false from django-10999.report.json`` or ``outcome=true reward=1.0``.
    """
    if source.get("outcome") is None:
        return None
    parts = [f"outcome={json.dumps(source['outcome'])}"]
    if source.get("reward") is not None:
        parts.append(f"reward={source['reward']}")
    if source.get("outcome_from"):
        parts.append(f"from {PurePath(str(source['outcome_from'])).name}")
    return " ".join(parts)
