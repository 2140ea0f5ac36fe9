"""The real-server suite's plumbing: llama-cpp-python's server, built once in a cached venv, on a free loopback port.

* **The build** (``scripts/llama_server.py build``; minutes when cold) starts in the background as soon as the
  session's items are collected, if any ``realserver`` item is selected and the venv is not ready; the other tests
  run meanwhile, since the ``realserver`` items are moved to the end of the run. The first of them waits for the
  build (its timeout raised for that); a failed build fails it with the build log's tail. A build still running
  when the session is interrupted finishes on its own (its lock and ready marker keep the venv consistent).
* **Skipping**: with the venv missing and ``REEL_SKIP_REALSERVER=1`` set, the suite is skipped (for developers);
  under ``CI=true`` it never is: the variable then fails the suite instead.
* **The server**: ``python -m llama_cpp.server --model <gguf> --chat_format chatml-function-calling --port 0
  --n_ctx 2048`` on 127.0.0.1, ready when it prints uvicorn's ``Uvicorn running on http://127.0.0.1:PORT``
  (a rendezvous on its output, then ``GET /v1/models``). One per session (:func:`llama`), or a test's own
  (:func:`start_llama`) for a test that kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

from reel.shared.core.wire.subjects import Names
from reel.shared.runtime.config import Config
from tests.conftest import REPO

BUILD_SCRIPT = REPO / "scripts" / "llama_server.py"
BUILD_TIMEOUT_S = 1800  # the first realserver test's timeout when it may wait for a cold build (≈ 6 min on 2 cores)
SKIP_ENV = "REEL_SKIP_REALSERVER"
READY_LINE = re.compile(rb"Uvicorn running on http://([\d.]+):(\d+)")
STARTUP_TIMEOUT_S = 120
_BUILD = pytest.StashKey[subprocess.Popen[bytes]]()
LEASE_TTL_S = 10  # the server's inference takes both cores for seconds: a 2 s lease can lapse under it


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reel_llama_server_script", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LLAMA = _load_script()


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _skip_wanted() -> bool:
    return os.environ.get(SKIP_ENV) == "1"


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: only selected items count
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the ``realserver`` items to the end; start the venv's build in the background when it is needed."""
    real = [i for i in items if i.get_closest_marker("realserver") is not None]
    if not real:
        return
    items[:] = [i for i in items if i.get_closest_marker("realserver") is None] + real
    venv = LLAMA.venv_dir()
    if LLAMA.ready(venv) is not None or _skip_wanted():  # skipped, or (in CI) failed by the fixture
        return
    real[0].add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S))
    _start_build(config)


def _start_build(config: pytest.Config) -> subprocess.Popen[bytes]:
    """``scripts/llama_server.py build`` in the background, at the lowest CPU priority (the tests running
    meanwhile keep the cores; their leases and deadlines are not starved by the compiler), in its own session
    (an interrupted test run leaves it to finish); its output is in the build log."""
    build = subprocess.Popen([sys.executable, str(BUILD_SCRIPT), "build", "--nice", "19"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    config.stash[_BUILD] = build
    return build


@pytest.fixture
def cfg(nats_url: str) -> Config:
    """The suite's config: a fresh namespace, as everywhere, with a lease that outlives a busy CPU."""
    return Config(nats_url=nats_url, names=Names(f"t{uuid.uuid4().hex[:10]}"), lease_ttl_s=LEASE_TTL_S)


@pytest.fixture(scope="session")
async def llama_venv(request: pytest.FixtureRequest) -> Path:
    """The ready venv (waiting for the background build if one runs).

    Skips when the venv is missing and ``REEL_SKIP_REALSERVER=1`` (not in CI); fails when the build failed.
    """
    venv: Path = LLAMA.venv_dir()
    if LLAMA.ready(venv) is not None:
        return venv
    if _skip_wanted():
        if _in_ci():
            pytest.fail(f"CI runs the real-server suite: {SKIP_ENV}=1 cannot skip it (the venv {venv} is missing; "
                        "unset the variable so the suite builds it)")
        pytest.skip(f"llama-cpp-python's venv {venv} is not built and {SKIP_ENV}=1: build it with "
                    "`python3 scripts/llama_server.py build` (minutes) to run tests/realserver")
    build = request.config.stash.get(_BUILD, None)
    if build is None:  # the collection hook did not start one (e.g. the marker was added by hand): start it now
        build = _start_build(request.config)
    code = await asyncio.to_thread(build.wait)
    if code != 0 or LLAMA.ready(venv) is None:
        pytest.fail(f"building llama-cpp-python's venv {venv} failed (exit {code}); the last lines of "
                    f"{LLAMA.log_path(venv)}:\n{LLAMA.log_tail(venv)}")
    return venv


@dataclass
class Llama:
    """A running server: ``url`` (``http://127.0.0.1:PORT/v1``), its process, the lines it printed."""

    url: str
    host: str
    port: int
    proc: asyncio.subprocess.Process
    output: list[bytes] = field(default_factory=list)

    def models(self) -> list[str]:
        """The model ids it serves (blocking)."""
        with urllib.request.urlopen(f"{self.url}/models", timeout=10) as r:
            return [m["id"] for m in json.loads(r.read())["data"]]

    def warm_up(self) -> None:
        """One token of a completion: the server's first answer is slow (seconds: its buffers are set up then),
        so it is paid here, once, not by the first test."""
        body = json.dumps({"model": "warm-up", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
        req = urllib.request.Request(f"{self.url}/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=STARTUP_TIMEOUT_S) as r:
            assert r.status == 200, r.status

    def kill(self) -> None:
        """SIGKILL: the server dies at once, mid-answer if it is answering."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


async def _drain(proc: asyncio.subprocess.Process, output: list[bytes], ready: asyncio.Future[tuple[str, int]]) -> None:
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        output.append(line)
        found = READY_LINE.search(line)
        if found and not ready.done():
            ready.set_result((found.group(1).decode(), int(found.group(2))))
    if not ready.done():
        ready.set_exception(RuntimeError("llama_cpp.server exited before it was ready:\n"
                                         + b"".join(output[-30:]).decode(errors="replace")))


@contextlib.asynccontextmanager
async def start_llama(venv: Path) -> AsyncIterator[Llama]:
    """A server of its own on a free loopback port, killed (and reaped) on exit."""
    argv = LLAMA.server_argv(venv, 0)
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output: list[bytes] = []
    ready: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()
    drain = asyncio.create_task(_drain(proc, output, ready))
    try:
        host, port = await asyncio.wait_for(ready, STARTUP_TIMEOUT_S)
        server = Llama(url=f"http://{host}:{port}/v1", host=host, port=port, proc=proc, output=output)
        assert server.models(), "the server lists no model"
        await asyncio.to_thread(server.warm_up)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        await drain


@pytest.fixture(scope="session")
async def llama(llama_venv: Path) -> AsyncIterator[Llama]:
    """The session's server (the GGUF loaded once)."""
    async with start_llama(llama_venv) as server:
        yield server
