"""A client that is not Reel's (examples/plain_client.py: plain nats-py) starts a run and reads its verdicts.

It runs as a subprocess against the test server while the real executor and
verifier services run; what it prints is checked against the published JSON
Schemas and against the run's own log.
"""

from __future__ import annotations

import ast
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema

from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.runtime.config import Config
from tests.conftest import REPO

CLIENT = REPO / "examples" / "plain_client.py"


def _schema(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((REPO / "docs" / "schemas" / name).read_text()))


async def _run_client(cfg: Config, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CLIENT), "--url", cfg.nats_url, "--namespace", cfg.names.namespace, "--timeout", "30",
        *args, cwd=CLIENT.parent, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, [json.loads(line) for line in out.decode().splitlines()], err.decode()


def test_plain_client_imports_nothing_of_reel() -> None:
    tree = ast.parse(CLIENT.read_text())
    modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert modules - set(sys.stdlib_module_names) == {"nats"}, modules


async def test_plain_client_starts_a_run_and_reads_its_verdicts(
    executor: None, verifier: None, cfg: Config, event_log: JetStreamEventLog
) -> None:
    code, lines, err = await _run_client(cfg)
    assert code == 0, (lines, err)
    reply, verdicts = lines[0]["reply"], [line["verdict"] for line in lines[1:]]
    _schema("reply.json").validate(reply)
    assert reply["ok"] and reply["created"]
    for v in verdicts:
        _schema("verdict.json").validate(v)
    assert [(v["verifier"], v["status"]) for v in verdicts] == [("says-hello", "pass"), ("is-greeting", "pass")]
    state = await event_log.load(reply["run_id"])
    assert state.status == "completed" and state.outcome == "passed"
    assert {(v.verifier, v.snapshot_lsn) for v in state.verdicts} == {
        (v["verifier"], v["snapshot_lsn"]) for v in verdicts}


async def test_plain_client_reports_a_failing_verdict(
    executor: None, verifier: None, cfg: Config, tmp_path: Path
) -> None:
    workflow = {"name": "plain-fail",
                "steps": [{"kind": "tool", "id": "say", "tool": {"type": "recorded", "output": "goodbye"}}],
                "verifiers": [{"type": "output_regex", "pattern": "hello"}]}
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(workflow))
    code, lines, err = await _run_client(cfg, "--workflow", str(path))
    assert code == 1, (lines, err)
    assert [(line["verdict"]["verifier"], line["verdict"]["status"]) for line in lines[1:]] == [
        ("output_regex", "fail")]
