"""The runs page's index: every run's :class:`~reel.services.ui.pages.RunRow`, with postings per filter (pure, no I/O).

A page of the runs page is a query on it: the runs matching ``status`` / ``outcome`` / ``label`` / ``q``,
newest first, at most :data:`PAGE_RUNS`, cut by a **keyset** — a run's key is the LSN of its first commit
(``run_created``: unique in the events stream, larger for a newer run), so ``?before=K`` (the runs older than
key ``K``) names the same runs however many newer ones arrive meanwhile.

Filters never look at every run:

* ``status`` (``failed``: :attr:`RunRow.failed`), ``outcome`` and ``label`` (``k=v`` or a key ``k``) are sets of
  keys per value, intersected smallest first;
* ``q`` (a case-insensitive substring of the id, workflow, outcome, labels as shown — ``k``, ``v`` and
  ``k=v`` — or an attempt's error) goes through a trigram index: the keys of the runs whose text holds every
  three-character slice of ``q``, each then checked for ``q`` itself. A ``q`` of one or two characters has no
  trigram: it is checked against the runs the other filters leave (every run's text, if none) — the one case
  that is a scan, of in-memory strings.

The index holds a run's row, its text and its postings, never its state. Who keeps it current is the reader
(services/ui/reader.py: built from the stream at start, then following it).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from reel.services.ui.pages import RunRow, matches, postings, row_text, status_posting

PAGE_RUNS = 100
"""Most runs on one page of the runs page."""


def row_key(row: RunRow) -> int:
    """The row's keyset key: the LSN of the run's first commit (for a run corrupt at its first commit: that LSN)."""
    return row.created_lsn or row.head_lsn


def trigrams(text: str) -> set[str]:
    """The three-character slices of ``text`` (none for a text shorter than three; none spanning a newline)."""
    return {text[i:i + 3] for i in range(len(text) - 2) if "\n" not in text[i:i + 3]}


@dataclass(frozen=True)
class RunFilter:
    """A runs-page query's filters; empty fields match every run (see the module doc)."""

    status: str = ""
    outcome: str = ""
    label: str = ""
    q: str = ""

    @property
    def any(self) -> bool:
        """True if some filter is set."""
        return bool(self.status or self.outcome or self.label or self.q.strip())


@dataclass(frozen=True)
class RunsPage:
    """One page of the runs page.

    Attributes:
        rows: at most :data:`PAGE_RUNS` matching runs, newest first.
        total: how many runs match the filter in all.
        first: the 1-based position of ``rows[0]`` among them (0 if ``rows`` is empty).
        newer: the key to ask ``?after=`` for the page before this one (``None``: this is the first).
        older: the key to ask ``?before=`` for the page after this one (``None``: this is the last).
    """

    rows: tuple[RunRow, ...]
    total: int
    first: int
    newer: int | None
    older: int | None


class RunIndex:
    """Rows of every run by key, with postings per status, outcome, label and trigram (see the module doc)."""

    def __init__(self) -> None:
        self._rows: dict[int, RunRow] = {}
        self._key_of: dict[str, int] = {}
        self._keys: list[int] = []  # ascending
        self._text: dict[int, str] = {}
        self._sets: dict[str, set[int]] = {}  # "status:…", "outcome:…", "label:k", "label:k=v", "failed"
        self._grams: dict[str, set[int]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, run_id: str) -> RunRow | None:
        """The run's row, ``None`` if it is not indexed."""
        key = self._key_of.get(run_id)
        return None if key is None else self._rows[key]

    def heads(self, *, after: int = -1) -> dict[str, int]:
        """``{run_id: head_lsn}`` of the indexed runs whose head LSN is above ``after`` (default: every one)."""
        return {r.run_id: r.head_lsn for r in self._rows.values() if r.head_lsn > after}

    def outcomes(self) -> list[str]:
        """The outcomes some indexed run has, sorted."""
        return sorted(k.removeprefix("outcome:") for k, v in self._sets.items() if k.startswith("outcome:") and v)

    def put(self, row: RunRow) -> None:
        """Index ``row``, replacing the run's earlier row if any."""
        self.drop(row.run_id)
        key = row_key(row)
        self._rows[key], self._key_of[row.run_id] = row, key
        if not self._keys or key > self._keys[-1]:
            self._keys.append(key)  # a new run: the usual case
        else:
            bisect.insort(self._keys, key)
        text = self._text[key] = row_text(row)
        for name in postings(row):
            self._sets.setdefault(name, set()).add(key)
        for g in trigrams(text):
            self._grams.setdefault(g, set()).add(key)

    def drop(self, run_id: str) -> None:
        """Forget the run (nothing if it is not indexed)."""
        key = self._key_of.pop(run_id, None)
        if key is None:
            return
        row = self._rows.pop(key)
        del self._keys[bisect.bisect_left(self._keys, key)]
        for name in postings(row):
            _discard(self._sets, name, key)
        for g in trigrams(self._text.pop(key)):
            _discard(self._grams, g, key)

    def matches(self, row: RunRow, f: RunFilter) -> bool:
        """True if ``row`` passes ``f`` (:func:`~reel.services.ui.pages.matches`; ``row`` need not be indexed)."""
        return matches(row, f.status, f.q, outcome=f.outcome, label=f.label)

    def query(self, f: RunFilter, *, before: int | None = None, after: int | None = None,
              limit: int = PAGE_RUNS) -> RunsPage:
        """The page of runs matching ``f``: the ``limit`` newest with key < ``before``, or the ``limit`` oldest with
        key > ``after`` (fewer than ``limit`` there: the first page), or without either the first page."""
        keys = self._keys if not f.any else sorted(self._select(f))
        total = len(keys)
        if after is not None:
            lo = bisect.bisect_right(keys, after)
            if total - lo >= limit:
                page = keys[lo:lo + limit]
                return self._page(keys, page, total)
        hi = total if before is None or after is not None else bisect.bisect_left(keys, before)
        return self._page(keys, keys[max(0, hi - limit):hi], total)

    def _page(self, keys: list[int], page: list[int], total: int) -> RunsPage:
        if not page:
            return RunsPage(rows=(), total=total, first=0, newer=None, older=None)
        newer_count = total - bisect.bisect_right(keys, page[-1])  # matching runs newer than this page
        return RunsPage(rows=tuple(self._rows[k] for k in reversed(page)), total=total, first=newer_count + 1,
                        newer=page[-1] if newer_count else None, older=page[0] if keys[0] < page[0] else None)

    def _select(self, f: RunFilter) -> set[int]:
        sets: list[set[int]] = []
        if f.status:
            sets.append(self._sets.get(status_posting(f.status), set()))
        if f.outcome:
            sets.append(self._sets.get(f"outcome:{f.outcome}", set()))
        if f.label:
            sets.append(self._sets.get(f"label:{f.label}", set()))
        q = f.q.strip().lower()
        sets += [self._grams.get(g, set()) for g in trigrams(q)]
        if not sets:  # a one- or two-character q alone
            found: Iterable[int] = self._rows
        else:
            sets.sort(key=len)
            found = sets[0].intersection(*sets[1:])
        return {k for k in found if q in self._text[k]} if q else set(found)


def _discard(sets: dict[str, set[int]], name: str, key: int) -> None:
    s = sets.get(name)
    if s is not None:
        s.discard(key)
        if not s:
            del sets[name]
