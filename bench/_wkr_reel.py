"""Reel as a user runs it, for bench/w_kr.py: an embedded nats-server, the executor and the verifier as
separate processes (``python -m reel.services.<name>``), runs started on ``reel.cmd.start`` (not part of Reel).

A run is finished when its ``run_completed`` commit is published (the verifier writes it after the
verdict): a core subscription on ``reel.ev.*`` (no JetStream consumer) sees it. Step starts are the
server's stored timestamps (ns) of the commits that carry each step's ``attempt_dispatched`` intent,
read back after the run: an intent is committed right before the step's body runs, so the interval
between two of them is what the peers time between two step-body starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from nats.aio.msg import Msg
from nats.js import api as jsapi

from reel.shared.core.run.events import AttemptDispatched, decode_commit
from reel.shared.core.run.ids import run_id_for_key
from reel.shared.core.wire.subjects import Names
from reel.shared.core.workflow.agentspec import AgentToolSpec
from reel.shared.core.workflow.spec import (
    AgentStep,
    ContextItemSpec,
    ModelSpec,
    ModelStep,
    ScriptedToolCall,
    ScriptedTurn,
    Step,
    ToolSpec,
    ToolStep,
    VerifierSpec,
    WorkflowSpec,
)
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.embedded import EmbeddedServer, embedded_server
from reel.shared.nats.infra import Infra, connect, ensure_infra
from reel.shared.runtime.config import DEFAULT_PARTITIONS, Config

REPO = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 120.0
PROFILE_ENV = "WKR_PROFILE_DIR"


def make_result(run: int, i: int, t_ns: int = 0) -> dict[str, object]:
    """The peers' ~200-byte step result (../shared/peers/README.md), ``t`` fixed when the workflow is built."""
    return {"run": run, "step": i, "t": t_ns or time.time_ns(), "model": "stub-model", "finish_reason": "stop",
            "usage": {"in": 123, "out": 45}, "content": "x" * 57}


VERIFIER = VerifierSpec(type="output_regex", name="done", pattern="stub-model")


def tool_workflow(run: int, k: int) -> WorkflowSpec:
    """K ``recorded`` tool steps, each returning its own 200-byte dict (JSON), and one regex verifier."""
    steps: list[Step] = [ToolStep(id=f"s{i}", tool=ToolSpec(type="recorded", output=json.dumps(make_result(run, i))))
                         for i in range(k)]
    return WorkflowSpec(name=f"wkr-tool-{run}", steps=tuple(steps), verifiers=(VERIFIER,))


def model_workflow(run: int, k: int) -> WorkflowSpec:
    """K ``scripted`` model steps (a distinct one-line prompt each), each answering its 200-byte dict."""
    steps: list[Step] = [ModelStep(id=f"s{i}", instructions=f"run {run} step {i}",
                                   model=ModelSpec(adapter="scripted", outputs=(json.dumps(make_result(run, i)),)))
                         for i in range(k)]
    return WorkflowSpec(name=f"wkr-model-{run}", steps=tuple(steps), verifiers=(VERIFIER,))


NOOP_TOOL = AgentToolSpec(name="noop", python="bench._wkr_tools:noop", retry_safe=True, parameters={
    "type": "object", "properties": {"run": {"type": "integer"}, "step": {"type": "integer"}},
    "required": ["run", "step"], "additionalProperties": False})


def agent_workflow(run: int, k: int) -> WorkflowSpec:
    """One agent step of K+1 scripted turns: turns 1…K each call the no-op Python tool once (bench/_wkr_tools.py),
    turn K+1 answers. A "step" is one turn with its tool call."""
    call = [(ScriptedToolCall(name="noop", arguments={"run": run, "step": i}),) for i in range(k)]
    turns = [ScriptedTurn(text=f"turn {i}", tool_calls=call[i]) for i in range(k)]
    turns.append(ScriptedTurn(text=json.dumps(make_result(run, k))))
    agent = AgentStep(id="a", max_turns=k + 1, instructions=f"run {run}", tools=(NOOP_TOOL,),
                      context=(ContextItemSpec(id="task", kind="task", text=f"call noop {k} times (run {run})"),),
                      model=ModelSpec(adapter="scripted", turns=tuple(turns)))
    return WorkflowSpec(name=f"wkr-agent-{run}", steps=(agent,), verifiers=(VERIFIER,))


