"""A NATS / JetStream error that reaches a command ends as one ``error:`` line (and with ``--json`` one JSON error
object), never a traceback: the 503 a client's JS API prefix gets from a server without Reel's accounts (no
``reel up --auth``) names the server and what to start."""

from __future__ import annotations

import json
from pathlib import Path

import nats.js.errors
import pytest
import typer

from reel.services.cli.console import run_async
from reel.shared.runtime.config import Config
from tests.ui.support import env_for, reel


async def test_a_503_is_one_line_naming_the_server_and_what_to_start(cfg: Config, tmp_path: Path) -> None:
    env = {**env_for(tmp_path), "REEL_NATS_JS_API_PREFIX": "JS.NOBODY.API"}  # as client.env sets, no auth server
    for args in (["ls"], ["show", "r-00000000000000000000", "--json"]):
        code, out, err = await reel(cfg, *args, env=env)
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("services in")]
        assert code == 1 and "Traceback" not in err and len(lines) == 1, (args, code, err)
        assert lines[0].startswith("error: unavailable: no Reel services answer at " + cfg.nats_url), err
        assert "reel up --auth" in lines[0], err
        if "--json" in args:
            doc = json.loads(out)
            assert doc == {"ok": False, "code": "unavailable", "reason": doc["reason"], "exit": 1}, out
            assert cfg.nats_url in doc["reason"], out


def test_a_nats_error_outside_a_session_is_one_line_too(capsys: pytest.CaptureFixture[str]) -> None:
    async def body() -> int:
        raise nats.js.errors.NoStreamResponseError  # as a JetStream call outside `session` would

    with pytest.raises(typer.Exit) as exited:
        run_async(body(), json_out=True)
    out, err = capsys.readouterr()
    assert exited.value.exit_code == 1 and err.strip() == "error: NATS: NoStreamResponseError: nats: no response " \
        "from stream", err
    assert json.loads(out)["code"] == "nats_error", out
