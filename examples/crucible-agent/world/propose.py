"""The crucible-agent example's proposer (a command, run in the world): one edit of instructions.md per iteration.

1. a rewording that says the same (no new guidance): it should change nothing, and be discarded;
2. "read the file first": guidance the loopback model follows (model.py), which should raise the pass rate;
3. "run the tests before finishing": more of it.

Each edit starts from the best snapshot (crucible rolls a discarded one back), so 2 and 3 append to what is
kept. Past the plan it answers ``done``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

INSTRUCTIONS = Path("instructions.md")

REWORDED = """You are a meticulous Python developer in a checkout of a little package. With the tools you can read and
write its files and run its unit tests. Make the failing test pass by changing the package, not the test. Once
the tests pass, say in one sentence what you changed.
"""


def reword(text: str) -> tuple[str, str]:
    return REWORDED, "reword the instructions (no new guidance)"


def read_first(text: str) -> tuple[str, str]:
    return text.rstrip("\n") + "\nRead the file before you change it.\n", "add: read the file first"


def run_tests(text: str) -> tuple[str, str]:
    return text.rstrip("\n") + "\nRun the tests before finishing.\n", "add: run the tests before finishing"


PLAN = (reword, read_first, run_tests)


def main() -> None:
    it = int(os.environ["CRUCIBLE_ITERATION"])
    if it > len(PLAN):
        print(json.dumps({"done": True, "note": "nothing left to try"}))
        return
    text, note = PLAN[it - 1](INSTRUCTIONS.read_text())
    INSTRUCTIONS.write_text(text)
    print(json.dumps({"note": note}))


if __name__ == "__main__":
    main()
