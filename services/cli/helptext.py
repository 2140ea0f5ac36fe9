"""``--help`` in whole sentences: each command's docstring as the paragraphs a terminal of any width wraps.

Typer prints a command's first paragraph re-flowed but keeps the hard line breaks of the
others, so a docstring wrapped at 120 characters in the source comes out broken in the
middle of sentences at 80 (``… an\\n``ask_user``\\nquestion …``). :func:`tidy` gives every
command of the app (sub-apps included: ``serve``, ``auth``, ``crucible``) an explicit help
text made by :func:`user_help`: each paragraph on one line, reStructuredText literals and
roles as plain text, Rich markup characters escaped — the docstring in the source stays as
it is, for developers.
"""

from __future__ import annotations

import inspect
import re

import typer
from rich.markup import escape

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :mod:`reel.shared.core.run.fold` → reel.shared.core.run.fold
_LITERAL = re.compile(r"``([^`]+)``")  # ``--follow`` → `--follow`


def user_help(doc: str) -> str:
    """``doc`` (a docstring) as help text: paragraphs (split at blank lines) each joined into one line, ``:role:`x```
    → ``x``, ````x```` → ```x```, Rich markup escaped. A paragraph starting with click's ``\\b`` (no re-wrap) and
    anything after a ``\\f`` line (click: not help) are kept as they are."""
    text = inspect.cleandoc(doc)
    out = []
    for para in text.split("\n\n"):
        if para.startswith("\b") or para.startswith("\f"):
            out.append(para)
            continue
        line = " ".join(part.strip() for part in para.splitlines())
        out.append(escape(_LITERAL.sub(r"`\1`", _ROLE.sub(r"\1", line))))
    return "\n\n".join(out)


def tidy(app: typer.Typer) -> typer.Typer:
    """Give every command and group of ``app`` (recursively) its :func:`user_help` text; returns ``app``."""
    for cmd in app.registered_commands:
        doc = cmd.help or (cmd.callback.__doc__ if cmd.callback else None)
        if doc:
            cmd.help = user_help(doc)
    for group in app.registered_groups:
        if isinstance(group.help, str):
            group.help = user_help(group.help)
        if group.typer_instance is not None:
            tidy(group.typer_instance)
            info = group.typer_instance.info
            if isinstance(info.help, str):
                info.help = user_help(info.help)
    return app
