"""Command proposer of the worked example: a deterministic pattern search over the packing policy.

Each call edits ``examples/crucible/policy.json`` in the world with the first move
of :data:`MOVES` not yet tried since the last kept row (read from
``$CRUCIBLE_HISTORY``); after a keep the search starts again from the top, from
the new best policy (the loop has already rolled the world back to it). When
every move has been tried without a keep, it answers ``{"done": …}`` and the run
ends ``Finished``. It never reads the judge or the data: only the rows.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

POLICY = Path("examples/crucible/policy.json")
MOVES: list[tuple[str, str, Any]] = [
    ("budget_tokens", "*", 0.75),
    ("budget_tokens", "*", 0.9),
    ("priority.observation", "+", 1),
    ("priority.message", "+", 1),
    ("priority.output", "+", -1),
    ("max_item_tokens", "*", 1.5),
    ("max_item_tokens", "*", 0.8),
    ("budget_tokens", "*", 1.1),
    ("exclude_kinds", "add", "output"),
]
_TAG = re.compile(r"^\[m(\d+)\]")


def apply(policy: dict[str, Any], move: tuple[str, str, Any]) -> tuple[dict[str, Any], str] | None:
    """The policy after ``move`` and a note, or ``None`` if the move changes nothing."""
    key, op, arg = move
    new = json.loads(json.dumps(policy))
    if key.startswith("priority."):
        kind = key.split(".", 1)[1]
        before = new["priority"].get(kind, 0)
        new["priority"][kind] = before + arg
        return new, f"priority of {kind}: {before:g} → {before + arg:g}"
    if op == "add":
        if arg in new[key]:
            return None
        new[key] = [*new[key], arg]
        return new, f"exclude kind {arg}"
    before = new[key]
    after = max(256, round(before * arg / 50.0) * 50)
    if after == before:
        return None
    new[key] = after
    return new, f"{key} ×{arg:g}: {before} → {after}"


def main() -> None:
    rows = json.loads(Path(os.environ["CRUCIBLE_HISTORY"]).read_text())
    last_keep = max((i for i, r in enumerate(rows) if r["verdict"] == "keep"), default=-1)
    tried = {int(m.group(1)) for r in rows[last_keep + 1:] if (m := _TAG.match(r.get("note", "")))}
    policy = json.loads(POLICY.read_text())
    for i, move in enumerate(MOVES):
        if i in tried:
            continue
        changed = apply(policy, move)
        if changed is None:
            continue
        new, note = changed
        POLICY.write_text(json.dumps(new, indent=2) + "\n")
        print(json.dumps({"note": f"[m{i}] {note}"}))
        return
    print(json.dumps({"done": f"no move improves on the best policy ({len(tried)} tried since the last keep)"}))


if __name__ == "__main__":
    sys.exit(main())
