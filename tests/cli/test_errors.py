"""Errors as the README's exit-code table says: every ``--json`` command prints one JSON object on stdout also when
it fails (``{"ok": false, "code", "reason", "exit"}``, exit code per README), and ``reel replay``'s batch prints
exactly the stderr lines the README's row for exit 1 describes."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import typer

from reel.services.cli.app import app
from reel.shared.runtime.config import Config
from tests.cli.test_help import commands
from tests.ui.support import REPO, env_for, reel
from tests.unit.test_trajectories_swe1 import _history, _write

UNKNOWN = "r-00000000000000000000"
ARGS = {"run_id": UNKNOWN, "run_ids": UNKNOWN, "request_id": "q-1", "text": "yes", "branches": "main"}
"""What each command's arguments get: a run that does not exist."""


def _json_commands() -> dict[str, Any]:
    """Every command of the app with a ``--json`` flag (JSON on stdout), by its path (``cancel``, ``trace``…);
    ``crucible show --json FILE`` writes a file, and is not one."""
    return {path: cmd for path, cmd in commands(typer.main.get_command(app))
            if any("--json" in getattr(p, "opts", ()) and getattr(p, "is_flag", False) for p in cmd.params)}


def _one_json_error(out: str) -> dict[str, Any]:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, f"one JSON object on stdout, got {out!r}"
    doc = json.loads(lines[0])
    assert isinstance(doc, dict) and set(doc) == {"ok", "code", "reason", "exit"} and doc["ok"] is False, doc
    assert isinstance(doc["code"], str) and doc["code"] and isinstance(doc["reason"], str) and doc["reason"], doc
    return doc


async def test_every_json_command_prints_one_json_error(cfg: Config, tmp_path: Path) -> None:
    env = env_for(tmp_path)
    found = _json_commands()
    assert set(found) == {"show", "cancel", "rewind", "fork", "compare", "pending", "approve", "reject", "answer",
                          "status", "trace", "archive", "import", "gc", "lab"}

    async def call(path: str, cmd: Any) -> tuple[str, int, str, str]:
        args = [*path.split(), *(ARGS[p.name] for p in cmd.params if p.param_type_name == "argument")]
        args += {"rewind": ["--at-step", "a"], "fork": ["--at", "a:t1"], "reject": ["--note", "no"],
                 "archive": ["-o", str(tmp_path / "never.tar")]}.get(path, [])
        code, out, err = await reel(cfg, *args, "--json", env=env)
        return path, code, out, err

    for path, cmd in found.items():  # one at a time: each runs the service it needs in its own process
        if path in ("pending", "status", "import", "gc", "lab"):  # no run id: import, gc, lab below, the others
            continue                                                # unreachable
        path, code, out, err = await call(path, cmd)
        doc = _one_json_error(out)
        assert (code, doc["exit"], doc["code"]) == (1, 1, "run_not_found"), (path, out, err)
        assert UNKNOWN in doc["reason"] and err.strip().splitlines()[-1].startswith("error: run_not_found"), path

    code, out, err = await reel(cfg, "import", str(tmp_path / "missing.tar"), "--json", env=env)
    doc = _one_json_error(out)
    assert (code, doc["code"]) == (1, "archive_refused") and "is not a Reel archive" in doc["reason"], (out, err)
    code, out, err = await reel(cfg, "lab", str(tmp_path / "missing.yaml"), "--json", env=env)
    doc = _one_json_error(out)
    assert (code, doc["code"]) == (1, "lab_spec") and "cannot read lab SPEC" in doc["reason"], (out, err)
    code, out, err = await reel(cfg, "gc", "--json", env=env)
    assert code == 0 and json.loads(out)["dropped"] == [], (out, err)  # no policy: nothing is dropped

    async def unreachable(path: str) -> tuple[str, int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reel.services.cli", path, "--json", "--nats-url",
            "nats://127.0.0.1:1", cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, _err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return path, proc.returncode, out.decode()

    for _path, code, out in await asyncio.gather(unreachable("pending"), unreachable("status")):
        doc = _one_json_error(out)
        assert (code, doc["exit"], doc["code"]) == (1, 1, "unreachable") and "nats://127.0.0.1:1" in doc["reason"]

    for args, words in ((["cancel", "--json"], "Missing argument"), (["show", UNKNOWN, "--json", "--bogus"],
                                                                   "No such option: --bogus"),
                        (["rewind", UNKNOWN, "--json"], "exactly one of --at-step or --at-lsn")):
        code, out, err = await reel(cfg, *args, env=env)
        doc = _one_json_error(out)
        assert (code, doc["exit"], doc["code"]) == (2, 2, "usage") and words in doc["reason"], (args, out, err)


async def test_replay_batch_prints_the_stderr_lines_the_readme_describes(cfg: Config, tmp_path: Path) -> None:
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| 1 |"))
    assert "one line `error: …` on stderr" in row
    assert "one line `unreadable: …` (the file and why) per file it cannot read" in row
    summary = re.search(r"the last line is `error: N of M files unreadable \(listed above\); the others were "
                        r"replayed`", row)
    assert summary, row

    good = _write(tmp_path, _history(), name="acme__pager-42.traj")
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    missing = tmp_path / "gone.traj"
    code, out, err = await reel(cfg, "replay", str(bad), str(good), str(missing), "-q", env=env_for(tmp_path),
                                timeout_s=240)
    assert code == 1, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    unreadable = [line for line in lines if line.startswith("unreadable: ")]
    assert len(unreadable) == 2 and str(bad) in unreadable[0] and str(missing) in unreadable[1], err
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]], err  # one error line, the last
    assert lines[-1] == "error: 2 of 3 files unreadable (listed above); the others were replayed", err
    assert all(line.startswith(("unreadable: ", "error: ", "services in this process")) for line in lines), err
    assert sum("unreadable" in line for line in out.splitlines()) == 2, out  # the summary table marks them
