"""A run's branches compared, with what the pure comparison needs read from the blob store.

:func:`comparison` reads each branch's final output and the branches' workspace diffs, then asks
:func:`reel.shared.core.run.compare.compare`. ``reel compare`` and ``reel mcp``'s ``compare_branches`` print
or return its answer (the UI reads outputs through its own size-bounded reader).
"""

from __future__ import annotations

from collections.abc import Sequence

from reel.shared.application import workspace
from reel.shared.application.workspace import BlobGetter
from reel.shared.core.run import compare as cmp
from reel.shared.core.run.ids import BranchId
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import build_episode_view


class UnknownBranch(LookupError):
    """A branch the run does not have; ``str()`` names it and the run's branches."""


def chosen_branches(state: RunState, given: Sequence[str]) -> list[BranchId]:
    """The branches to compare: ``given`` (each once, in order), else every branch with the root first.

    Raises:
        UnknownBranch: a branch of ``given`` the run does not have.
    """
    if not given:
        return cmp.default_branches(state)
    unknown = [b for b in given if b not in state.branches]
    if unknown:
        raise UnknownBranch(f"run {state.run_id} has no branch {unknown[0]!r} (branches: "
                            f"{', '.join(cmp.default_branches(state))})")
    return [BranchId(b) for b in dict.fromkeys(given)]


async def branch_outputs(state: RunState, branches: Sequence[BranchId], blobs: BlobGetter | None
                         ) -> dict[BranchId, str | None]:
    """Each branch's final output text (``None``: none yet, or no blob store to read it from).

    Raises:
        BlobMissing, BlobCorrupt, BlobTimeout: an output's body cannot be read.
    """
    out: dict[BranchId, str | None] = {}
    for b in branches:
        ref = cmp.final_output_ref(build_episode_view(state, b))
        out[b] = None if ref is None or blobs is None else cmp.answer_text(await blobs.get(ref))
    return out


async def comparison(state: RunState, branches: Sequence[BranchId], blobs: BlobGetter | None) -> cmp.Comparison:
    """``branches`` of ``state`` compared, the first the baseline (see :func:`reel.shared.core.run.compare.compare`).

    Raises:
        BlobMissing, BlobCorrupt, BlobTimeout: an output or a workspace snapshot cannot be read.
    """
    return cmp.compare(state, branches, await branch_outputs(state, branches, blobs),
                       workspaces=await workspace.branch_diffs(state, branches, blobs))
