"""An idempotency key reused with another workflow is refused (Stripe-style: one key, one request): the executor
replies ``idempotency_conflict`` naming the key and both workflows, the key's run is untouched; ``reel run`` prints
one line and exits 1. The same workflow under the same key still answers with its run (``created: false``)."""

from __future__ import annotations

import re
from pathlib import Path

from reel.shared.core.run.ids import run_id_for_key
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.runtime.config import Config
from tests.integration.scenarios import wait_state
from tests.ui.support import env_for, reel


def _workflow(name: str) -> dict[str, object]:
    return {"name": name, "steps": [{"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": name}}]}


async def test_a_key_reused_with_another_workflow_is_refused_and_its_run_untouched(
        executor: None, client: ReelClient, event_log: JetStreamEventLog) -> None:
    first = await client.start(parse_workflow(_workflow("first")), idempotency_key="k1", timeout_s=30)
    assert first.ok and first.created and first.run_id == run_id_for_key("k1"), first
    before = await wait_state(event_log, first.run_id, lambda s: s.status == "verifying", what="the run to end")
    other = await client.start(parse_workflow(_workflow("second")), idempotency_key="k1", timeout_s=30)
    assert not other.ok and other.error is not None, other
    assert other.error.code == "idempotency_conflict" and not other.error.retryable, other
    assert all(s in other.error.message for s in ("'k1'", "'first'", "'second'")), other.error.message
    after = await event_log.read(first.run_id)
    assert after[-1][0] == before.head_lsn and len(after) == before.commits  # nothing committed to it
    same = await client.start(parse_workflow(_workflow("first")), idempotency_key="k1", timeout_s=30)
    assert (same.ok, same.run_id, same.created) == (True, first.run_id, False), same


async def test_reel_run_with_a_reused_key_prints_one_line_and_exits_1(cfg: Config, tmp_path: Path) -> None:
    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "run", "examples/hello.yaml", "--key", "k1", "-q", env=env)
    assert code == 0, (out, err)
    code, out, err = await reel(cfg, "run", "examples/agent/fix_typo.yaml", "--key", "k1", "-q", env=env)
    assert code == 1, (code, out, err)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "idempotency_conflict" in errors[0] and "'k1'" in errors[0], err
    assert "already existed" not in out, out
    code, out, err = await reel(cfg, "run", "examples/hello.yaml", "--key", "k1", "-q", env=env)
    assert code == 0 and re.search(r"run r-[0-9a-f]{20} already existed", out), (code, out, err)