WORKFLOWS: dict[str, Callable[[int, int], WorkflowSpec]] = {"tool": tool_workflow, "model": model_workflow,
                                                            "agent": agent_workflow}
TURN = re.compile(r":t[0-9]+$")


def proc_cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has run so far: the sum of its threads' ``schedstat`` (ns); NaN off Linux."""
    total = 0
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"{task.path}/schedstat") as f:
                total += int(f.read().split()[0])
    except OSError:
        return float("nan")
    return total / 1e9


def stored_ns(msg: Msg) -> int:
    """The stream's stored timestamp (ns) from a JetStream delivery's ack subject (v1 and v2 layouts)."""
    tokens = (msg.reply or "").split(".")
    return int(tokens[7] if len(tokens) == 9 else tokens[9])


@dataclass
class Stack:
    """One server with Reel's services on it (``sync``: ``default`` or ``always``)."""

    sync: str
    srv: EmbeddedServer
    cfg: Config
    infra: Infra
    client: ReelClient
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    waiting: dict[str, asyncio.Future[int]] = field(default_factory=dict)

    def pids(self) -> dict[str, int]:
        """Process ids by role: the services, ``nats-server`` and ``driver`` (this benchmark)."""
        return {**{n: p.pid for n, p in self.procs.items()}, "nats-server": self.srv.process.pid,
                "driver": os.getpid()}

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of every process of :meth:`pids`."""
        return {role: proc_cpu_s(pid) for role, pid in self.pids().items()}

    async def seqs(self) -> dict[str, int]:
        """Last sequence of every stream (messages stored so far), plus ``verifier deliveries``."""
        out = {s.config.name or "?": s.state.last_seq for s in await self.infra.js.streams_info()}
        names = self.cfg.names
        for stream in (names.events_stream, names.commands_stream):
            with contextlib.suppress(Exception):
                info = await self.infra.js.consumer_info(stream, names.consumer("verifier"))
                out["verifier deliveries"] = info.delivered.consumer_seq
        return out

    async def on_commit(self, msg: Msg) -> None:
        """Core-subscription callback on ``reel.ev.*``: resolve the run's waiter at its ``run_completed``."""
        if b'"run_completed"' in msg.data:
            fut = self.waiting.pop(msg.subject.rsplit(".", 1)[-1], None)
            if fut is not None and not fut.done():
                fut.set_result(time.perf_counter_ns())

    async def run(self, spec: WorkflowSpec, key: str, timeout_s: float = RUN_TIMEOUT_S) -> tuple[str, int, int]:
        """Start ``spec`` with idempotency key ``key`` and wait for ``run_completed``: (run id, start ns, end ns)."""
        run_id = run_id_for_key(key)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.waiting[run_id] = fut
        t0 = time.perf_counter_ns()
        reply = await self.client.start(spec, idempotency_key=key, timeout_s=timeout_s)
        if not reply.ok or not reply.created:
            raise RuntimeError(f"start {key}: {reply}")
        return run_id, t0, await asyncio.wait_for(fut, timeout_s)

    async def step_starts(self, run_id: str, kind: str = "tool") -> list[int]:
        """Stored ns of the commit carrying each step's first intent, in step order (an agent's: its turns')."""
        js = self.infra.js
        seen: dict[str, int] = {}
        got: asyncio.Queue[None] = asyncio.Queue()

        async def on_msg(msg: Msg) -> None:
            for e in decode_commit(msg.data).events:
                if isinstance(e, AttemptDispatched) and (kind != "agent" or TURN.search(e.step_id)):
                    seen.setdefault(e.step_id, stored_ns(msg))
            if msg.metadata.num_pending == 0:
                got.put_nowait(None)

        sub = await js.subscribe(self.cfg.names.events(run_id), cb=on_msg, ordered_consumer=True,
                                 deliver_policy=jsapi.DeliverPolicy.ALL)
        try:
            await asyncio.wait_for(got.get(), 60)
        finally:
            await sub.unsubscribe()
        return sorted(seen.values())


SYNC_ALWAYS_CONF = "jetstream {\n  sync_interval: always\n}\n"


