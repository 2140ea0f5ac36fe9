"""Whether a JSON Schema is one, asked once per distinct schema.

A meta-schema check (``check_schema``) walks the whole draft meta-schema through ``$ref``/``$dynamicRef``
resolution: milliseconds for a small schema. Every start of a workflow checks each tool's ``parameters``
and every verifier's ``json_schema``, and a thousand runs of one workflow carry the same few schemas, so
the verdict is kept by the schema's canonical JSON (a pure function of it: the same answer as asking again).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema

SCHEMA_CHECKS_KEPT = 1024


def schema_problem(schema: dict[str, Any]) -> str | None:
    """The meta-schema violation of ``schema`` (``SchemaError.message``), or None if it is a valid JSON Schema."""
    try:
        canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):  # not JSON (a YAML value JSON cannot hold): the validator says what
        return _problem(schema)
    return _problem_of(canonical)


@functools.lru_cache(maxsize=SCHEMA_CHECKS_KEPT)
def _problem_of(canonical: str) -> str | None:
    return _problem(json.loads(canonical))


def _problem(schema: Any) -> str | None:
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        return str(exc.message)
    return None
