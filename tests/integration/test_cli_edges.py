"""The CLI's rough edges, as a user meets them on a real server: ``reel show``'s columns and an
attempt's bodies, usage errors (exit 2), honest replay outcomes (``unlabelled``, the context check on its own),
a multi-file replay with an unreadable file, ``reel ls`` newest first, ``reel verdicts -f`` ending, the
``reel up`` probe refusing a server without this namespace's streams."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import pytest

from reel.services.cli.console import CliError
from reel.services.cli.embed import _check_reel_server
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.test_cli import REPO, reel
from tests.unit.test_trajectories_swe1 import _history, _write


async def test_show_columns_bodies_and_usage_errors(cfg: Config, event_log: JetStreamEventLog,
                                                    blobs: JetStreamBlobStore) -> None:
    code, out, err = await reel(cfg, "run", "examples/hello.yaml", "-q")
    assert code == 0, (out, err)
    run_id = re.search(r"run (r-[0-9a-f]{20})", out).group(1)  # type: ignore[union-attr]
    state = await event_log.load(run_id)

    code, shown, err = await reel(cfg, "show", run_id)
    assert code == 0, err
    for col in ("command", "exit", "out B", "pack/avail/drop", "packed tok", "tok in/out", "finish", "ms call/wall"):
        assert col in shown, col
    run_row = next(line for line in shown.splitlines() if line.startswith("│ run "))
    cells = [c.strip() for c in run_row.strip("│").split("│")]
    assert cells[4] == "sh -c 'sh -s'" and cells[5] == "0" and cells[6] == str(len(b"hello from reel\n"))
    plan = state.branches["main"].attempts["plan"][0]  # type: ignore[index]
    plan_row = [c.strip() for c in next(line for line in shown.splitlines() if line.startswith("│ plan "))
                .strip("│").split("│")]
    c = plan.context
    assert c is not None and plan_row[7] == f"{len(c.packed)}/{len(c.available)}/{len(c.dropped)}"
    assert c.reserved_tokens == 0 and plan_row[8] == f"{c.packed_tokens}"  # a model step reserves nothing: no tools
    assert "instructions" in c.packed  # its instructions: a required item, as an agent's first turn's
    assert plan_row[9] == f"{plan.usage.input_tokens}/{plan.usage.output_tokens} estimated"  # a scripted model
    assert plan_row[10] == "stop"
    assert plan_row[11].endswith(f"/{plan.finished_ms - plan.dispatched_ms}")  # type: ignore[operator]
    lines = shown.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("│ summarize "))
    cell = [lines[first].strip("│").split("│")[-1].strip()]
    for line in lines[first + 1:]:
        if not line.startswith("│  "):
            break
        cell.append(line.strip("│").split("│")[-1].strip())
    assert " ".join(c for c in cell if c) == "rate_limited: 429 Too Many Requests (scripted)"  # whole, never cut
    assert "plan#1 dropped: old-notes (stale), scratchpad (excluded_kind)" in shown  # the reasons, recorded

    code, prompt, err = await reel(cfg, "show", run_id, "--attempt", "plan#1", "--prompt")
    assert code == 0, err
    assert plan.prompt_ref is not None and prompt.encode() == await blobs.get(plan.prompt_ref)
    code, output, err = await reel(cfg, "show", run_id, "--attempt", "run", "--output")
    assert code == 0 and output == "hello from reel\n", (output, err)
    code, _, err = await reel(cfg, "show", run_id, "--attempt", "run#1", "--prompt")
    assert code == 1 and "run#1 has no prompt (only model attempts have a prompt)" in err
    code, _, err = await reel(cfg, "show", run_id, "--attempt", "summarize#9", "--output")
    assert code == 1 and "not 9" in err

    for args in (("show", run_id, "--prompt"), ("show", run_id, "--attempt", "plan#x", "--output"),
                 ("show", run_id, "--no-such-option"), ("show",), ("rewind", run_id)):
        code, _, err = await reel(cfg, *args)
        assert code == 2, (args, err)  # usage errors: the click/typer convention, as the README says

    code, out, err = await reel(cfg, "verdicts", run_id, "-f", timeout_s=60)  # the run is complete: ends at once
    assert code == 0 and "greeting-printed" in out and "task-was-packed" in out, (out, err)


def _swe1(tmp_path: Path) -> Path:
    return _write(tmp_path, _history(), name="acme__pager-42.traj")


async def test_replay_batch_reports_unreadable_files_and_honest_outcomes(cfg: Config, event_log: JetStreamEventLog,
                                                                         tmp_path: Path) -> None:
    good = _swe1(tmp_path)
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    missing = tmp_path / "gone.traj"
    code, out, err = await reel(cfg, "replay", str(bad), str(good), str(missing), "-q", timeout_s=240)
    assert code == 1, (out, err)  # two unreadable files: exit 1 at the end, the readable one replayed
    assert f"unreadable: {bad}: unknown trajectory format" in err.replace("\n", " ")
    assert f"cannot read trajectory {missing}" in err.replace("\n", " ")
    assert "2 of 3 files unreadable" in err
    assert "steps" not in out.split("replayed runs")[0]  # -q: no per-run lines before the summary
    (run_id,) = re.findall(r"r-[0-9a-f]{20}", out)
    summary = next(line for line in out.splitlines() if run_id in line)
    assert "unlabelled" in summary and "task-in-final-context=pass" in summary and "passed" not in summary

    state = await event_log.load(run_id)
    assert state.status == "completed" and state.outcome == "passed"  # the log is unchanged: all verdicts passed
    assert [v.verifier for v in state.verdicts] == ["task-in-final-context"]

    code, shown, err = await reel(cfg, "show", run_id)
    assert code == 0 and "outcome unlabelled" in shown and "context check task-in-final-context=pass" in shown, err
    assert "outcome passed" not in shown
    code, js, err = await reel(cfg, "show", run_id, "--json")
    view = json.loads(js)
    assert view["outcome"] == "unlabelled" and [v["verifier"] for v in view["context_checks"]] == [
        "task-in-final-context"]

    code, out, err = await reel(cfg, "replay", str(good), "-q", "--fresh", timeout_s=240)
    assert code == 0, (out, err)  # unlabelled: exit 0, as a success without an outcome verifier
    (second,) = re.findall(r"r-[0-9a-f]{20}", out)
    code, listed, err = await reel(cfg, "ls")
    assert code == 0, err
    rows = [line for line in listed.splitlines() if "r-" in line]
    assert [re.search(r"r-[0-9a-f]{20}", r).group(0) for r in rows] == [second, run_id]  # type: ignore[union-attr]
    assert all("unlabelled" in r and "task-in-final-context=pass" in r for r in rows)


async def test_verdicts_follow_ends_when_the_run_completes(cfg: Config, infra: Infra, client: ReelClient) -> None:
    from reel.services.executor.app import serve as executor
    from reel.services.verifier.app import serve as verifier
    from reel.shared.core.workflow.spec import load_workflow

    async with running(executor, infra, cfg), running(verifier, infra, cfg):
        reply = await client.start(load_workflow(REPO / "examples/hello.yaml"))
        assert reply.run_id is not None
        code, out, err = await reel(cfg, "verdicts", reply.run_id, "--follow", timeout_s=180)
    assert code == 0, (out, err)  # ended by itself once the run completed, exit code by its outcome (passed)
    assert "greeting-printed" in out and "task-was-packed" in out


async def test_the_local_probe_refuses_a_server_without_this_namespaces_streams(cfg: Config, infra: Infra) -> None:
    await _check_reel_server(infra.nc, cfg)  # this namespace's streams exist: it is used
    other = Config(nats_url=cfg.nats_url, names=Names(f"{cfg.names.namespace}x"))
    with pytest.raises(CliError, match=r"is not a Reel server for namespace .*it has no stream"):
        await _check_reel_server(infra.nc, other)


async def test_serve_takes_nats_url_and_namespace(cfg: Config, infra: Infra) -> None:
    from reel.services.cli.embed import service_active

    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REEL_NAMESPACE")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", "serve", "cancel", "--nats-url", cfg.nats_url,
        "--namespace", cfg.names.namespace, cwd=REPO, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(60):
            while not await service_active(infra, cfg, "cancel"):  # its durable consumer pulls: it serves here
                assert proc.returncode is None, "reel serve cancel exited"
                await asyncio.sleep(0.1)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
