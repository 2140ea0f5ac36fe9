"""The iteration typestate: mypy rejects illegal orderings and accepts the legal one.

One mypy run (``--strict``, like shared/) over small snippets; each illegal
snippet must produce an error on its marked line, the legal one none.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PRELUDE = textwrap.dedent("""\
    from reel.shared.crucible.config import NoiseSpec
    from reel.shared.crucible.iteration import CandidateChange, Decided, Iteration, Measured
    from reel.shared.crucible.state import Reading, Segment, WorldSha, Fate

    CAND = CandidateChange(note="n", paths=("value.txt",))
    READING = Reading(values=(1.0,), score=1.0)
    NOISE = NoiseSpec()
""")

SNIPPETS = {
    "legal": """
        def run(seg: Segment) -> Decided:
            proposed = Iteration.propose(1, "main", CAND)
            applied = proposed.apply(WorldSha("abc"))
            measured = applied.measure(READING)
            return measured.decide(segment=seg, direction="maximize", noise=NOISE, goal=None, wall_ms=0)
    """,
    "measure_before_apply": """
        def run() -> None:
            proposed = Iteration.propose(1, "main", CAND)
            proposed.measure(READING)  # ERROR
    """,
    "decide_without_reading": """
        def run(seg: Segment) -> None:
            applied = Iteration.propose(1, "main", CAND).apply(WorldSha("abc"))
            applied.decide(segment=seg, direction="maximize", noise=NOISE, goal=None, wall_ms=0)  # ERROR
    """,
    "keep_a_proposal": """
        def run(seg: Segment) -> None:
            Iteration.propose(1, "main", CAND).decide(  # ERROR
                segment=seg, direction="maximize", noise=NOISE, goal=None, wall_ms=0)
    """,
    "measured_without_reading": """
        def run() -> None:
            Measured(candidate=CAND, sha=WorldSha("abc"), reading=None)  # ERROR
    """,
    "apply_twice": """
        def run() -> None:
            Iteration.propose(1, "main", CAND).apply(WorldSha("a")).apply(WorldSha("b"))  # ERROR
    """,
}


EXPECTED = {
    "measure_before_apply": 'Invalid self argument "Iteration[Proposed]" to attribute function "measure"',
    "decide_without_reading": 'Invalid self argument "Iteration[Applied]" to attribute function "decide"',
    "keep_a_proposal": 'Invalid self argument "Iteration[Proposed]" to attribute function "decide"',
    "measured_without_reading": 'Argument "reading" to "Measured" has incompatible type "None"',
    "apply_twice": 'Invalid self argument "Iteration[Applied]" to attribute function "apply"',
}


@dataclass(frozen=True)
class MypyRun:
    """Error lines per snippet, the ``# ERROR`` line of each snippet, mypy's output."""

    errors: dict[str, list[tuple[int, str]]]
    marked: dict[str, list[int]]
    output: str


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> MypyRun:
    d = tmp_path_factory.mktemp("typestate")
    marked: dict[str, list[int]] = {}
    for name, body in SNIPPETS.items():
        text = PRELUDE + textwrap.dedent(body)
        (d / f"{name}.py").write_text(text)
        marked[name] = [i + 1 for i, ln in enumerate(text.splitlines()) if "# ERROR" in ln]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--show-error-codes",
         "--cache-dir", str(REPO / ".mypy_cache"), *sorted(str(p) for p in d.glob("*.py"))],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 2 = mypy itself failed
    errors: dict[str, list[tuple[int, str]]] = {name: [] for name in SNIPPETS}
    for line in proc.stdout.splitlines():
        m = re.match(r".*/(\w+)\.py:(\d+): error: (.*)", line)
        if m:
            errors[m.group(1)].append((int(m.group(2)), m.group(3)))
    return MypyRun(errors=errors, marked=marked, output=proc.stdout)


def test_legal_order_type_checks(mypy_run: MypyRun) -> None:
    assert mypy_run.errors["legal"] == [], mypy_run.output


@pytest.mark.parametrize("name", [n for n in SNIPPETS if n != "legal"])
def test_illegal_order_is_rejected_by_mypy(mypy_run: MypyRun, name: str) -> None:
    assert mypy_run.marked[name], "snippet must mark its illegal line"
    errors = mypy_run.errors[name]
    assert [line for line, _ in errors] == mypy_run.marked[name], mypy_run.output
    assert EXPECTED[name] in errors[0][1], errors
