"""No comment or docstring cites a document outside the repository ("brief §3", "issue 10", "seed T1.5").

What the code relies on is stated where it is relied on, or in ``docs/``; a citation of the design brief, a
design document's section or an issue number says nothing to a reader of this repository. Only comments and
docstrings (statement-level strings) are checked: test names and data may hold such words.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("shared", "services", "tests", "bench", "scripts", "examples")

CITATION = re.compile(
    r"brief\s*§"              # the design brief's sections
    r"|§\s*\d"                # any numbered section
    r"|\bissues?\s*#?\s*\d"   # issue numbers
    r"|\bseed\s+T\d"          # design-document tasks ("seed T4.2")
    r"|\bT\d\.\d\b"           # the same without "seed"
    r"|\bADR[ -]?0\d{3}",     # design decision records kept outside the repository
    re.IGNORECASE,
)

_AFTER_STATEMENT = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


def citations(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment or statement-level string (docstrings included) citing outside documents.

    Raises:
        tokenize.TokenError: ``source`` is not tokenizable Python.
    """
    found: list[tuple[int, str]] = []
    previous = tokenize.ENCODING
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        is_doc = tok.type == tokenize.STRING and previous in _AFTER_STATEMENT
        if (tok.type == tokenize.COMMENT or is_doc) and (m := CITATION.search(tok.string)):
            line = tok.start[0] + tok.string[:m.start()].count("\n")
            found.append((line, tok.string.splitlines()[tok.string[:m.start()].count("\n")].strip()))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    return found


def test_the_checker_finds_citations_in_comments_and_docstrings_only() -> None:
    source = (
        '"""Module doc (brief §4)."""\n'
        "def f() -> None:\n"
        '    """Docstring.\n\n    Second line: issue 10 item 3.\n    """\n'
        "    x = 'brief §4 in data is fine'  # a comment: seed T1.5\n"
        "    return None\n"
        "def test_it_snapshot_barrier() -> None: ...\n"
    )
    assert [line for line, _ in citations(source)] == [1, 5, 7]


def test_no_python_file_cites_an_outside_document() -> None:
    this = Path(__file__).resolve()
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for top in CHECKED
        for path in sorted((ROOT / top).rglob("*.py"))
        if path.resolve() != this
        for line, text in citations(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, "state what is relied on instead of citing:\n" + "\n".join(offenders)
