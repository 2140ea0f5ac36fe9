"""``${NAME}`` / ``${NAME:-default}`` interpolation, written once (workflow files and crucible configs).

Pure: the environment is an argument, never read here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^{}]*))?\}")
_LITERAL = "\x00reel-literal-dollar-brace\x00"
MAX_DEPTH = 8
"""Passes at most (nested defaults resolve innermost first; bounded, since a value may itself hold ``${``)."""


def expand(text: str, env: Mapping[str, str], missing: Callable[[str], Exception]) -> str:
    """``text`` with ``${NAME}`` / ``${NAME:-default}`` replaced from ``env``, innermost first
    (``${A:-${B}}``); ``$${`` is a literal ``${``.

    Args:
        missing: builds the error for a variable that is unset and has no default (gets its name).

    Raises:
        Exception: ``missing(name)`` for the first unset variable without a default.
    """
    def one(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise missing(name)

    text = text.replace("$${", _LITERAL)
    for _ in range(MAX_DEPTH):
        text, n = _VAR.subn(one, text)
        if not n:
            break
    return text.replace(_LITERAL, "${")
