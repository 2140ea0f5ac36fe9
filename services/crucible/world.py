"""The world: a git working tree isolated per session.

Each session clones its source repository into ``<workdir>/<session_id>/world``
(a local clone: objects hard-linked, nothing shared with the source afterwards)
on a branch ``crucible/<session_id>``.

* settle   — after every proposer run: commits the proposer made itself are kept under
  ``refs/crucible/<session_id>/proposer/<it>`` and taken off the branch, which is back
  at the best snapshot with the proposer's working tree untouched — so the candidate is
  always *the best snapshot vs the world after the proposer*, its commits included.
* stage    — ``git add -A``: that whole change becomes the candidate (paths, diffstat, patch).
* apply    — ``git commit`` on the best snapshot: the candidate's snapshot is the commit sha;
  every applied candidate also gets the ref ``refs/crucible/<session_id>/<it>``, so
  discarded ones stay retrievable (``git show refs/crucible/<session>/<it>``), and its
  patch goes to the blob store.
* rollback — the branch re-attached, ``git reset --hard <best>`` + ``git clean -ffdx``:
  tracked and untracked files exactly as in the best snapshot.
* measure tree — the judge never runs in the world: :meth:`GitWorld.measure_tree` checks the
  measured sha out, clean (``checkout --force`` + ``clean -ffdx``), in the session's
  ``measure`` worktree (``<workdir>/<session_id>/measure``). Whatever a judge writes
  (bytecode caches, logs) stays there until the next measurement and never enters a candidate.

Commits are deterministic: fixed author/committer and a date derived from the
iteration number, so the same edits on the same base give the same shas (which
is what makes a re-run's session log identical).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from reel.services.crucible import proc
from reel.shared.crucible.config import WorldSpec
from reel.shared.crucible.errors import SessionBusy, WorldError
from reel.shared.crucible.state import WorldSha

COMMIT_EPOCH_S = 1_700_000_000
GIT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Staged:
    """The staged candidate: touched paths (sorted), ``git diff --stat`` summary, binary patch."""

    paths: tuple[str, ...]
    diffstat: str
    patch: bytes

    @property
    def empty(self) -> bool:
        return not self.paths


def session_dir(workdir: str, session_id: str) -> Path:
    """``<workdir>/<session_id>``: the world clone, the lock and the proposer's history file."""
    return Path(workdir) / session_id


def _git_env(it: int = 0) -> dict[str, str]:
    date = f"@{COMMIT_EPOCH_S + it} +0000"
    return {
        **proc.base_env(), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": "crucible", "GIT_AUTHOR_EMAIL": "crucible@reel.invalid", "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": "crucible", "GIT_COMMITTER_EMAIL": "crucible@reel.invalid",
        "GIT_COMMITTER_DATE": date,
    }


async def git(cwd: Path, *args: str, it: int = 0, stdin: bytes | None = None) -> str:
    """Run ``git args`` in ``cwd``; its stdout.

    Raises:
        WorldError: git failed (the message carries its last stderr line).
    """
    done = await proc.run(["git", *args], cwd=cwd, env=_git_env(it), timeout_s=GIT_TIMEOUT_S, stdin=stdin)
    if done.timed_out or done.returncode != 0:
        why = done.last_line("stderr") or ("timed out" if done.timed_out else f"exit {done.returncode}")
        raise WorldError(f"git {args[0]} failed in {cwd}: {why}")
    return done.text()


def _diffstat(numstat: list[list[str]]) -> str:
    """``git diff --stat``'s summary line from ``--numstat`` rows (binary files count no lines)."""
    ins = sum(int(c[0]) for c in numstat if c[0].isdigit())
    dels = sum(int(c[1]) for c in numstat if c[1].isdigit())
    n = len(numstat)
    parts = [f"{n} file{'s' if n != 1 else ''} changed"]
    if ins:
        parts.append(f"{ins} insertion{'s' if ins != 1 else ''}(+)")
    if dels:
        parts.append(f"{dels} deletion{'s' if dels != 1 else ''}(-)")
    return ", ".join(parts)


