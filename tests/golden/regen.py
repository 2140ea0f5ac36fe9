"""Regenerate the expected states of the golden event logs. Run ONLY when a change is intended.

Each ``tests/golden/<name>.jsonl`` is one run's event log, one commit per line as it
sat in the stream: ``{"lsn": N, "commit": {...}}``. Next to it the test keeps what
folding that log must give, as canonical msgspec JSON (indented, for readable diffs):

* ``<name>.state.json`` — the :class:`~reel.shared.core.run.state.RunState` after the last commit;
* ``<name>.views.json`` — the :class:`~reel.shared.core.run.views.EpisodeView` of every branch.

``tests/unit/test_golden_logs.py`` replays every log and compares byte for byte, so
any change to the events, the codec, the fold or the views that alters what an
existing log means fails the suite. If (and only if) that change is intended::

    python -m tests.golden.regen          # rewrite every <name>.state.json / .views.json
    git diff tests/golden                 # review: every changed line is a changed meaning

and commit the new expectations with the change that caused them. Never edit the
``.jsonl`` logs to make a test pass: they are what older versions wrote, and must stay
readable. New logs come from ``record.py`` (recorded through the real executor) or
are written by hand for events the executor does not produce.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from reel.shared.core.run.events import Commit, decode_commit
from reel.shared.core.run.fold import fold
from reel.shared.core.run.state import RunState
from reel.shared.core.run.statecodec import encode_state
from reel.shared.core.run.views import EpisodeView, build_episode_view

GOLDEN_DIR = Path(__file__).resolve().parent


class GoldenLine(msgspec.Struct, forbid_unknown_fields=True):
    """One line of a golden log: the commit's LSN and its body exactly as stored."""

    lsn: int
    commit: msgspec.Raw


def logs() -> list[Path]:
    """Every golden log, sorted by name."""
    return sorted(GOLDEN_DIR.glob("*.jsonl"))


def read_log(path: Path) -> list[tuple[int, Commit]]:
    """The ``(lsn, Commit)`` pairs of one golden log, decoded by today's codec."""
    out = []
    for line in path.read_bytes().splitlines():
        if line.strip():
            g = msgspec.json.decode(line, type=GoldenLine)
            out.append((g.lsn, decode_commit(bytes(g.commit))))
    return out


def canonical(obj: object) -> bytes:
    """Canonical bytes of an expectation: msgspec JSON, indented, trailing newline."""
    return msgspec.json.format(encode_state(obj), indent=2) + b"\n"


def fold_log(path: Path) -> tuple[RunState, list[EpisodeView]]:
    """Fold one golden log; the state and every branch's view."""
    state = fold(read_log(path))
    assert state is not None, f"{path.name} is empty"
    return state, [build_episode_view(state, b) for b in state.branches]


def expectations(path: Path) -> dict[Path, bytes]:
    """The expectation files of one golden log and their canonical contents."""
    state, views = fold_log(path)
    stem = path.with_suffix("")
    return {stem.with_suffix(".state.json"): canonical(state), stem.with_suffix(".views.json"): canonical(views)}


def main() -> int:
    changed = 0
    for path in logs():
        for target, data in expectations(path).items():
            if not target.exists() or target.read_bytes() != data:
                target.write_bytes(data)
                changed += 1
                print(f"wrote {target.relative_to(GOLDEN_DIR.parent.parent)}")
    print(f"{len(logs())} golden logs, {changed} expectation files rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
