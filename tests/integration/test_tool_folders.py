"""``reel run FILE`` finds the workflow's ``python:`` tools from the file's folder up to the project root, then in
the executor's working folder — started elsewhere, as a user does — and says where it looked when it cannot
(the ``reel`` command in a real process on the test server; its executor runs in that process, in another folder).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import sys
from pathlib import Path

import reel
from reel.shared.application.workflows import WorkflowCache
from reel.shared.core.run.views import build_episode_view
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.runtime.config import Config

WORKFLOW = """\
name: tool-folders
steps:
  - kind: agent
    id: a
    instructions: Use both tools.
    context: [{{id: task, kind: task, text: "Call them."}}]
    model:
      adapter: scripted
      turns:
        - tool_calls: [{{name: beside, arguments: {{}}}}, {{name: root, arguments: {{}}}}]
        - text: done
    tools:
      - {{name: beside, python: "{beside}:fn", retry_safe: true}}
      - {{name: root, python: "{root}:fn", retry_safe: true}}
verifiers:
  - {{type: output_regex, name: done, pattern: done}}
"""


async def _reel(cfg: Config, cwd: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", *args, "--nats-url", cfg.nats_url,
        "--namespace", cfg.names.namespace, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "400"})
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _project(tmp_path: Path, beside: str, root: str) -> tuple[Path, Path, Path]:
    """``proj`` (a pyproject.toml, the package ``root``), ``proj/flows`` (the workflow, the module ``beside``),
    and a working folder outside the project."""
    proj, flows, elsewhere = tmp_path / "proj", tmp_path / "proj" / "flows", tmp_path / "elsewhere"
    (proj / root).mkdir(parents=True)
    flows.mkdir()
    elsewhere.mkdir()
    (proj / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    (proj / root / "__init__.py").write_text("def fn() -> str:\n    return 'from the root'\n")
    (flows / f"{beside}.py").write_text("def fn() -> str:\n    return 'from beside the workflow'\n")
    (flows / "wf.yaml").write_text(WORKFLOW.format(beside=beside, root=root))
    return proj, flows, elsewhere


async def test_reel_run_from_another_folder_finds_the_tools_beside_the_workflow_and_at_the_project_root(
        cfg: Config, event_log: JetStreamEventLog, blobs: JetStreamBlobStore, tmp_path: Path) -> None:
    s = secrets.token_hex(4)
    _, flows, elsewhere = _project(tmp_path, f"beside_{s}", f"root_{s}")
    code, out, err = await _reel(cfg, elsewhere, "run", str(flows / "wf.yaml"), "-q")
    assert code == 0 and "outcome passed" in out, (out, err)
    match = re.search(r"run (r-[0-9a-f]{20})", out)
    assert match, out
    state = await event_log.load(match.group(1))
    assert state.tool_source_dir == str(flows)  # recorded on the run: any executor that drives it looks there
    calls = [v for v in build_episode_view(state).steps if v.tool_name]
    assert sorted(str(v.tool_name) for v in calls) == ["beside", "root"] and not any(v.is_error for v in calls)
    tools = await WorkflowCache(blobs).python_tools(state.workflow_ref, state.tool_source_dir)  # a fresh executor's
    assert sorted(fn() for fn in tools.values()) == ["from beside the workflow", "from the root"]


async def test_a_tool_that_is_nowhere_is_refused_naming_the_folders_searched(cfg: Config, tmp_path: Path) -> None:
    s = secrets.token_hex(4)
    proj, flows, elsewhere = _project(tmp_path, f"beside_{s}", f"root_{s}")
    (flows / "wf.yaml").write_text(WORKFLOW.format(beside=f"beside_{s}", root=f"nowhere_{s}"))
    code, out, err = await _reel(cfg, elsewhere, "run", str(flows / "wf.yaml"), "-q")
    assert code == 1, (out, err)
    said = " ".join(err.split())
    assert f"No module named 'nowhere_{s}' (looked in {flows}, {proj}, {elsewhere})" in said, err
    assert "(at `$.steps[0].tools[1].python`)" in said, err


async def test_the_python_api_starting_a_workflow_file_looks_beside_it_too(tmp_path: Path) -> None:
    s = secrets.token_hex(4)
    _, flows, _ = _project(tmp_path, f"beside_{s}", f"root_{s}")
    async with reel.local() as client:
        handle = await client.start(flows / "wf.yaml")
        result = await handle.result(timeout_s=60)
        assert result.outcome == "passed", result
        assert (await handle.state()).tool_source_dir == str(flows)