def _write_conf(workdir: str) -> str:
    conf = Path(workdir) / "nats-always.conf"
    conf.write_text(SYNC_ALWAYS_CONF)
    return str(conf)


def _log_file(workdir: str, name: str) -> BinaryIO:
    return (Path(workdir) / name).open("wb")


@contextlib.asynccontextmanager
async def reel_stack(sync: str, workdir: str, concurrency: int | None, executors: int = 1,
                     partitions: int | None = 0, repo: Path = REPO) -> AsyncIterator[Stack]:
    """A server (``sync_interval: always`` if ``sync == "always"``), its infra, ``executors`` executors
    (roles ``executor``, ``executor-2``, …) and one verifier. ``partitions`` ≥ 1: ``REEL_PARTITIONS``, the
    partitions dealt round-robin to the executors (``REEL_EXECUTOR_PARTITIONS``). ``concurrency`` or
    ``partitions`` ``None``: the variable is not set (the services' defaults). ``repo``: the code tree the
    services run from (another checkout of Reel: a baseline measured beside this one)."""
    conf = _write_conf(workdir) if sync == "always" else None
    store = tempfile.mkdtemp(prefix=f"js-{sync}-", dir=workdir)
    async with embedded_server(store_dir=store, config_file=conf) as srv:
        n_parts = DEFAULT_PARTITIONS if partitions is None else partitions
        cfg = Config(nats_url=srv.url, names=Names("reel", n_parts), replicas=1, storage="file")
        nc = await connect(cfg, name=f"w_kr-{sync}")
        infra = await ensure_infra(nc, cfg)
        stack = Stack(sync=sync, srv=srv, cfg=cfg, infra=infra,
                      client=ReelClient(nc, cfg, JetStreamBlobStore(nc, infra.blobs, cfg.names.blob_bucket)))
        sub = await nc.subscribe(cfg.names.events("*"), cb=stack.on_commit)
        env = {k: v for k, v in os.environ.items() if k not in ("REEL_MAX_CONCURRENT_RUNS", "REEL_PARTITIONS")}
        env |= {"NATS_URL": srv.url, "REEL_NAMESPACE": "reel", "REEL_LOG_FORMAT": "json", "PYTHONPATH": str(repo)}
        env |= {} if concurrency is None else {"REEL_MAX_CONCURRENT_RUNS": str(concurrency)}
        env |= {} if partitions is None else {"REEL_PARTITIONS": str(partitions)}
        roles = [("executor" if i == 0 else f"executor-{i + 1}", "executor") for i in range(executors)]
        roles.append(("verifier", "verifier"))
        tag = f"{sync}-{executors}" + ("" if repo == REPO else f"-{repo.name}")
        logs = [_log_file(workdir, f"{role}-{tag}.log") for role, _ in roles]
        try:
            for (role, name), log in zip(roles, logs, strict=True):
                own = {}
                if partitions and name == "executor":
                    i = len(stack.procs)
                    own = {"REEL_EXECUTOR_PARTITIONS": ",".join(str(p) for p in range(i, partitions, executors))}
                elif n_parts and name == "executor" and executors > 1:  # the default N, dealt the same way
                    i = len(stack.procs)
                    own = {"REEL_EXECUTOR_PARTITIONS": ",".join(str(p) for p in range(i, n_parts, executors))}
                prof = os.environ.get(PROFILE_ENV)  # cProfile each service into <dir>/<role>-<sync>-<n>.prof
                wrap = [str(REPO / "bench" / "_cprof.py"), f"{prof}/{role}-{tag}.prof"] if prof else ["-m"]
                stack.procs[role] = await asyncio.create_subprocess_exec(
                    sys.executable, *wrap, f"reel.services.{name}", env={**env, **own}, cwd=str(repo),
                    stdout=asyncio.subprocess.DEVNULL, stderr=log)
            yield stack
        finally:
            for p in stack.procs.values():
                if p.returncode is None:
                    p.terminate()
            for p in stack.procs.values():
                try:
                    await asyncio.wait_for(p.wait(), 15)
                except TimeoutError:
                    p.kill()
                    await p.wait()
            for log in logs:
                log.close()
            await sub.unsubscribe()
            await nc.close()

