"""How deep and how big input from a client may be, checked before anything decodes it (docs/subjects.md, "Limits").

A JSON decoder, a YAML composer, a JSON Schema validator and every fold or renderer that
walks a decoded value recurse once (or several times) per level of nesting, and Python's
interpreter stops at about 1,000 frames with ``RecursionError``. So a command body, a
workflow document and a model's tool-call arguments are measured first:
:func:`json_deeper_than` scans JSON text without decoding it (C-speed passes, then a loop over
what is left), :func:`value_depth` walks an already-decoded value without recursing.
:func:`check_json` and :func:`check_value` refuse what is over :data:`MAX_DEPTH` or a size
limit with :class:`~reel.shared.core.errors.InvalidCommand` whose message starts
``nested deeper than <N>``.
"""

from __future__ import annotations

from typing import Any

from reel.shared.core.errors import InvalidCommand

MAX_DEPTH = 64
"""Levels of arrays and objects a command body, a workflow document or tool arguments may nest
(``{"a": [1]}`` is 2 deep). Every walk over such a value then stays far below Python's
recursion limit (a JSON Schema validator spends about 8 frames per level)."""

MAX_COMMAND_BYTES = 1024 * 1024
"""Bytes of one command body: the NATS server's default ``max_payload`` (1 MiB), also checked here
so a server configured larger does not let a bigger body through."""

MAX_WORKFLOW_BYTES = 16 * 1024 * 1024
"""Bytes of one workflow document (a file ``reel run`` reads, or a ``workflow_ref`` blob)."""

_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b'"[]{}')


def json_deeper_than(data: bytes | str, limit: int = MAX_DEPTH) -> bool:
    """Whether arrays and objects nest deeper than ``limit`` in the JSON text ``data``, without decoding it.

    Brackets inside strings do not count (escapes are dropped first, so every ``"`` left opens or
    closes a string). Braces count as brackets, and each pass (a C-speed ``bytes.replace``)
    removes every innermost ``[]`` pair, so well-formed JSON empties after exactly its depth in
    passes. Text that is not JSON is measured by an upper bound (passes made plus the nesting of
    what no pass removes): the decoder says what else is wrong with it. About 2 ms a MiB.
    """
    raw = data.encode(errors="surrogatepass") if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    kept = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(_BRACKETS, _NOT_BRACKETS)
    brackets = b"".join(kept.split(b'"')[::2])
    opened = b"[" * (limit + 1)
    passes = 0
    while brackets and passes <= limit:
        if opened in brackets:
            return True
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            break
        brackets, passes = shorter, passes + 1
    return passes + _nesting(brackets, limit) > limit


_OPEN = ord("[")


def _nesting(brackets: bytes, limit: int) -> int:
    """The nesting of a string of brackets, counted up to ``limit + 1`` (an unmatched closing one is skipped)."""
    depth = deepest = 0
    for b in brackets:
        depth = depth + 1 if b == _OPEN else max(0, depth - 1)
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
    return deepest


def value_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deep lists, tuples and dicts nest in ``value`` (``{"a": [1]}`` is 2), counted up to ``limit + 1``;
    without recursion, so it is safe on any value. A container met again no deeper than before is not walked
    again, so a YAML document that repeats one node through aliases (or holds itself) costs what its distinct
    nodes cost, not what their expansion would."""
    deepest, stack = 0, [(value, 1)]
    seen: dict[int, int] = {}
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if seen.get(id(item), 0) >= depth:
            continue
        seen[id(item)] = depth
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def too_deep(what: str = "") -> str:
    """The refusal's message: ``nested deeper than <MAX_DEPTH>`` (then ``what``, e.g. `` (at `$.arguments`)``)."""
    return f"nested deeper than {MAX_DEPTH}{what}"


def check_json(data: bytes | str, *, max_bytes: int = MAX_COMMAND_BYTES, what: str = "command body") -> None:
    """Refuse JSON text over ``max_bytes`` or nested deeper than :data:`MAX_DEPTH`, before it is decoded.

    Raises:
        InvalidCommand: ``nested deeper than 64 (…)``, or ``<what> is N bytes, over the limit of M``.
    """
    size = len(data)
    if size > max_bytes:
        raise InvalidCommand(f"{what} is {size} bytes, over the limit of {max_bytes}")
    if json_deeper_than(data):
        raise InvalidCommand(too_deep(f" (arrays and objects in the {what}; docs/subjects.md, \"Limits\")"))


def check_value(value: Any, *, what: str = "document") -> None:
    """Refuse an already-decoded value nested deeper than :data:`MAX_DEPTH`.

    Raises:
        InvalidCommand: ``nested deeper than 64 (…)``.
    """
    if value_depth(value) > MAX_DEPTH:
        raise InvalidCommand(too_deep(f" (arrays and objects in the {what}; docs/subjects.md, \"Limits\")"))
