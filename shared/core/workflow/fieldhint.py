"""What to say beside "unknown field" or "invalid enum value": the field or value the author most likely meant,
or the ones that fit there.

msgspec names an unknown field and where it sits (``Object contains unknown field `budget_token```,
``... - at `$.steps[0]```); :func:`unknown_field_hint` walks that path through the document as decoded
(a step's ``kind`` picks its struct) to the struct that refused it, and compares the name with that
struct's own field names; a value a literal or enum field refuses is compared with the values it allows. Pure:
no I/O.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence

import msgspec.inspect as mi

_UNKNOWN = re.compile(r"unknown field `(?P<name>[^`]+)`(?: - at `\$(?P<path>[^`]*)`)?")
_INVALID = re.compile(r"Invalid enum value '(?P<value>[^']*)' - at `\$(?P<path>[^`]*)`")
_STEP = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")
MAX_LISTED = 16  # fields listed when none is close (a longer list is noise)
CUTOFF = 0.75  # difflib ratio a field name must reach to be offered as the one meant


def unknown_field_hint(message: str, root: type, data: object) -> str | None:
    """The hint for msgspec's unknown-field ``message`` about ``data`` (the decoded document) as ``root``.

    Returns ``did you mean `budget_tokens`?`` when a field of the refusing struct is close to the name,
    else ``fields here: a, b, …`` when that struct has at most :data:`MAX_LISTED` fields; ``None`` when
    the message names no unknown field or its path cannot be followed through ``data``.
    """
    found = _UNKNOWN.search(message)
    if found is None:
        return None
    names = _field_names(mi.type_info(root), data, found.group("path") or "")
    if not names:
        return None
    return _suggest(found.group("name"), names, "fields here")


def invalid_value_hint(message: str, root: type, data: object) -> str | None:
    """The hint for msgspec's ``Invalid enum value 'outptu_regex' - at `$.verifiers[0].type``` about ``data`` as
    ``root``: ``did you mean `output_regex`?`` when an allowed value is close, else ``one of: a, b, …`` (at most
    :data:`MAX_LISTED`); ``None`` when the message is another one or its path cannot be followed."""
    found = _INVALID.search(message)
    if found is None:
        return None
    walked = _walk(mi.type_info(root), data, found.group("path"))
    if walked is None:
        return None
    allowed = _allowed(_unwrap(walked[0]))
    if not allowed:
        return None
    return _suggest(found.group("value"), allowed, "one of")


def _suggest(given: str, candidates: list[str], listed_as: str) -> str | None:
    """``did you mean `x`?`` for the candidate closest to ``given`` (difflib ratio ≥ :data:`CUTOFF`), else
    ``<listed_as>: `a`, `b`, …`` when there are at most :data:`MAX_LISTED` candidates, else ``None``."""
    close = difflib.get_close_matches(given, candidates, n=1, cutoff=CUTOFF)
    if close:
        return f"did you mean `{close[0]}`?"
    if len(candidates) <= MAX_LISTED:
        return f"{listed_as}: " + ", ".join(f"`{c}`" for c in candidates)
    return None


def _allowed(info: mi.Type) -> list[str]:
    """The string values a literal or enum type allows ([] for any other type)."""
    if isinstance(info, mi.LiteralType):
        return [str(v) for v in info.values]
    if isinstance(info, mi.EnumType):
        return [str(e.value) for e in info.cls]
    return []


def _walk(info: mi.Type, value: object, path: str) -> tuple[mi.Type, object] | None:
    """The type and the value at ``path`` (``.steps[0].model``) below ``info``/``value``; ``None`` when the path
    leaves the document or the type."""
    for field, index in _STEP.findall(path):
        if field:
            struct = _struct(info, value)
            if struct is None or not isinstance(value, Mapping):
                return None
            match = [f for f in struct.fields if f.encode_name == field]
            if not match:
                return None
            info, value = match[0].type, value.get(field)
        else:
            item = _item_type(_unwrap(info))
            if item is None or not isinstance(value, Sequence) or isinstance(value, str) \
                    or int(index) >= len(value):
                return None
            info, value = item, value[int(index)]
    return info, value


def _field_names(info: mi.Type, value: object, path: str) -> list[str]:
    """The field names of the struct at ``path`` (``.steps[0].model``) below ``info``/``value``."""
    walked = _walk(info, value, path)
    struct = None if walked is None else _struct(*walked)
    return [] if struct is None else [f.encode_name for f in struct.fields]


def _unwrap(info: mi.Type) -> mi.Type:
    """``info`` without ``None`` when it is ``X | None``."""
    if isinstance(info, mi.UnionType):
        rest = [t for t in info.types if not isinstance(t, mi.NoneType)]
        if len(rest) == 1:
            return rest[0]
    return info


def _item_type(info: mi.Type) -> mi.Type | None:
    if isinstance(info, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        return info.item_type
    return None


def _struct(info: mi.Type, value: object) -> mi.StructType | None:
    """The struct ``value`` decodes as: ``info`` itself, the one struct of a union, or the union's struct
    whose tag ``value`` carries (a step's ``kind``)."""
    info = _unwrap(info)
    if isinstance(info, mi.StructType):
        return info
    if not isinstance(info, mi.UnionType):
        return None
    structs = [t for t in info.types if isinstance(t, mi.StructType)]
    if len(structs) == 1:
        return structs[0]
    if isinstance(value, Mapping):
        for s in structs:
            if s.tag_field is not None and value.get(s.tag_field) == s.tag:
                return s
    return None


def with_field_hint(message: str, root: type, data: object) -> str:
    """``message`` with :func:`unknown_field_hint`'s or :func:`invalid_value_hint`'s hint in brackets after it,
    when there is one."""
    hint = unknown_field_hint(message, root, data) or invalid_value_hint(message, root, data)
    return message if hint is None else f"{message} ({hint})"
