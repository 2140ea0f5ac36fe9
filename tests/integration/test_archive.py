"""``reel archive`` / ``reel import`` on a real nats-server with the real services: a run with two branches (a
rewind), context partitions (model steps with packed / available / dropped items) and verdicts on both branches is
archived (a tar with its commits, verdicts and blobs), purged (``reel ls`` no longer lists it, its subjects are
empty), imported back, and folds and renders (``reel show --json``) as before — the only difference the LSNs,
renumbered by the archive's map (the imported commits are new stream sequences)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tarfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest

from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.run.statecodec import STATE_ENCODER
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import create_manual_run
from tests.refold import assert_refold_identical

REPO = Path(__file__).resolve().parents[2]
TEXT = [f"{w} " * 20 for w in ("alpha", "bravo", "delta", "echo", "golf", "hotel")]
ITEM = DEFAULT_COUNTER.count(TEXT[0])


def workflow() -> dict[str, Any]:
    """Two model steps over six context items (a budget of three: each attempt has a partition), a tool between,
    and two verifiers."""
    context = [{"id": f"doc-{i}", "text": t, "priority": float(i), **({"stale": True} if i == 0 else {})}
               for i, t in enumerate(TEXT)]
    return {"name": "archive-harness", "steps": [
        {"kind": "model", "id": "plan", "model": {"adapter": "scripted", "outputs": ["plan", "plan again"]},
         "policy": {"budget_tokens": 3 * ITEM}, "context": context},
        {"kind": "tool", "id": "act", "tool": {"type": "scripted", "outputs": ["acted", "acted again"]}},
        {"kind": "model", "id": "review", "include_previous_outputs": True,
         "model": {"adapter": "scripted", "outputs": ["reviewed: " + "x" * 4000, "reviewed twice: " + "y" * 4000]},
         "policy": {"budget_tokens": 3 * ITEM}, "context": context}],
        "verifiers": [{"type": "output_regex", "name": "reviewed", "pattern": "reviewed"},
                      {"type": "output_regex", "name": "twice", "pattern": "twice"}]}


async def reel(cfg: Config, *args: str) -> tuple[int, str, str]:
    """``reel ARGS --nats-url … --namespace …`` as a process: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", *args, "--nats-url", cfg.nats_url, "--namespace",
        cfg.names.namespace, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"})
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def services(infra: Infra, cfg: Config) -> AsyncIterator[None]:
    from reel.services.executor.app import serve as executor
    from reel.services.rewind.app import serve as rewind
    from reel.services.verifier.app import serve as verifier

    async with running(executor, infra, cfg), running(verifier, infra, cfg), running(rewind, infra, cfg):
        yield


