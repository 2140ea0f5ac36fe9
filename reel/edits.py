"""The edits a fork makes to the turn it re-runs (``RunHandle.fork(at=…, edits=[…])``; docs/forks.md).

Each is a frozen ``msgspec.Struct`` tagged by ``edit`` (its JSON name) and is recorded on the fork's
``branch_forked`` event::

    branch = await handle.fork(at="fix:t1", edits=[reel.edits.Restore(item="old-notes"),
                                                   reel.edits.Param(key="temperature", value=0)])
"""

from __future__ import annotations

from reel.shared.core.run.forkedits import ContextEdit
from reel.shared.core.run.forkedits import Drop as Drop
from reel.shared.core.run.forkedits import Instructions as Instructions
from reel.shared.core.run.forkedits import Model as Model
from reel.shared.core.run.forkedits import Param as Param
from reel.shared.core.run.forkedits import Restore as Restore
from reel.shared.core.run.forkedits import ToolResult as ToolResult

Edit = ContextEdit
"""Any fork edit (the union of the classes above)."""

__all__ = ["Drop", "Edit", "Instructions", "Model", "Param", "Restore", "ToolResult"]
