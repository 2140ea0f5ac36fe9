"""``reel run`` interrupted (Ctrl-C) after its start command is queued but before it is answered names the run that
command makes: nothing is lost, and the user knows what will start and how to stop it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import nats.js.errors
from nats.aio.msg import Msg

from reel.services.cli.embed import SERVICES
from reel.shared.core.run.ids import run_id_for_key
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.integration.test_cli import REPO
from tests.support.sigint import as_at_a_terminal


async def test_ctrl_c_before_the_start_is_answered_names_the_queued_run(infra: Infra, cfg: Config) -> None:
    async def discovery(msg: Msg) -> None:  # services that answer discovery but take no command: `reel up` starting
        for name in SERVICES:
            await infra.nc.publish(msg.reply, json.dumps({
                "type": "io.nats.micro.v1.ping_response", "name": f"reel-{name}", "id": f"silent-{name}",
                "version": "0.0.0", "metadata": {"namespace": cfg.names.namespace}}).encode())

    sub = await infra.nc.subscribe("$SRV.PING", cb=discovery)
    stream = cfg.names.commands_stream
    before = (await infra.js.stream_info(stream)).state.last_seq
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", "run", "examples/hello.yaml",
        "--nats-url", cfg.nats_url, "--namespace", cfg.names.namespace, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": "200"},
        preexec_fn=as_at_a_terminal)
    try:
        async def queued() -> str:  # the start command in the stream: its message id derives the run id
            while True:
                try:
                    msg = await infra.js.get_msg(stream, before + 1)
                    return run_id_for_key(f"cmd:{(msg.headers or {})['Nats-Msg-Id']}")
                except nats.js.errors.NotFoundError:
                    await asyncio.sleep(0.05)
        run_id = await asyncio.wait_for(queued(), 60)
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
        await sub.unsubscribe()
    text = err.decode()
    assert proc.returncode == 130, (out, text)
    assert f"interrupted before the start was answered: if it was queued, run {run_id} starts when an executor " \
           f"runs" in text, text
    assert f"`reel cancel {run_id}` stops it" in text and "Traceback" not in text, text
    assert text.count("interrupted") == 1, text  # no second bare "interrupted" line