def renumbered(doc: Any, lsn_of: Mapping[int, int]) -> Any:
    """``doc`` (JSON builtins) with every value of a ``*lsn`` key moved through ``lsn_of`` (the archive's map:
    archived LSN → imported LSN; a point between commits → the new LSN of the last commit at or below it)."""
    def move(v: Any) -> Any:
        if not isinstance(v, int) or v == 0:
            return v
        return lsn_of[max(k for k in lsn_of if k <= v)]

    if isinstance(doc, dict):
        return {k: (move(v) if k.endswith("lsn") else renumbered(v, lsn_of)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [renumbered(v, lsn_of) for v in doc]
    return doc


async def finished_run_with_branches(client: ReelClient) -> str:
    reply = await client.start(parse_workflow(workflow()))
    assert reply.ok and reply.run_id, reply
    run_id = reply.run_id
    first = await client.wait_for(run_id, ("completed",), timeout_s=60)
    assert first.outcome is not None and first.outcome == "failed", first.outcome  # "twice" fails on main
    rewound = await client.rewind(run_id, at_step="act", idempotency_key="again")
    assert rewound.ok, rewound
    state = await client.wait_for(run_id, ("completed",), timeout_s=60)
    while state.active_branch == "main" or state.status != "completed":
        state = await client.wait_for(run_id, ("completed",), timeout_s=60)
    return run_id


async def test_archive_and_import_round_trip_a_run_with_branches_partitions_and_verdicts(
        services: None, client: ReelClient, event_log: JetStreamEventLog, infra: Infra, cfg: Config,
        tmp_path: Path) -> None:
    run_id = await finished_run_with_branches(client)
    before = await event_log.load(run_id, cold=True)
    assert len(before.branches) == 2 and len(before.verdicts) == 4, (before.branches.keys(), before.verdicts)
    partitions = [a.context for b in before.branches.values() for tries in b.attempts.values() for a in tries
                  if a.context is not None]
    assert partitions and all(p.dropped for p in partitions), "every model attempt records a partition"
    code, show_before, err = await reel(cfg, "show", run_id, "--json")
    assert code == 0, err
    old_lsns = [lsn for lsn, _ in await event_log.read(run_id)]

    out = tmp_path / "runs.tar"
    code, said, err = await reel(cfg, "archive", run_id, "-o", str(out))
    assert code == 0, (said, err)
    assert "purged" in said
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    (run,) = manifest["runs"]
    assert run["run_id"] == run_id and run["commits"] == len(old_lsns) and run["verdicts"] == 4
    assert run["blobs"] and all(f"blobs/{sha}" in names for sha in run["blobs"]), "every referenced blob is in it"
    assert run_id not in await event_log.list_runs()
    code, listed, err = await reel(cfg, "ls")
    assert code == 0 and run_id not in listed, (listed, err)
    code, _, err = await reel(cfg, "show", run_id, "--json")
    assert code != 0 and "run_not_found" in err + _, err

    code, said, err = await reel(cfg, "import", str(out))
    assert code == 0, (said, err)
    new_lsns = [lsn for lsn, _ in await event_log.read(run_id)]
    assert len(new_lsns) == len(old_lsns) and new_lsns[0] > old_lsns[-1], "new stream sequences"
    lsn_of = dict(zip(old_lsns, new_lsns, strict=True))

    after = await event_log.load(run_id, cold=True)
    await assert_refold_identical(event_log, after)
    want = renumbered(msgspec.json.decode(STATE_ENCODER.encode(before)), lsn_of)
    assert msgspec.json.decode(STATE_ENCODER.encode(after)) == want, "the imported run folds as the archived one"
    code, show_after, err = await reel(cfg, "show", run_id, "--json")
    assert code == 0, err
    assert json.loads(show_after) == renumbered(json.loads(show_before), lsn_of), "and renders the same"
    assert run_id in await event_log.list_runs()
    verdicts = await infra.js.get_last_msg(cfg.names.verdicts_stream, cfg.names.verdict(run_id))
    assert json.loads(verdicts.data or b"{}")["snapshot_lsn"] in new_lsns

    code, _, err = await reel(cfg, "import", str(out))
    assert code != 0 and "exists here already" in err, err


async def test_a_live_run_is_not_archived(event_log: JetStreamEventLog, cfg: Config, tmp_path: Path) -> None:
    run_id = "r-live-one"
    await create_manual_run(event_log, run_id, [("a", 1)])
    code, out, err = await reel(cfg, "archive", run_id, "-o", str(tmp_path / "a.tar"))
    assert code != 0 and "is pending: only a completed or cancelled run is archived" in err + out, (out, err)
    assert not (tmp_path / "a.tar").exists()
    assert run_id in await event_log.list_runs()


async def test_the_ui_index_forgets_an_archived_run_and_shows_it_again_once_imported(
        client: ReelClient, event_log: JetStreamEventLog, infra: Infra, cfg: Config, tmp_path: Path) -> None:
    from reel.services.ui.reader import RunReader
    from reel.shared.core.run.events import RunCancelled, RunCreated, StepDecl
    from reel.shared.nats.archive import archive_runs, import_archive

    run_id, other = "r-ui-archived", "r-ui-stays"
    workflow = await client.blobs.put(b'{"name": "w", "steps": []}' * 200, "application/json")
    for rid in (run_id, other):
        created = RunCreated(run_id=rid, branch_id="main", workflow_name="w", created_ms=1, workflow_ref=workflow,
                             steps=(StepDecl(step_id="a", kind="tool"),))
        lsn = await event_log.commit(rid, [created], expected_lsn=0, writer="test")
        await event_log.commit(rid, [RunCancelled(reason="done", at_ms=1)], expected_lsn=lsn, writer="test")
    reader = RunReader(client)
    async with reader.indexing():
        assert await reader.caught_up(30)
        assert reader.index.get(run_id) is not None and (await reader.state(run_id)).status == "cancelled"
        await archive_runs(infra, cfg.names, [run_id], tmp_path / "ui.tar", now_ms=1)
        assert await reader.caught_up(30)
        assert reader.index.get(run_id) is None, "the runs page no longer lists it"
        assert reader.index.get(other) is not None
        await import_archive(infra, cfg.names, tmp_path / "ui.tar")
        assert await reader.caught_up(30)
        row = reader.index.get(run_id)
        assert row is not None and row.status == "cancelled"


async def test_reel_pin_keeps_a_run_through_reel_gc_and_unpin_lets_it_go(
        client: ReelClient, event_log: JetStreamEventLog, cfg: Config) -> None:
    from reel.shared.core.run.events import RunCancelled, RunCreated, StepDecl

    workflow = await client.blobs.put(b'{"name": "w", "steps": []}' * 200, "application/json")
    pinned, loose = "r-pinned", "r-loose"
    for rid in (pinned, loose):
        created = RunCreated(run_id=rid, branch_id="main", workflow_name="w", created_ms=1, workflow_ref=workflow,
                             steps=(StepDecl(step_id="a", kind="tool"),))
        lsn = await event_log.commit(rid, [created], expected_lsn=0, writer="test")
        await event_log.commit(rid, [RunCancelled(reason="done", at_ms=1)], expected_lsn=lsn, writer="test")
    code, out, err = await reel(cfg, "pin", pinned, "--by", "ops")
    assert code == 0 and f"pinned {pinned}" in out, (out, err)
    code, out, err = await reel(cfg, "gc", "--keep-newest", "0", "--json")
    assert code == 0, (out, err)
    report = json.loads(out)
    assert report["dropped"] == [loose] and report["pinned"] == 1 and report["deleted"] == 0, report  # grace 1 h
    assert set(await event_log.list_runs()) == {pinned}
    code, out, err = await reel(cfg, "unpin", pinned)
    assert code == 0, (out, err)
    code, out, err = await reel(cfg, "gc", "--keep-newest", "0", "--grace-s", "0.001", "--json")
    assert code == 0, (out, err)
    report = json.loads(out)
    assert report["dropped"] == [pinned] and report["deleted"] == 1, report  # the workflow blob, named by no run now
    assert await event_log.list_runs() == []


async def test_the_retention_service_drops_what_its_policy_lets_go(
        client: ReelClient, event_log: JetStreamEventLog, infra: Infra, cfg: Config,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from reel.services.retention.app import serve as retention_serve
    from reel.shared.core.run.events import RunCancelled, RunCreated, StepDecl
    from tests.integration.scenarios import wait_until

    workflow = await client.blobs.put(b'{"name": "w", "steps": []}' * 200, "application/json")
    for i, rid in enumerate(("r-old", "r-new", "r-live")):
        created = RunCreated(run_id=rid, branch_id="main", workflow_name="w", created_ms=1, workflow_ref=workflow,
                             steps=(StepDecl(step_id="a", kind="tool"),))
        lsn = await event_log.commit(rid, [created], expected_lsn=0, writer="test")
        if rid != "r-live":
            await event_log.commit(rid, [RunCancelled(reason="done", at_ms=1 + i)], expected_lsn=lsn, writer="test")
    for name, value in (("REEL_RETENTION_KEEP_NEWEST", "1"), ("REEL_RETENTION_SWEEP_S", "0.2"),
                        ("REEL_BLOB_GRACE_S", "3600")):
        monkeypatch.setenv(name, value)
    async with running(retention_serve, infra, cfg):
        async def dropped() -> bool:
            return "r-old" not in await event_log.list_runs()

        await wait_until(dropped, timeout_s=30, what="the retention service dropped r-old")
    assert set(await event_log.list_runs()) == {"r-new", "r-live"}, "the newest finished run and a live one stay"
    assert await client.blobs.get(workflow), "a blob a kept run names stays"
