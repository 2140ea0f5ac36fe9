"""``reel ui`` shows the streamed tokens of the attempt in flight: an agent whose model streams (the loopback
chat-completions server, ``stream: true``) is open in the browser; its first turn's stream stops half-way (the
server holds the rest), and the page shows the fragments streamed so far inside that turn's attempt, which has no
outcome yet — forwarded from core NATS over the page's one shared ``/live`` connection. When the stream goes on
and the attempt's outcome commit lands, the streamed text gives way to the committed attempt (a delta: the page
never fetches its whole body again), and nothing streamed is left on the page once the run rests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.client import ReelClient
from tests.integration.agent_support import LOOKUP
from tests.support.chat_server import ChatServer, Pause, call, stream_deltas, streamed
from tests.ui.support import artifact, chromium, env_for, reel_ui, screenshot, until

pytestmark = pytest.mark.ui

TEXT = "Let me look that up for you now, then answer."
CALL = call("lookup", {"key": "answer"}, id="call_lookup_1")
FINAL = "The answer is 42."
CHUNKS, PAUSE_AT = 20, 10
T1 = 'div.attempt[data-step="solve:t1"][data-attempt="1"]'


def _workflow(server: ChatServer) -> WorkflowSpec:
    return parse_workflow({"name": "streamed-agent", "steps": [{
        "kind": "agent", "id": "solve", "instructions": "Use the tools, then answer.", "max_attempts": 1,
        "context": [{"id": "task", "kind": "task", "text": "What is the answer?"}],
        "model": {"adapter": "openai", "base_url": server.url, "model": "loopback-1", "timeout_s": 120,
                  "stream": True, "params": {"temperature": 0}},
        "tools": [LOOKUP]}]})


async def test_streamed_tokens_show_in_the_attempt_in_flight_until_its_outcome(  # type: ignore[no-untyped-def]
        cfg, executor: None, client: ReelClient, chat_server: ChatServer, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    gate, pause = asyncio.Event(), Pause()
    chat_server.script(streamed(TEXT, [CALL], chunks=CHUNKS, gate=gate, pause_at=PAUSE_AT, pause=pause),
                       streamed(FINAL, chunks=6))
    so_far = "".join(d["delta"].get("content") or "" for d in stream_deltas(TEXT, [CALL], CHUNKS)[:PAUSE_AT])
    assert so_far and TEXT.startswith(so_far) and so_far != TEXT
    env = env_for(tmp_path)
    async with reel_ui(cfg, env=env) as url:
        reply = await client.start(_workflow(chat_server))
        assert reply.ok and reply.run_id, reply
        run_id = reply.run_id
        with chromium(tmp_path / "profile") as b:
            await asyncio.to_thread(b.get, f"{url}/runs/{run_id}")
            await until(b, lambda d: d.find_element(By.ID, "live-tokens").get_attribute("data-subscribed") == "1",
                        "the page's live feed forwarding the run's tokens")
            await until(b, lambda d: d.find_element(By.CSS_SELECTOR, T1), "turn 1's attempt on the page")
            assert b.find_element(By.ID, "live-log").get_attribute("aria-live") == "polite"

            gate.set()  # the model starts streaming, and stops after PAUSE_AT chunks
            await asyncio.wait_for(pause.reached.wait(), 60)

            def streamed_text(d: Any) -> str:
                return str(d.find_element(By.CSS_SELECTOR, f'{T1} .tokens pre.tokens-text').text)

            await until(b, lambda d: streamed_text(d) == so_far, "the tokens streamed so far, in the attempt")
            attempt = b.find_element(By.CSS_SELECTOR, T1)
            assert attempt.get_attribute("data-status") == "dispatched"  # no outcome yet: the stream is all there is
            assert attempt.get_attribute("data-outcome-lsn") == ""
            block = attempt.find_element(By.CSS_SELECTOR, ".tokens")
            assert block.get_attribute("data-done") is None and block.get_attribute("data-gap") is None
            screenshot(b, artifact(tmp_path, "ui-streamed-tokens.png"))

            pause.resume.set()  # the rest of the stream, then the attempt's outcome commit
            await until(b, lambda d: d.find_element(By.CSS_SELECTOR, T1).get_attribute("data-status") == "succeeded",
                        "turn 1's outcome on the page")
            assert not b.find_elements(By.CSS_SELECTOR, f"{T1} .tokens"), "the streamed text gave way to the outcome"
            rested = await client.wait_for(run_id, ("verifying", "completed"), timeout_s=60)
            head = str(rested.head_lsn)
            await until(b, lambda d: d.find_element(By.ID, "run-head").get_attribute("data-head") == head,
                        "the page at the run's head")
            assert b.find_element(By.CSS_SELECTOR, 'div.attempt[data-step="solve:t2"][data-attempt="1"]'
                                  ).get_attribute("data-status") == "succeeded"
            assert not b.find_elements(By.CSS_SELECTOR, ".tokens"), "nothing streamed is left once the run rests"
            fetched = b.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
            assert not any(u.split("?")[0].endswith("/body") for u in fetched), fetched  # deltas only
