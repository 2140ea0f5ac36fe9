"""``reel chaos`` as a user runs it: the ``reel`` command in a real process against the session's real nats-server,
killing real executor processes (SIGKILL at crash points) and counting their tools' side effects.

* a deliberately non-idempotent command tool (examples/chaos/append.yaml: each run appends a line) is named —
  it ran twice after a kill between its run and its outcome — and the command exits 1; the ledger the
  counts come from agrees line for line with what the tool itself wrote; its retry-safe neighbour's
  repeats are accepted; the namespace the session made on this server is gone afterwards;
* the agent example (examples/agent/fix_typo.yaml) prints its per-tool table (the crash points of turn 2).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import nats
import pytest

from reel.shared.proc.ledger import read as read_ledger

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


async def reel(*args: str, env: dict[str, str], timeout_s: float = 280) -> tuple[int, str, str]:
    """``python -m reel.services.cli ARGS`` from the repository root; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.cli", *args, cwd=REPO, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REEL_NAMESPACE")}
    return {**env, "REEL_HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp"), "COLUMNS": "240"}


def _row(out: str, tool: str) -> str:
    """The table's line(s) of ``tool``, joined (a long cell folds onto the next lines)."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if re.match(rf"│ {re.escape(tool)} ", ln))
    end = next((i for i in range(start + 1, len(lines)) if not re.match(r"│\s+│", lines[i])), len(lines))
    return " ".join(lines[start:end])


async def test_a_non_idempotent_command_tool_that_ran_twice_is_named(nats_url: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    code, out, err = await reel("chaos", "examples/chaos/append.yaml", "--only", "append", "--nats-url", nats_url,
                                "--workdir", str(work), env=_env(tmp_path))
    assert code == 1, out + err
    assert "point 4 of 4" in err, err
    append = _row(out, "append (command)")
    assert "RAN TWICE" in append and "append:1:after_run" in append, out
    assert "append:1:after_outcome" not in append and "append:1:before_intent" not in append, out
    assert "append:1:after_output" not in append, out  # its stored output is adopted, not run again
    assert "repeated (retry-safe)" in _row(out, "note (command)"), out
    assert "NOT exactly-once: append" in out and "ended as the unkilled run did" in out, out
    assert "append: make the command dedupe on $REEL_IDEMPOTENCY_KEY" in out, out
    assert "note: make the command" not in out, out

    effects = [e for e in read_ledger(work / "side-effects.jsonl") if e.step_id == "append"]
    written = [ln for f in (tmp_path / "tmp" / "reel-chaos-append").iterdir() for ln in f.read_text().splitlines()]
    assert len(effects) == len(written) > 6  # 2 references + 4 killed runs, and the repeats
    assert sorted(f"{e.step_id}#{e.attempt}" for e in effects) == sorted(written)
    assert all(e.kind == "process" and e.pid > 0 for e in effects)

    nc = await nats.connect(nats_url)
    try:
        names = [s.config.name for s in await nc.jetstream().streams_info()]
    finally:
        await nc.close()
    namespace = re.search(r"namespace (chaos-[0-9a-f]+)", err)
    assert namespace is not None, err
    assert not [n for n in names if namespace.group(1).upper().replace("-", "_") in (n or "").upper()], names


async def test_the_agent_example_prints_its_per_tool_table(nats_url: str, tmp_path: Path) -> None:
    code, out, err = await reel("chaos", "examples/agent/fix_typo.yaml", "--only", "fix:t2", "--nats-url", nats_url,
                                env=_env(tmp_path))
    assert "point 7 of 7" in err, err
    for tool in ("read_file (python)", "write_file (python)", "run_tests (command)"):
        assert "retry-safe" in _row(out, tool), out
    assert "RAN TWICE" not in out, out
    assert "write_file" in _row(out, "write_file (python)") and "fix:t2:c0:1:after_run" in _row(
        out, "write_file (python)"), out  # killed after the write, before its result was stored: written again
    assert "7 killed runs" in out, out
    assert code in (0, 1) and (code == 0) == out.strip().splitlines()[-1].startswith("ok"), out


NOT_RETRY_SAFE = """
name: chaos-agent-poke
steps:
  - kind: agent
    id: w
    max_turns: 3
    context: [{id: task, kind: task, text: "poke once"}]
    model:
      adapter: scripted
      turns:
        - {text: poking, tool_calls: [{name: poke, arguments: {}}]}
        - {text: done}
    tools:
      - {name: poke, command: [sh, -c, "echo poked"], parameters: {type: object, properties: {}}}
"""


async def test_a_non_retry_safe_agent_tool_is_not_rerun_and_the_changed_end_state_is_reported(
        nats_url: str, tmp_path: Path) -> None:
    wf = tmp_path / "poke.yaml"
    wf.write_text(NOT_RETRY_SAFE)
    code, out, err = await reel("chaos", str(wf), "--only", "w:t1:c0:1:after_run", "--nats-url", nats_url,
                                env=_env(tmp_path))
    assert code == 1 and "point 1 of 1: w:t1:c0:1:after_run: killed" in err, out + err
    poke = _row(out, "poke (command)")
    assert "exactly once" in poke and "│ no " in poke, out  # recorded outcome_unknown, never run again
    assert "end state differs after a kill at w:t1:c0:1:after_run" in out and "outcome_unknown" in out, out
