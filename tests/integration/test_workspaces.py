"""Workspaces per branch (docs/workspaces.md) on a real nats-server: the agent example, run and rewound at ``fix:t1``.

The rewound branch starts from the fork point's files (its first ``run_tests`` fails as on main), the old branch's
working copy is left as it was, every tool call that changed files recorded a snapshot, and each branch's verifier
judges that branch's files (a copy of the snapshot as of its pinned LSN).
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from reel.services.executor.app import serve as executor_serve
from reel.services.rewind.app import serve as rewind_serve
from reel.services.verifier.app import serve as verifier_serve
from reel.shared.application import workspace as ws
from reel.shared.core.run.events import AttemptFailed, AttemptSucceeded, BlobRef
from reel.shared.core.run.state import RunState, workspace_as_of
from reel.shared.core.workflow.spec import WorkspaceSpec, load_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.golden.regen import GOLDEN_DIR, fold_log
from tests.integration.scenarios import wait_state
from tests.integration.test_cli import reel

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent"
FIXED = "most_common(n)"
BUGGY = "most_comon(n)"


def _call(state: RunState, branch: str, step: str) -> tuple[str, str | None]:
    a = state.branches[branch].attempts[step][-1]
    return a.status, a.error_kind


async def _source(blobs: JetStreamBlobStore, ref: BlobRef) -> str:
    manifest = await ws.load_manifest(ref, blobs)
    return (await blobs.get(manifest.files["wordfreq/__init__.py"].ref)).decode()


async def test_a_rewind_at_the_first_turn_starts_from_the_fork_points_files(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REEL_WORKSPACE_ROOT", str(tmp_path / "ws"))
    spec = load_workflow(EXAMPLE / "fix_typo.yaml", env={})
    async with running(executor_serve, infra, cfg), running(rewind_serve, infra, cfg), \
            running(verifier_serve, infra, cfg):
        started = await client.start(spec, source_dir=str(EXAMPLE))
        assert started.ok and started.run_id, started
        run_id = started.run_id
        await client.wait_for(run_id, ("completed",), timeout_s=120)
        main_copy = tmp_path / "ws" / run_id / "main" / "wordfreq" / "__init__.py"
        assert FIXED in main_copy.read_text()
        rewound = await client.rewind(run_id, at_step="fix:t1", idempotency_key="again")
        assert rewound.ok and rewound.branch_id, rewound
        fork = rewound.branch_id
        state = await wait_state(event_log, run_id, lambda s: s.status == "completed" and s.active_branch == fork
                                 and len([v for v in s.verdicts if v.branch_id == fork]) == 1,
                                 what="the fork's verdict", timeout_s=120)
    # the fork's first run_tests fails as main's did: its files are the fork point's, not main's fixed ones
    assert _call(state, "main", "fix:t1:c1") == ("failed", "exit_1")
    assert _call(state, fork, "fix:t1:c1") == ("failed", "exit_1")
    assert _call(state, fork, "fix:t3:c0") == ("succeeded", None)
    # the old branch's files are intact: its working copy and its snapshots
    assert FIXED in main_copy.read_text()
    main_ws, fork_ws = workspace_as_of(state, "main"), workspace_as_of(state, fork)  # type: ignore[arg-type]
    assert main_ws is not None and fork_ws is not None
    assert FIXED in await _source(blobs, main_ws) and FIXED in await _source(blobs, fork_ws)
    assert isinstance(state.workspace, BlobRef) and BUGGY in await _source(blobs, state.workspace)
    # the snapshot as of the fork point is the run's first one; each branch's write recorded its own
    base = state.branches[fork].fork_lsn
    assert base is not None and workspace_as_of(state, "main", base) == state.workspace  # type: ignore[arg-type]
    writes = [a.workspace for b in ("main", fork) for a in state.branches[b].attempts["fix:t2:c0"]]
    assert all(isinstance(w, BlobRef) for w in writes)
    # each branch's verifier judged its own branch (at its own pinned LSN) and passed on its own fixed files
    verdicts = {v.branch_id: v for v in state.verdicts}
    assert verdicts["main"].status == "pass" and verdicts[fork].status == "pass"
    assert verdicts["main"].snapshot_lsn < verdicts[fork].snapshot_lsn


async def test_only_calls_that_changed_files_record_a_snapshot(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REEL_WORKSPACE_ROOT", str(tmp_path / "ws"))
    spec = load_workflow(EXAMPLE / "fix_typo.yaml", env={})
    async with running(executor_serve, infra, cfg):
        started = await client.start(spec, source_dir=str(EXAMPLE))
        assert started.run_id
        await client.wait_for(started.run_id, ("verifying", "completed"), timeout_s=120)
    log = await event_log.read(started.run_id)
    recorded = {e.step_id: e.workspace for _, c in log for e in c.events
                if isinstance(e, AttemptSucceeded | AttemptFailed) and ":c" in e.step_id}
    assert set(recorded) == {"fix:t1:c0", "fix:t1:c1", "fix:t2:c0", "fix:t3:c0"}
    changed = {k for k, v in recorded.items() if isinstance(v, BlobRef)}
    assert changed == {"fix:t2:c0"}, recorded  # reading and testing change nothing (no __pycache__ either)
    ref = recorded["fix:t2:c0"]
    assert isinstance(ref, BlobRef)
    state = await event_log.load(started.run_id)
    assert isinstance(state.workspace, BlobRef)
    before, after = await ws.load_manifest(state.workspace, blobs), await ws.load_manifest(ref, blobs)
    changes = await ws.diff(before, after, blobs)
    assert [(c.path, c.change) for c in changes] == [("wordfreq/__init__.py", "modified")]
    assert changes[0].diff is not None and f"+    return Counter(words(text)).{FIXED}" in changes[0].diff
    # reel show lists each call that changed files, with its diff
    code, out, err = await reel(cfg, "show", started.run_id)
    assert code == 0, (out, err)
    assert "workspace changes on branch main: 1 tool call(s) changed files" in out, out
    assert re.search(r"lsn +\d+  fix:t2:c0#1  modified wordfreq/__init__.py", out), out
    assert f"-    return Counter(words(text)).{BUGGY}" in out and f"+    return Counter(words(text)).{FIXED}" in out


async def test_a_workspace_over_its_limit_is_refused_at_start(
    infra: Infra, cfg: Config, client: ReelClient, tmp_path: Path,
) -> None:
    spec = load_workflow(EXAMPLE / "fix_typo.yaml", env={})
    small = msgspec.structs.replace(spec, workspace=msgspec.structs.replace(spec.workspace, max_bytes=100))
    async with running(executor_serve, infra, cfg):
        reply = await client.start(small, source_dir=str(EXAMPLE))
    assert not reply.ok and reply.error is not None and reply.error.code == "workflow_invalid", reply
    assert "workspace_too_large" in reply.error.message and "max_bytes" in reply.error.message, reply


async def test_working_copies_forget_a_finished_run_and_keep_its_folder(blobs: JetStreamBlobStore,
                                                                       tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "notes.txt").write_text("first\n")
    spec = WorkspaceSpec(from_="seed")
    first = await ws.snapshot(seed, spec, blobs)
    state = msgspec.structs.replace(fold_log(GOLDEN_DIR / "recorded_linear.jsonl")[0], workspace=first.ref)
    copies = ws.WorkingCopies(blobs, tmp_path / "ws")
    folder = await copies.prepare(state, "main")
    assert folder is not None and (folder / "notes.txt").read_text() == "first\n"
    (folder / "notes.txt").write_text("edited\n")
    assert await copies.record(state, "main", spec) is not None  # held: the edit is a change
    await copies.forget(state.run_id)
    assert await copies.record(state, "main", spec) is None  # nothing held of the run any more
    assert (folder / "notes.txt").read_text() == "edited\n"  # the folder stays for the user to look at
    again = await copies.prepare(state, "main")  # a branch that runs again is materialised from its snapshot
    assert again == folder and (folder / "notes.txt").read_text() == "first\n"
