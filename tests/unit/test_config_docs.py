"""Every ``REEL_*`` environment variable the code reads is in the configuration table of docs/operations.md.

"Read" is found in the source of services/ and shared/ (never tests/): a ``REEL_…`` string given to
``.get``/``.getenv``/``.setdefault``/``.pop`` (of ``os.environ`` or an alias of it), ``os.environ[…]``
or typer's ``envvar=``,
directly or through a module constant (``HEARTBEAT_ENV = "REEL_HEARTBEAT_FILE"``), and every ``REEL_…``
string of shared/runtime/config.py's code (the configuration module: ``Config.from_env``, ``NatsAuth``,
``CONNECTION_FLAGS``). Names Reel *sets* for the processes it starts (``REEL_RUN_ID`` … of a tool) are
not read and need no row.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "operations.md"
VAR = re.compile(r"^REEL_[A-Z0-9_]*[A-Z0-9]$")  # not an f-string's prefix (``f"REEL_NATS_{name}"``)
READERS = {"get", "getenv", "setdefault", "pop"}


def _sources() -> list[Path]:
    return sorted(p for d in ("services", "shared") for p in (REPO / d).rglob("*.py"))


def _constants(trees: dict[Path, ast.Module]) -> dict[str, str]:
    """Module-level ``NAME = "REEL_…"`` constants of every module, by name."""
    out: dict[str, str] = {}
    for tree in trees.values():
        for node in tree.body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str) and VAR.match(node.value.value)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        out[target.id] = node.value.value
    return out


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def read_variables() -> dict[str, str]:
    """Every ``REEL_*`` variable the code reads → one place that reads it (``path:line``)."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in _sources()}
    consts = _constants(trees)

    def name_of(arg: ast.expr) -> str | None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and VAR.match(arg.value):
            return arg.value
        if isinstance(arg, ast.Name):
            return consts.get(arg.id)
        return None

    found: dict[str, str] = {}
    for path, tree in trees.items():
        where = path.relative_to(REPO)
        config_module = where == Path("shared/runtime/config.py")
        for node in ast.walk(tree):
            names: list[str | None] = []
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Attribute) and f.attr in READERS:  # os.environ.get, env.get (an alias), …
                    names += [name_of(a) for a in node.args[:1]]
                names += [name_of(k.value) for k in node.keywords if k.arg == "envvar"]
            elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
                names.append(name_of(node.slice))
            elif config_module and isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.append(node.value if VAR.match(node.value) else None)
            for n in names:
                if n is not None:
                    found.setdefault(n, f"{where}:{getattr(node, 'lineno', '?')}")
    return found


def documented_variables() -> set[str]:
    """The variables in the first column of docs/operations.md's configuration tables."""
    rows = re.findall(r"^\|\s*`([A-Z][A-Z0-9_]+)`", DOC.read_text(), flags=re.M)
    return set(rows)


def test_every_variable_the_code_reads_is_documented() -> None:
    read = read_variables()
    missing = {v: at for v, at in read.items() if v not in documented_variables()}
    assert not missing, f"REEL_* variables read but not in {DOC.relative_to(REPO)}'s configuration table: {missing}"


def test_the_scan_finds_reads_of_each_kind() -> None:
    read = read_variables()
    assert read["REEL_HOME"].startswith("services/cli/console.py")  # os.environ.get("REEL_…")
    assert read["REEL_HEARTBEAT_FILE"].startswith("services/")  # through a module constant
    assert read["REEL_TOOL_DIR"].startswith("services/cli/app.py")  # os.environ.setdefault
    assert "REEL_NATS_TLS_KEY" in read and "REEL_MAX_CONCURRENT_RUNS" in read  # shared/runtime/config.py
    assert "REEL_NATS_" not in read and "REEL_RUN_ID" not in read  # an f-string's prefix; set for tools


def test_the_table_has_no_stale_rows() -> None:
    stale = {v for v in documented_variables() if v.startswith("REEL_")} - set(read_variables())
    assert not stale, f"documented but read nowhere (remove the rows, or the scan misses a read): {stale}"
