"""Operator-facing log lines (docs/operations.md "Logs"): every attempt line names its executor; a dropped
NATS node costs structured lines (``nats.disconnected`` / ``nats.reconnected``), never a plain traceback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from reel.services.executor.app import serve as executor_serve
from reel.shared.core.workflow.spec import load_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.embedded import embedded_server
from reel.shared.nats.infra import Infra, connect
from reel.shared.runtime.config import Config
from tests.conftest import REPO, running


@contextlib.contextmanager
def captured(until: str | None = None) -> Iterator[tuple[list[dict[str, Any]], asyncio.Event]]:
    """The structlog lines of the block (info level, bound context merged), and an event set once a line
    named ``until`` arrives."""
    saved = structlog.get_config()
    lines: list[dict[str, Any]] = []
    seen = asyncio.Event()

    def keep(_: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        lines.append({**event_dict, "log_level": method})
        if event_dict.get("event") == until:
            seen.set()
        raise structlog.DropEvent

    structlog.configure(processors=[structlog.contextvars.merge_contextvars, keep],
                        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        yield lines, seen
    finally:
        structlog.configure(**saved)


async def test_every_attempt_line_carries_the_executor_id(infra: Infra, cfg: Config, client: ReelClient) -> None:
    spec = load_workflow(REPO / "examples" / "hello.yaml")
    with captured() as (lines, _):
        async with running(executor_serve, infra, cfg):
            reply = await client.start(spec)
            assert reply.ok, reply
            state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=60)
    attempts = [x for x in lines if str(x.get("event", "")).startswith("attempt.")]
    assert {x["event"] for x in attempts} >= {"attempt.succeeded", "attempt.failed"}  # summarize fails once
    ids = {x.get("executor_id") for x in attempts}
    assert ids == {state.executor_id} and state.executor_id is not None and str(state.executor_id).startswith("x-")


async def test_a_dropped_server_is_logged_as_structured_lines(cfg: Config, tmp_path: Path,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "js"
    async with embedded_server(store_dir=str(store)) as srv:
        port = srv.port
        nc = await connect(Config(nats_url=srv.url, names=cfg.names), name="reel-tests-drop")
        with captured(until="nats.disconnected") as (lines, disconnected):
            srv.process.terminate()
            await asyncio.wait_for(disconnected.wait(), 30)
    try:
        with captured(until="nats.reconnected") as (lines2, reconnected):
            async with embedded_server(port=port, store_dir=str(store)):
                await asyncio.wait_for(reconnected.wait(), 30)
                again = next(x for x in lines2 if x["event"] == "nats.reconnected")
                assert again["connection"] == "reel-tests-drop" and again["server"].endswith(f":{port}")
    finally:
        await nc.close()
    drop = next(x for x in lines if x["event"] == "nats.disconnected")
    assert drop["connection"] == "reel-tests-drop" and drop["log_level"] == "warning"
    err = capfd.readouterr().err
    assert "Traceback" not in err and "nats: encountered error" not in err, err


def test_nats_py_own_logger_lines_become_one_structured_line(capfd: pytest.CaptureFixture[str]) -> None:
    from reel.shared.nats.access import bridge_client_logger

    bridge_client_logger()
    bridge_client_logger()  # idempotent: one handler
    with captured() as (lines, _):
        try:
            raise ConnectionResetError("node went away")
        except ConnectionResetError as exc:
            logging.getLogger("nats.aio.client").error("nats: encountered error", exc_info=exc)
    assert [{k: v for k, v in x.items() if k != "service"} for x in lines] == [
        {"event": "nats.client_error", "message": "nats: encountered error",
         "error": "ConnectionResetError: node went away", "log_level": "error"}]
    assert "Traceback" not in capfd.readouterr().err
