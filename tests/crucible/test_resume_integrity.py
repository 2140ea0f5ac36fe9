"""With real processes: no proposer child outlives its call or a killed driver, a
resumed candidate holds only what the resumed proposer wrote, a moved judge is caught before proposing on
resume; and ``reel crucible`` keeps its state under ``$REEL_HOME``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from reel.services.crucible.session import backend
from reel.services.crucible.world import git
from reel.shared.crucible.events import FingerprintChanged, ProposalMade, SessionEnded
from reel.shared.crucible.state import LoopExit
from reel.shared.runtime.config import Config
from tests.crucible.conftest import Crucible
from tests.crucible.fixtures import make_config, make_repo, write
from tests.crucible.test_cli import argv, cli_env, config_file


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def test_a_background_child_of_a_proposer_dies_when_the_proposer_exits(crucible: Crucible,
                                                                             root: Path) -> None:
    """The child waits for a gate the test opens only after the session: it can only write if it survived."""
    repo = await make_repo(root, "1")
    orphan = {"pid": str(root / "child.pid"), "gate": str(root / "gate"), "done": str(root / "done")}
    o = await crucible.run(make_config(root, repo, [{**write(2), "orphan": orphan}, write(3)]))
    assert [r.verdict.value for r in o.state.run.rows] == ["keep", "keep"]
    pid = int((root / "child.pid").read_text())
    assert not alive(pid)  # killed with the proposer's group when the proposer exited
    (root / "gate").write_text("x")
    world = Path(o.state.started.world_dir)
    assert not (world / "evil.txt").exists() and [m.paths for m in o.of(ProposalMade)] == [("value.txt",)] * 2


async def test_resume_reaps_what_a_killed_driver_left_and_the_resumed_candidate_is_clean(cfg: Config,
                                                                                         root: Path) -> None:
    """kill -9 of the driver while iteration 2's proposer runs with a background child: the proposer dies with
    the driver, the child would live on and write into the world while the resumed iteration 2 proposes."""
    repo = await make_repo(root, "1")
    fifo = root / "rendezvous"
    os.mkfifo(fifo)
    orphan = {"pid": str(root / "child.pid"), "gate": str(root / "gate"), "done": str(root / "done")}
    check = {**orphan, "record": str(root / "found.json")}
    rerun = {**write(3), "orphan_check": check}  # what iteration 2's proposer does when run again on resume
    plan = [write(2), {**write(9), "orphan": orphan, "fifo": str(fifo), "once": str(root / "ran"), "then": rerun},
            write(4)]
    path = config_file(root, repo, plan)
    env = {**cli_env(), "REEL_HOME": str(root / "home")}
    proc = await asyncio.create_subprocess_exec(*argv("run", str(path), "--session", "orphaned", "-q", cfg=cfg),
                                                cwd=str(root), env=env, start_new_session=True,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    def proposer_pid() -> int:
        with fifo.open() as f:  # blocks until iteration 2's proposer (its child already started) opens it
            return int(f.readline())

    pid = await asyncio.wait_for(asyncio.to_thread(proposer_pid), 120)
    child = int((root / "child.pid").read_text())
    os.kill(proc.pid, signal.SIGKILL)  # the driver only: its children live in groups of their own
    await proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert alive(child)  # the orphan outlived the driver (its proposer died with the driver)
    assert list((root / "home" / "tools").iterdir())  # the groups were recorded for the reaper

    resumed = await asyncio.create_subprocess_exec(*argv("resume", "orphaned", "-q", cfg=cfg), cwd=str(root),
                                                   env=env, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(resumed.communicate(), 120)
    assert resumed.returncode == LoopExit.FINISHED.exit_code, err.decode()[-2000:]
    assert json.loads((root / "found.json").read_text()) == {"alive": False}  # reaped before the resumed proposer
    assert not alive(child) and not alive(pid)
    async with backend(cfg, writer="test") as b:
        state = await b.log.load("orphaned")
        made = [e for e in await b.log.events("orphaned") if isinstance(e, ProposalMade)]
    assert [r.verdict.value for r in state.run.rows] == ["keep", "keep", "keep"]
    assert [m.it for m in made] == [1, 2, 3]  # the killed proposer never reported: iteration 2 ran again
    assert made[1].paths == ("value.txt",) and state.run.rows[1].score == 3.0  # only what the resumed one wrote
    world = Path(state.started.world_dir)
    assert not (world / "evil.txt").exists()
    assert (await git(world, "ls-tree", "-r", "--name-only", "HEAD")).split() == ["judge.py", "value.txt"]


async def test_resume_of_a_session_stopped_on_a_moved_judge_stops_again_without_proposing(crucible: Crucible,
                                                                                          root: Path) -> None:
    repo = await make_repo(root, "1")
    data = root / "labels.txt"
    data.write_text("gold\n")
    tamper = {"write": {str(data): "gold, but easier\n", "value.txt": "9\n"}, "note": "edit the judge's data"}
    cfg = make_config(root, repo, [write(2), tamper, write(3), write(4)],
                      judge={"command": ["{python}", "judge.py"], "direction": "maximize",
                             "reads": ["judge.py", str(data)], "env": {"JUDGE_STATE": str(root / "js")}})
    o = await crucible.run(cfg)
    assert o.exit is LoopExit.STOPPED and o.state.run.spent.iterations == 2
    for _ in range(2):
        again = await crucible.resume(o.session_id)
        assert again.exit is LoopExit.STOPPED
        assert again.state.run.spent.iterations == 2  # no iteration spent on a proposer run
        assert len(again.of(ProposalMade)) == len(o.of(ProposalMade)) == 2
        last = again.of(SessionEnded)[-1]
        assert isinstance(last, SessionEnded) and "not resuming against a moved goalpost" in last.reason
        moved = again.of(FingerprintChanged)[-1]
        assert isinstance(moved, FingerprintChanged) and moved.changed == (f"read:{data}",)


async def test_reel_crucible_keeps_its_store_and_worlds_under_reel_home(root: Path) -> None:
    repo = await make_repo(root, "1")
    path = config_file(root, repo, [write(2)], world={"repo": str(repo)})  # no workdir: the default
    cwd = root / "elsewhere"
    cwd.mkdir()
    home = root / "home"
    env = {**cli_env(), "REEL_HOME": str(home)}
    proc = await asyncio.create_subprocess_exec(*argv("run", str(path), "--session", "homed", "-q"), cwd=str(cwd),
                                                env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == LoopExit.FINISHED.exit_code, err.decode()[-2000:]
    assert (home / "crucible-js").is_dir() and (home / "crucible" / "homed" / "world" / ".git").is_dir()
    assert not (cwd / ".reel").exists()