class GitWorld:
    """One session's world (see module doc)."""

    def __init__(self, root: Path, session_id: str) -> None:
        self.root = root
        self.session_id = session_id

    @classmethod
    async def create(cls, spec: WorldSpec, session_id: str) -> tuple[GitWorld, WorldSha]:
        """Clone ``spec.repo`` at ``spec.rev`` into the session's directory; the world and its base snapshot.

        A leftover directory of a session that never got a log is replaced.

        Raises:
            WorldError: the source is not a git repository or ``rev`` does not resolve.
        """
        source = Path(spec.repo)
        if not (source / ".git").exists() and not (source / "HEAD").exists():
            raise WorldError(f"world.repo {source} is not a git repository")
        sha = (await git(source, "rev-parse", "--verify", f"{spec.rev}^{{commit}}")).strip()
        root = session_dir(spec.workdir, session_id) / "world"
        for leftover in (root, root.parent / "measure"):
            if leftover.exists():
                shutil.rmtree(leftover)
        root.parent.mkdir(parents=True, exist_ok=True)
        await git(root.parent, "clone", "--quiet", "--no-checkout", str(source), str(root))
        # the clone's one local branch (the source's current one) goes: a source on a branch named
        # ``crucible`` would otherwise refuse ``crucible/<session>``
        await git(root, "update-ref", "-d", (await git(root, "symbolic-ref", "HEAD")).strip())
        await git(root, "checkout", "--quiet", "-B", f"crucible/{session_id}", sha)
        return cls(root, session_id), WorldSha(sha)

    @classmethod
    def open(cls, world_dir: str, session_id: str) -> GitWorld:
        """The existing world of a session (resume).

        Raises:
            WorldError: the directory is gone (the log alone cannot rebuild discarded work).
        """
        root = Path(world_dir)
        if not (root / ".git").is_dir():
            raise WorldError(f"world directory {root} of session {session_id} is missing")
        return cls(root, session_id)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the session's exclusive lock (one driver per world); released on exit or process death.

        Raises:
            SessionBusy: another process holds it.
        """
        path = self.root.parent / "lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise SessionBusy(f"session {self.session_id} is being driven by another process") from exc
            yield
        finally:
            os.close(fd)

    @property
    def history_path(self) -> Path:
        """Where the proposer finds the rows so far (JSON), outside the world."""
        return self.root.parent / "history.json"

    async def head(self) -> WorldSha:
        """The snapshot the working tree is at."""
        return WorldSha((await git(self.root, "rev-parse", "HEAD")).strip())

    @property
    def branch(self) -> str:
        """The session's branch (full ref name); the world's HEAD is attached to it between iterations."""
        return f"refs/heads/crucible/{self.session_id}"

    def proposer_ref(self, it: int) -> str:
        """The ref that keeps the commits the proposer of iteration ``it`` made itself."""
        return f"refs/crucible/{self.session_id}/proposer/{it}"

    async def settle(self, it: int, best: WorldSha) -> str:
        """After a proposer ran: the branch back at ``best``, the proposer's own commits kept aside.

        The working tree and index are left as the proposer left them, so staging them
        against ``best`` gives the whole change, committed or not. Returns the commit the
        proposer left HEAD at when it is not ``best`` (kept as :meth:`proposer_ref`), else ``""``.

        Raises:
            WorldError: git failed.
        """
        out = (await git(self.root, "rev-parse", "HEAD", "--symbolic-full-name", "HEAD")).split()
        head, ref = out[0], (out[1] if len(out) > 1 else "HEAD")
        if head == best and ref == self.branch:
            return ""
        if ref != self.branch:  # the proposer detached HEAD or switched branches
            await git(self.root, "symbolic-ref", "HEAD", self.branch)
        await git(self.root, "update-ref", self.branch, best)
        if head == best:
            return ""
        await git(self.root, "update-ref", self.proposer_ref(it), head)
        return head

    async def stage(self) -> Staged:
        """Stage every edit in the working tree as the candidate.

        Ignored files the proposer created are removed first (``git clean -X``): the
        candidate is exactly its tracked change, nothing hidden rides along into the measurement.
        """
        await git(self.root, "clean", "-q", "-ffdX")
        await git(self.root, "add", "-A")
        numstat = await git(self.root, "diff", "--cached", "--numstat", "--no-renames", "-z")
        counts = [ln.split("\t", 2) for ln in numstat.split("\0") if ln]
        if not counts:
            return Staged(paths=(), diffstat="", patch=b"")
        patch = await git(self.root, "diff", "--cached", "--binary")
        return Staged(paths=tuple(sorted(c[2] for c in counts)), diffstat=_diffstat(counts), patch=patch.encode())

    async def apply(self, it: int, note: str) -> WorldSha:
        """Commit the staged candidate of iteration ``it``; its snapshot (also ``refs/crucible/<session>/<it>``).

        Raises:
            WorldError: the commit failed.
        """
        first = (note.splitlines() or [""])[0][:200]
        await git(self.root, "commit", "--quiet", "--no-verify", "--no-gpg-sign", "-m", f"crucible it {it}: {first}",
                  it=it)
        sha = await self.head()
        await git(self.root, "update-ref", self.ref(it), sha)
        return sha

    def ref(self, it: int) -> str:
        """The ref that keeps iteration ``it``'s candidate retrievable."""
        return f"refs/crucible/{self.session_id}/{it}"

    async def rollback(self, snap: WorldSha, *, reattach: bool = False) -> None:
        """The branch, index and working tree exactly at ``snap``: every edit, commit and untracked file dropped.

        Args:
            reattach: attach HEAD to the session branch first (a world found as a dead driver left
                it; in the loop :meth:`settle` has done it after every proposer run).
        """
        if reattach:
            await git(self.root, "symbolic-ref", "HEAD", self.branch)
        await git(self.root, "reset", "--quiet", "--hard", snap)
        await git(self.root, "clean", "-q", "-ffdx")

    @property
    def measure_dir(self) -> Path:
        """The judge's worktree (outside the world): where every measurement runs and its artifacts stay."""
        return self.root.parent / "measure"

    async def measure_tree(self, snap: WorldSha) -> Path:
        """A clean checkout of ``snap`` to measure in (no file of an earlier measurement left); its path.

        Raises:
            WorldError: git failed.
        """
        tree = self.measure_dir
        if not (tree / ".git").is_file():
            if tree.exists():
                shutil.rmtree(tree)
            await git(self.root, "worktree", "prune")
            await git(self.root, "worktree", "add", "--quiet", "--force", "--detach", str(tree), snap)
        else:
            await git(tree, "checkout", "--quiet", "--force", "--detach", snap)
        await git(tree, "clean", "-q", "-ffdx")
        return tree
