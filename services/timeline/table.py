"""The timeline's attempt table, fitted to the width it is printed at (``reel show``, ``run``, ``replay``,
``approve``): the ``#`` and status columns never wrap (a status is one word, as written), free text (step,
kind, command, error) folds within a capped width, and where even that does not fit (an 80-column terminal)
the least needed numeric columns are left out, a dim line naming them (``reel show RUN --json`` has them all).
"""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import Console, ConsoleOptions, RenderableType
from rich.table import Table
from rich.text import Text

COLUMNS = ("step", "kind", "#", "status", "command", "exit", "out B", "pack/avail/drop", "packed tok",
           "tok in/out", "finish", "ms call/wall", "lsn", "error")
"""The attempt table's columns (``reel show``): see :mod:`reel.services.timeline.rows` for the derived ones."""

FOLD_MAX = {"step": 32, "kind": 32, "command": 48, "error": 44}  # kind: "tool <name>" whole for usual tool names
"""Free-text columns: folded (never cut) within this many characters each."""

COMMAND_CHARS = 160
"""The longest command (or tool arguments) shown in the table, characters."""

FOLD_MIN = 20
"""A free-text column narrower than this many characters leaves a numeric column out instead."""

DROP_ORDER = ("pack/avail/drop", "packed tok", "ms call/wall", "tok in/out", "out B", "lsn", "exit", "finish", "kind")
"""The columns left out, first to last, while the table is wider than the width it is printed at."""


class AttemptTable:
    """A Rich renderable: a title and rows of :data:`COLUMNS` cells, rendered as a :class:`~rich.table.Table`
    that fits ``options.max_width`` (characters) by leaving out :data:`DROP_ORDER`'s columns as needed."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.rows: list[tuple[Text, ...]] = []

    def add_row(self, *cells: Text) -> None:
        """One row: a cell per column of :data:`COLUMNS`, in order (a command longer than
        :data:`COMMAND_CHARS` is shown to there, then ``… (N chars)``: ``reel show --json`` has it whole)."""
        i = COLUMNS.index("command")
        if len(cells[i]) > COMMAND_CHARS:
            n = len(cells[i])
            cells = (*cells[:i], cells[i][:COMMAND_CHARS] + Text(f"… ({n} chars)", style="dim"), *cells[i + 1:])
        self.rows.append(cells)

    def table(self, columns: tuple[str, ...]) -> Table:
        """The table of just ``columns`` (a subsequence of :data:`COLUMNS`)."""
        table = Table(title=self.title, title_justify="left")
        index = [COLUMNS.index(c) for c in columns]
        for col, i in zip(columns, index, strict=True):
            widest = max([len(col), *(r[i].cell_len for r in self.rows)])
            if col in FOLD_MAX:
                table.add_column(col, overflow="fold", max_width=FOLD_MAX[col])
            else:  # one line as written: a status, an attempt number, numbers
                table.add_column(col, no_wrap=True, min_width=widest)
        for r in self.rows:
            table.add_row(*(r[i] for i in index))
        return table

    def needed(self, columns: tuple[str, ...]) -> int:
        """The width (characters, borders included) ``columns`` need: each one-line column its widest cell,
        each free-text one its widest cell up to :data:`FOLD_MIN` (it folds below that; the error column up to
        its :data:`FOLD_MAX`)."""
        total = 1
        for col in columns:
            i = COLUMNS.index(col)
            widest = max([len(col), *(r[i].cell_len for r in self.rows)])
            fold_min = FOLD_MAX[col] if col == "error" else FOLD_MIN  # an error cell is short (a note's pointer)
            total += (min(widest, fold_min) if col in FOLD_MAX else widest) + 3  # padding 2, border 1
        return total

    def fitted(self, width: int) -> tuple[Table, tuple[str, ...]]:
        """The table fitting ``width`` characters, and the columns it leaves out for that."""
        shown: tuple[str, ...] = COLUMNS
        for col in DROP_ORDER:
            if self.needed(shown) <= width:
                break
            shown = tuple(c for c in shown if c != col)
        return self.table(shown), tuple(c for c in COLUMNS if c not in shown)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType]:
        table, hidden = self.fitted(options.max_width)
        yield table
        if hidden:
            yield Text(f"(not shown at this width: {', '.join(hidden)} — a wider terminal, or "
                       "`reel show RUN --json`, has them)", style="dim")
