"""What the commands print, as a user reads it on a real server: ``reel run``'s end timeline is ``reel show``'s (a
``command`` tool's argv, not ``{}``), ``reel ls`` never cuts a run id (``COLUMNS=60``), ``reel status`` names the
server it read and says why a table is empty."""

from __future__ import annotations

import json
import re
from pathlib import Path

from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.runtime.config import Config
from tests.integration.scenarios import wait_state
from tests.ui.support import env_for, reel
from tests.unit.test_trajectories_swe1 import _history, _write

RUN_ID = re.compile(r"r-[0-9a-f]{20}")


def _timeline(text: str, run_id: str) -> str:
    """The timeline ``print_timeline`` printed: from its header line to the end."""
    start = text.index(f"run {run_id}  workflow ")
    return text[start:]


async def test_reel_run_ends_with_the_timeline_reel_show_prints(cfg: Config, tmp_path: Path) -> None:
    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "run", "examples/agent/fix_typo.yaml", "-q", env=env)
    assert code == 0, (out, err)
    run_id = RUN_ID.search(out).group(0)  # type: ignore[union-attr]
    code, shown, err = await reel(cfg, "show", run_id, env=env)
    assert code == 0, err
    timeline, sep, changes = shown.partition("workspace changes on branch main:")  # show adds the files' diffs
    assert sep and "fix:t2:c0#1  modified wordfreq/__init__.py" in changes, shown
    assert _timeline(out, run_id) == _timeline(timeline, run_id)  # one rendering for both
    lines = shown.splitlines()
    rows = [i for i, line in enumerate(lines) if "tool run_tests" in line]
    assert len(rows) == 2, shown
    for i in rows:
        assert _cell(lines, i, 4) == "python3 examples/agent/run_tests.py <<< {}", shown  # the argv, then its stdin


def _cell(lines: list[str], row: int, col: int) -> str:
    """Column ``col`` of the table row starting at ``lines[row]``, its wrapped lines joined by spaces."""
    parts = []
    for line in lines[row:]:
        cells = [c.strip() for c in line.strip("│").split("│")]
        if line is not lines[row] and (not line.startswith("│") or cells[0]):
            break  # the next row (or the table's end)
        parts.append(cells[col])
    return " ".join(p for p in parts if p)


async def test_reel_ls_prints_run_ids_whole_on_a_narrow_terminal(cfg: Config, executor: None, client: ReelClient,
                                                                 event_log: JetStreamEventLog, tmp_path: Path) -> None:
    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "ls", env={**env, "COLUMNS": "60"})
    assert code == 0 and " ".join(out.split()) == ("no runs yet in this namespace — start one with `reel run FILE` "
                                                   "(or `reel replay FILE…`)"), (out, err)
    ids = []
    for i in range(2):
        reply = await client.start(parse_workflow({"name": f"narrow-{i}-with-a-long-workflow-name", "steps": [
            {"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": "x"}}]}))
        assert reply.ok and reply.run_id, reply
        ids.append(reply.run_id)
        await wait_state(event_log, reply.run_id, lambda s: s.status == "verifying", what="the run to end its steps")
    for columns in ("60", "80", "200"):
        code, out, err = await reel(cfg, "ls", env={**env, "COLUMNS": columns})
        assert code == 0, err
        lines = out.splitlines()
        assert all(len(line) <= int(columns) for line in lines), out
        for run_id in ids:  # whole, on one line (a user copies it from there)
            assert sum(run_id in line for line in lines) == 1, (columns, out)
        assert RUN_ID.findall(out) == ids[::-1], out  # newest first, nothing else that looks like a cut id
        assert sum("verifying" in line for line in lines) == 2, out  # its status, beside it or in its column


async def test_reel_status_names_its_server_and_explains_empty_tables(cfg: Config, tmp_path: Path) -> None:
    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "status", env=env)
    assert code == 3, err  # no service answers: the report, and the exit code a script can test
    lines = out.splitlines()
    assert lines[0] == f"server {cfg.nats_url} (from --nats-url / $NATS_URL), namespace {cfg.names.namespace!r}"
    text = " ".join(out.split())
    assert "no executors running — start one with `reel serve executor` (or `reel up`)" in text, out
    assert "no service answers discovery: none is running — start them all with `reel up`" in text, out
    assert "no service consumer yet" in text, out
    assert "┏" not in out, "an empty table is a sentence, not a header with no rows"
    code, js, err = await reel(cfg, "status", "--json", env=env)
    assert code == 3, err
    doc = json.loads(js)
    assert doc["server"] == {"url": cfg.nats_url, "origin": "--nats-url"}
    assert doc["services"] == doc["leases"] == []


async def test_reel_show_keeps_statuses_and_numbers_whole_at_80_120_and_piped(cfg: Config, tmp_path: Path) -> None:
    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "run", "examples/agent/fix_typo.yaml", "-q", env=env)
    assert code == 0, (out, err)
    run_id = RUN_ID.search(out).group(0)  # type: ignore[union-attr]
    without = {k: v for k, v in env.items() if k != "COLUMNS"}  # piped, no COLUMNS: the CLI's wide console
    for columns, shown_env in (("80", {**env, "COLUMNS": "80"}), ("120", {**env, "COLUMNS": "120"}),
                               ("piped", without)):
        code, shown, err = await reel(cfg, "show", run_id, env=shown_env)
        assert code == 0, err
        lines = _timeline(shown, run_id).splitlines()
        if columns != "piped":
            assert all(len(line) <= int(columns) for line in lines), (columns, shown)
        assert sum(run_id in line for line in lines) >= 1, (columns, shown)  # the header's id, whole
        head = next(i for i, line in enumerate(lines) if line.startswith("┃ step"))
        header = [c.strip() for c in lines[head].strip("┃").split("┃")]
        assert header[1:3] == ["#", "status"] or header[2:4] == ["#", "status"], (columns, header)
        status_col = header.index("status")
        rows = [i for i, line in enumerate(lines) if "fix:t" in line and line.startswith("│ fix")]
        statuses = [_cell(lines, i, status_col) for i in rows]
        assert len(rows) == 8 and set(statuses) == {"succeeded", "failed"}, (columns, statuses, shown)
        assert statuses.count("failed") == 1 and [_cell(lines, i, header.index("#")) for i in rows] == ["1"] * 8


async def test_reel_replay_summary_keeps_run_ids_whole_at_80_columns(cfg: Config, tmp_path: Path) -> None:
    good = _write(tmp_path, _history(), name="acme__pager-42-with-a-long-instance-name.traj")
    env = {**env_for(tmp_path), "COLUMNS": "80"}
    code, out, err = await reel(cfg, "replay", str(good), "--no-timelines", env=env, timeout_s=240)
    assert code in (0, 3), (out, err)
    summary = out[out.index("replayed runs"):].splitlines()
    ids = RUN_ID.findall("\n".join(summary))
    assert len(ids) == 1 and all(len(line) <= 80 for line in summary), out  # one id, whole, on one line
