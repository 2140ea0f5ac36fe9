"""A plain ``kind: tool`` step gets the workspace an agent's tool calls get (docs/workspaces.md), on a real
nats-server: its command runs in the branch's working copy (``$REEL_WORKSPACE``), its outcome commit records the
snapshot when it changed files, ``reel show``'s helper diffs it, the EpisodeView a verifier gets holds it, and a
rewind before the step starts the new branch from the fork point's files — the old branch's are left as they were.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reel.services.executor.app import serve as executor_serve
from reel.services.rewind.app import serve as rewind_serve
from reel.shared.application import workspace as ws
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.state import workspace_as_of
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.workflow.spec import load_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import wait_state

WORKFLOW = """\
name: plain-edit
workspace: {from: seed}
steps:
  - kind: tool
    id: edit
    tool:
      type: command
      argv: [sh, -c, 'cat "$REEL_WORKSPACE/notes.txt"; echo "edited on $REEL_BRANCH_ID" >> "$REEL_WORKSPACE/notes.txt"']
  - kind: tool
    id: check
    tool:
      type: command
      argv: [sh, -c, 'cat "$REEL_WORKSPACE/notes.txt"']
"""
SEED = "seed line\n"


async def _output(blobs: JetStreamBlobStore, ref: BlobRef) -> str:
    return ref.inline if isinstance(ref.inline, str) else (await blobs.get(ref)).decode()


async def test_a_tool_step_snapshots_its_workspace_and_a_rewind_before_it_restores_it(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REEL_WORKSPACE_ROOT", str(tmp_path / "ws"))
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "notes.txt").write_text(SEED)
    (tmp_path / "plain.yaml").write_text(WORKFLOW)
    spec = load_workflow(tmp_path / "plain.yaml", env={})
    async with running(executor_serve, infra, cfg), running(rewind_serve, infra, cfg):
        started = await client.start(spec, source_dir=str(tmp_path))
        assert started.ok and started.run_id, started
        run_id = started.run_id
        await client.wait_for(run_id, ("verifying", "completed"), timeout_s=60)
        main = await event_log.load(run_id)
        rewound = await client.rewind(run_id, at_step="edit", idempotency_key="before-edit")
        assert rewound.ok and rewound.branch_id, rewound
        fork = rewound.branch_id
        state = await wait_state(event_log, run_id, lambda s: s.active_branch == fork and s.status in (
            "verifying", "completed"), what="the rewound branch to end", timeout_s=60)

    def last(branch: str, step: str):  # type: ignore[no-untyped-def]
        a = state.branches[branch].attempts[step][-1]
        assert a.status == "succeeded" and a.output_ref is not None, a
        return a

    # main: the edit saw the seed, recorded a snapshot; the check changed nothing and recorded none
    edit, check = last("main", "edit"), last("main", "check")
    assert await _output(blobs, edit.output_ref) == SEED
    assert isinstance(edit.workspace, BlobRef) and not isinstance(check.workspace, BlobRef)
    assert await _output(blobs, check.output_ref) == SEED + "edited on main\n"
    assert isinstance(main.workspace, BlobRef) and workspace_as_of(main, "main", edit.outcome_lsn - 1) == main.workspace  # type: ignore[arg-type, operator]
    # the helper `reel show` and the UI print it with: one call changed files, with its diff
    calls = ws.call_snapshots(state, "main")  # type: ignore[arg-type]
    assert [(c.step_id, c.attempt, c.before, c.after) for c in calls] == [("edit", 1, main.workspace, edit.workspace)]
    changes = await ws.call_diff(calls[0], blobs)
    assert [(c.path, c.change) for c in changes] == [("notes.txt", "modified")]
    assert changes[0].diff is not None and "+edited on main" in changes[0].diff
    # the verifier's view holds the branch's snapshot
    assert build_episode_view(state, "main").workspace == edit.workspace  # type: ignore[arg-type]

    # the fork re-ran the edit from the fork point's files: it saw the seed, not main's edited file
    f_edit, f_check = last(fork, "edit"), last(fork, "check")
    assert await _output(blobs, f_edit.output_ref) == SEED
    assert await _output(blobs, f_check.output_ref) == SEED + f"edited on {fork}\n"
    fork_copy = tmp_path / "ws" / run_id / fork / "notes.txt"
    assert fork_copy.read_text() == SEED + f"edited on {fork}\n"
    assert (tmp_path / "ws" / run_id / "main" / "notes.txt").read_text() == SEED + "edited on main\n"  # untouched
    assert isinstance(f_edit.workspace, BlobRef) and f_edit.workspace != edit.workspace
    assert build_episode_view(state, fork).workspace == f_edit.workspace  # type: ignore[arg-type]
    assert workspace_as_of(state, "main") == edit.workspace  # type: ignore[arg-type]
