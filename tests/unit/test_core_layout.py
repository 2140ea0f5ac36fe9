"""The core's import graph has no cycle, and one name is in one place.

The graph is grimp's (the library import-linter runs on): every ``import`` counts, those under
``if TYPE_CHECKING:`` and those inside functions too, so a cycle cannot hide behind a lazy import.
A cycle is a strongly connected component of more than one module (Tarjan's algorithm).
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import grimp

CORE = "reel.shared.core"
REPO = Path(__file__).parents[2]


def _core_graph() -> dict[str, set[str]]:
    """Module -> the reel.shared.core modules it imports (itself excluded)."""
    graph = grimp.build_graph("reel", include_external_packages=False)
    modules = {m for m in graph.modules if m == CORE or m.startswith(CORE + ".")}
    return {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules and i != m} for m in modules}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node, each sorted (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_core() -> None:
    edges = _core_graph()
    assert len(edges) > 50, "the graph does not see the core"
    assert cycles(edges) == [], "modules of reel.shared.core import each other back"


def test_no_two_core_modules_share_a_file_name() -> None:
    names = Counter(p.name for p in (REPO / "shared" / "core").rglob("*.py") if p.name != "__init__.py")
    assert [n for n, count in names.items() if count > 1] == []


def test_run_state_has_one_address() -> None:
    """``RunState`` is defined in one module and imported from that one only (no re-export elsewhere)."""
    sources = {p.relative_to(REPO).as_posix(): ast.parse(p.read_text())
               for d in ("shared", "services", "tests", "bench", "scripts") for p in (REPO / d).rglob("*.py")}
    defined = [path for path, tree in sources.items()
               if any(isinstance(n, ast.ClassDef) and n.name == "RunState" for n in tree.body)]
    assert defined == ["shared/core/run/state.py"]
    elsewhere = sorted({f"{path}: from {node.module}" for path, tree in sources.items() for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom) and any(a.name == "RunState" for a in node.names)
                        and node.module != "reel.shared.core.run.state"})
    assert elsewhere == []


def test_no_bare_outcome_name() -> None:
    """Each outcome type says whose it is (``AttemptEnd``, ``RunOutcome``, ``SessionOutcome``, ``DeliveryReport`` …)."""
    bare = []
    for path in (p for d in ("shared", "services") for p in (REPO / d).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = [node.name] if isinstance(node, ast.ClassDef) else [
                t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            bare += [f"{path.relative_to(REPO).as_posix()}: {n}" for n in targets if n == "Outcome"]
    assert bare == []
