"""``reel crucible`` as a real process: exit codes, SIGTERM, kill -9 + resume, show exports, embedded default."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from reel.services.crucible.session import backend
from reel.services.crucible.world import git
from reel.shared.crucible.events import MeasureStarted, SessionEnded, SessionResumed
from reel.shared.crucible.fold import fold
from reel.shared.crucible.names import CrucibleNames
from reel.shared.crucible.state import Fate, LoopExit
from reel.shared.nats.infra import connect
from reel.shared.runtime.config import Config
from tests.crucible.fixtures import config_dict, make_repo, write

REPO = Path(__file__).resolve().parents[2]


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REEL_NAMESPACE")}
    return {**env, "REEL_LOG_FORMAT": "json", "REEL_LOG_LEVEL": "WARNING", "PYTHONPATH": str(REPO)}


def argv(cmd: str, *args: str, cfg: Config | None = None) -> list[str]:
    nats = ["--nats-url", cfg.nats_url, "--namespace", cfg.names.namespace] if cfg else []
    return [sys.executable, "-m", "reel.services.crucible.cli", cmd, *args, *nats]


async def start(args: Sequence[str], cwd: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(*args, cwd=str(cwd), env=cli_env(), start_new_session=True,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def cli(args: Sequence[str], cwd: Path) -> tuple[int, str, str]:
    proc = await start(args, cwd)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def config_file(root: Path, repo: Path, plan: list[dict[str, Any]], **over: Any) -> Path:
    path = root / "crucible.json"
    path.write_text(json.dumps(config_dict(root, repo, plan, **over)))
    return path


EXITS: dict[str, tuple[list[dict[str, Any]], dict[str, Any], LoopExit]] = {
    "finished": ([write(2), write(1)], {}, LoopExit.FINISHED),
    "solved": ([write(2), write(5)], {"goal": 4.0}, LoopExit.SOLVED),
    "budget": ([write(2, cost_usd=0.6), write(3, cost_usd=0.6)], {"budget": {"iterations": 5, "cost_usd": 1.0}},
               LoopExit.BUDGET),
    "escalated": ([write(2), {"escalate": "need data access"}], {}, LoopExit.ESCALATED),
}


@pytest.mark.parametrize("name", list(EXITS))
async def test_cli_exit_code_of_each_loop_exit(cfg: Config, root: Path, name: str) -> None:
    plan, over, expected = EXITS[name]
    repo = await make_repo(root, "1")
    code, out, err = await cli(argv("run", str(config_file(root, repo, plan, **over)), "--session", name, cfg=cfg),
                               root)
    assert code == expected.exit_code, err
    assert f"exit: {expected.value} ({expected.exit_code})" in out and "session: " + name in out


async def test_cli_sigterm_stops_with_exit_5_and_resume_continues(cfg: Config, root: Path) -> None:
    repo = await make_repo(root, "1")
    path = config_file(root, repo, [write(2), write(3), write(4), write(5), write(6)])
    nc = await connect(cfg)
    sub = await nc.subscribe(CrucibleNames(cfg.names).session("term"))
    proc = await start(argv("run", str(path), "--session", "term", "-q", cfg=cfg), root)
    async for msg in sub.messages:  # rendezvous on the session log, not a sleep
        if b'"iteration_closed"' in msg.data:
            proc.send_signal(signal.SIGTERM)
            break
    await nc.close()
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == LoopExit.STOPPED.exit_code == 5, err.decode()
    code, out, _ = await cli(argv("resume", "term", cfg=cfg), root)
    assert code == LoopExit.FINISHED.exit_code and "exit: finished (3)" in out
    async with backend(cfg, writer="test") as b:
        events = await b.log.events("term")
    ends = [e for e in events if isinstance(e, SessionEnded)]
    assert (ends[0].exit, ends[0].reason) == (LoopExit.STOPPED, "stop requested")
    assert ends[-1].exit is LoopExit.FINISHED


async def test_kill9_mid_iteration_then_resume_restores_the_log_state(cfg: Config, root: Path) -> None:
    repo = await make_repo(root, "1")
    fifo = root / "rendezvous"
    os.mkfifo(fifo)
    head_file = root / "head.json"
    plan = [write(2), write("rendezvous"), write(3, record_head=str(head_file)), write(4)]
    path = config_file(root, repo, plan, judge_env={"RENDEZVOUS": str(fifo)})
    proc = await start(argv("run", str(path), "--session", "killed", "-q", cfg=cfg), root)

    def judge_pid() -> int:
        with fifo.open() as f:  # blocks until the judge of iteration 2 opens it: it is mid-measurement
            return int(f.readline())

    pid = await asyncio.wait_for(asyncio.to_thread(judge_pid), 60)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its group…
    os.kill(pid, signal.SIGKILL)  # …and the judge (its own process group), as if the machine died
    await proc.wait()
    assert proc.returncode == -signal.SIGKILL

    async with backend(cfg, writer="test") as b:
        before = await b.log.load("killed")
    run = before.run
    assert run is not None and before.ended is None
    assert [r.verdict for r in run.rows] == [Fate.KEEP] and run.open_it is not None and run.open_it.it == 2
    candidate = run.open_it.sha
    world = Path(before.started.world_dir)
    assert candidate and (await git(world, "rev-parse", "HEAD")).strip() == candidate  # died with it applied

    code, _, err = await cli(argv("resume", "killed", "-q", cfg=cfg), root)
    assert code == LoopExit.FINISHED.exit_code, err
    async with backend(cfg, writer="test") as b:
        commits = await b.log.read("killed")
        after = await b.log.load("killed")
    lsn_resumed = next(lsn for lsn, c in commits if any(isinstance(e, SessionResumed) for e in c.events))
    at_resume = fold([(lsn, c) for lsn, c in commits if lsn <= lsn_resumed])
    assert at_resume is not None and at_resume.run is not None
    assert at_resume.run.spent == run.spent and at_resume.run.segment == run.segment  # counters, spend, best sha
    assert at_resume.run.rows[-1].verdict is Fate.ABANDONED and at_resume.run.rows[-1].sha == candidate
    found = json.loads(head_file.read_text())  # what the proposer of iteration 3 found
    assert found == {"head": run.segment.best_snap, "clean": True}
    assert [r.verdict.value for r in after.run.rows] == ["keep", "abandoned", "keep", "keep"]
    assert after.run.spent.iterations == 4 and after.run.segment.best_score == 4.0
    pre = [e for lsn, c in commits if lsn < lsn_resumed for e in c.events]
    assert isinstance(pre[-1], MeasureStarted) and pre[-1].it == 2  # the kill landed mid-measurement

    again, _, _ = await cli(argv("resume", "killed", "-q", cfg=cfg), root)
    async with backend(cfg, writer="test") as b:
        assert len(await b.log.read("killed")) == len(commits)  # idempotent: nothing appended
    assert again == LoopExit.FINISHED.exit_code


async def test_cli_show_exports_tsv_json_png(cfg: Config, root: Path) -> None:
    repo = await make_repo(root, "1")
    path = config_file(root, repo, [write(2), write(1), write("nan"), write(3)])
    code, _, err = await cli(argv("run", str(path), "--session", "shown", "-q", cfg=cfg), root)
    assert code == 3, err
    tsv, js, png = root / "rows.tsv", root / "session.json", root / "score.png"
    code, out, err = await cli(argv("show", "shown", "--tsv", str(tsv), "--json", str(js), "--png", str(png),
                                    cfg=cfg), root)
    assert code == 0, err
    for word in ("keep", "discard", "invalid", "exit: finished (3)"):
        assert word in out
    lines = tsv.read_text().splitlines()
    assert lines[0].split("\t")[:6] == ["it", "regime", "verdict", "readings", "score", "delta"]
    assert [ln.split("\t")[2] for ln in lines[1:]] == ["keep", "discard", "invalid", "keep"]
    doc = json.loads(js.read_text())
    assert doc["outcome"]["exit"] == "finished" and doc["outcome"]["best_score"] == 3.0 and len(doc["rows"]) == 4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


async def test_cli_errors_are_one_line_and_exit_1(cfg: Config, root: Path) -> None:
    bad = root / "bad.yaml"
    bad.write_text("world: {repo: .}\njudge: {command: [x]}\nproposer: {command: [y]}\n")
    code, _, err = await cli(argv("run", str(bad), cfg=cfg), root)
    assert code == 1 and err.strip().count("\n") == 0 and "direction" in err
    code, _, err = await cli(argv("resume", "nope", cfg=cfg), root)
    assert code == 1 and err.strip() == "error: no crucible session 'nope'"


async def test_cli_embedded_default_persists_for_resume_and_show(root: Path) -> None:
    repo = await make_repo(root, "1")
    path = config_file(root, repo, [write(2), write(0.5)])
    code, out, err = await cli(argv("run", str(path), "--session", "local"), root)  # no --nats-url: embedded
    assert code == 3, err
    assert (root / ".reel" / "crucible-js").is_dir()
    code, out, _ = await cli(argv("resume", "local"), root)  # a new embedded server finds the stored log
    assert code == 3 and "exit: finished (3)" in out
    code, out, _ = await cli(argv("show", "local"), root)
    assert code == 0 and "keep" in out and "discard" in out
