"""The ``lab:`` judge: a candidate world scored by the verifier pass rate of a batch of live runs.

One repeat of a reading starts ``lab.runs`` runs of the world's workflow (``lab.workflow``, read from
the measure tree: the measured sha's files) through Reel's client
(:class:`~reel.shared.nats.client.ReelClient`, as ``reel run`` does) on the session's NATS and namespace,
at most ``lab.concurrency`` at once, waits until each one rests (``completed`` or ``cancelled``) and counts
those whose verdict from the verifier ``lab.verifier`` is ``pass``; the value is ``passes / runs``. A run
that rests without that verdict (its agent failed before verifying) counts as a run that did not pass.

What is frozen and what is the candidate. The workflow file is the judge: its verifier, its model, its
tools are what the pass rate means, so it is fingerprinted and protected like a judge's ``reads`` (a
candidate that touches it is denied). The candidate is what the workflow takes from the world's other
files, ``lab.files``: a string value that is exactly ``${NAME}`` for a ``.yaml``/``.yml``/``.json`` file
becomes that file's document (a packing ``policy:``, a tool list), and any other ``${NAME}`` is replaced by
the file's text (an agent's ``instructions:``); ``${NAME}`` of ``lab.env`` is replaced by its value.
Nothing else of crucible's environment reaches the workflow.

Runs are real runs in the log, labelled ``crucible.session``, ``crucible.regime``, ``crucible.iteration``,
``crucible.target`` (``baseline``, ``candidate`` or ``incumbent``), ``crucible.sha``, ``crucible.repeat`` and
``crucible.run``, so every run behind a reading can be found and opened (``reel show RUN``).

Readings. The cost of a reading is what its runs recorded (``cost_usd`` of every attempt, for priced
models). A workflow that does not load, a run refused at start, or a batch not finished within the
judge's ``timeout_s`` (its unfinished runs are cancelled) is an invalid reading; a start nobody answers
(no executor serves the namespace) is :class:`~reel.services.crucible.judge.Unavailable` (wait and retry).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml

from reel.services.crucible.judge import Fingerprint, Judge, Unavailable, hash_path, read_path
from reel.shared.core.errors import ReelError, WorkflowInvalid
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.verify.verification import final_verdicts
from reel.shared.core.workflow.spec import WorkflowSpec, expand_env, parse_workflow
from reel.shared.crucible.config import JudgeSpec, LabSpec, SessionConfig
from reel.shared.crucible.errors import ConfigInvalid
from reel.shared.crucible.state import InvalidReading
from reel.shared.nats.client import CommandTimeout, ReelClient

log = structlog.get_logger("reel.crucible")

RESTED = ("completed", "cancelled")
"""The statuses a lab run is waited for: it has finished (its verdicts, if any, are in)."""
START_TIMEOUT_S = 30.0
"""How long one start waits for an executor's answer (s, at most half the batch's ``timeout_s``); past it the
judge is unavailable."""
CANCEL_TIMEOUT_S = 5.0
"""How long the cancel of an abandoned lab run waits for the cancel service's answer (s)."""
DOCUMENT_SUFFIXES = (".yaml", ".yml", ".json")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str:
    return _sha(b"file\0" + path.read_bytes()) if path.is_file() else _sha(b"missing")


def lab_fingerprint(spec: JudgeSpec, tree: Path) -> Fingerprint:
    """The lab judge's identity: its definition (workflow path, runs, verifier, concurrency, the files and
    env it substitutes, the batch timeout), the direction, the workflow file's content and every ``reads``."""
    lab = spec.lab
    assert lab is not None
    definition = {"workflow": lab.workflow, "runs": lab.runs, "verifier": lab.verifier,
                  "concurrency": lab.concurrency, "files": sorted(lab.files.items()), "env": sorted(lab.env.items()),
                  "timeout_s": spec.timeout_s}
    parts = {
        "lab": _sha(json.dumps(definition, sort_keys=True).encode()),
        "direction": _sha(spec.direction.encode()),
        "env": _sha(json.dumps(sorted(spec.env.items())).encode()),
        f"workflow:{lab.workflow}": _file_sha(tree / lab.workflow),
    }
    for read in spec.reads:
        parts[f"read:{read}"] = hash_path(read_path(tree, read))
    digest = _sha(json.dumps(sorted(parts.items())).encode())
    return Fingerprint(digest=digest, parts=parts)


def _substituted(data: Any, documents: Mapping[str, Any]) -> Any:
    """``data`` with every string that is exactly ``${NAME}`` of a document file replaced by its document."""
    if isinstance(data, dict):
        return {k: _substituted(v, documents) for k, v in data.items()}
    if isinstance(data, list):
        return [_substituted(v, documents) for v in data]
    if isinstance(data, str) and data.startswith("${") and data.endswith("}") and data[2:-1] in documents:
        return documents[data[2:-1]]
    return data


def load_lab_workflow(lab: LabSpec, tree: Path) -> WorkflowSpec:
    """The workflow ``lab.workflow`` of ``tree`` with the lab's ``files`` and ``env`` substituted (module doc).

    Raises:
        WorkflowInvalid: a file is unreadable or not a document where one is needed, or the workflow is invalid.
    """
    def read(rel: str) -> str:
        try:
            return (tree / rel).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkflowInvalid(f"cannot read {rel}: {getattr(exc, 'strerror', None) or exc}") from None

    texts = {name: read(rel) for name, rel in lab.files.items()}
    documents: dict[str, Any] = {}
    try:
        raw = yaml.safe_load(read(lab.workflow))
        for name, rel in lab.files.items():
            if os.path.splitext(rel)[1] in DOCUMENT_SUFFIXES:
                documents[name] = json.loads(texts[name]) if rel.endswith(".json") else yaml.safe_load(texts[name])
    except (yaml.YAMLError, ValueError) as exc:
        raise WorkflowInvalid(f"does not decode: {' '.join(str(exc).split())[:300]}") from None
    if not isinstance(raw, dict):
        raise WorkflowInvalid(f"{lab.workflow}: the top level must be a mapping")
    try:
        return parse_workflow(expand_env(_substituted(raw, documents), {**lab.env, **texts}))
    except WorkflowInvalid as exc:
        raise WorkflowInvalid(f"{lab.workflow}: {exc.message}") from None


def check_lab_workflows(cfg: SessionConfig, world: Path) -> None:
    """Every ``lab`` judge's workflow loads from ``world`` (the session's clone at its base) and has the verifier it
    names: a config that cannot measure anything is refused before the session starts.

    Raises:
        ConfigInvalid: naming the regime, the file and the problem.
    """
    for regime in cfg.regimes:
        lab = regime.judge.lab
        if lab is None:
            continue
        where = f"regime {regime.name!r}: judge.lab"
        if not (world / lab.workflow).is_file():
            raise ConfigInvalid(f"{where}.workflow {lab.workflow!r} is not a file of the world")
        try:
            spec = load_lab_workflow(lab, world)
        except WorkflowInvalid as exc:
            raise ConfigInvalid(f"{where}: the workflow does not load: {exc.message}") from None
        names = [v.label for v in spec.verifiers]
        if lab.verifier not in names:
            raise ConfigInvalid(f"{where}.verifier {lab.verifier!r} is not a verifier of {lab.workflow} "
                                f"(it has: {', '.join(names) or 'none'})")


@dataclass(frozen=True)
class _Run:
    """One lab run as it rested: passed the verifier or not, and what it cost (USD)."""

    run_id: str
    passed: bool
    cost_usd: float


class _Refused(ReelError):
    """A start the executor refused (an invalid reading)."""

    code = "lab_run_refused"


def _leaves(group: BaseExceptionGroup[Exception]) -> list[Exception]:
    out: list[Exception] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def _rested(state: RunState, verifier: str) -> _Run:
    verdict = final_verdicts(state).get(verifier)
    usage = build_episode_view(state, state.active_branch).usage
    return _Run(run_id=state.run_id, passed=verdict is not None and verdict.status == "pass",
                cost_usd=float(usage.cost_usd))


class LabJudge(Judge):
    """A :class:`Judge` whose one run is a batch of live runs of the world's workflow (module doc)."""

    def __init__(self, spec: JudgeSpec, client: ReelClient | None) -> None:
        super().__init__(spec)
        assert spec.lab is not None
        self.lab = spec.lab
        self.client = client

    async def fingerprint(self, tree: Path) -> Fingerprint:
        return await asyncio.to_thread(lab_fingerprint, self.spec, tree)

    async def once(self, tree: Path, tag: Mapping[str, str] | None = None
                   ) -> tuple[tuple[float, int | None] | InvalidReading | Unavailable, float]:
        """One batch: (the pass rate and the number of runs, an invalid reading, or unavailable; its cost, USD)."""
        t0 = asyncio.get_running_loop().time()

        def elapsed_ms() -> int:
            return int((asyncio.get_running_loop().time() - t0) * 1000)

        if self.client is None:
            return InvalidReading(reason="crash: a lab judge needs the session's Reel connection"), 0.0
        try:
            spec = await asyncio.to_thread(load_lab_workflow, self.lab, tree)
        except WorkflowInvalid as exc:
            return InvalidReading(reason=f"crash: workflow invalid: {exc.message}", judge_ms=elapsed_ms()), 0.0
        started: dict[int, str] = {}
        done: list[_Run] = []
        try:
            async with asyncio.timeout(self.spec.timeout_s):
                await self._batch(self.client, spec, tree, dict(tag or {}), started, done)
        except CommandTimeout as exc:  # before TimeoutError: it is one
            await self._cancel(self.client, started, done)
            cost = sum(r.cost_usd for r in done)
            return Unavailable(reason=f"no executor answered a lab run's start: {exc.message}", cost_usd=cost), cost
        except TimeoutError:
            await self._cancel(self.client, started, done)
            return InvalidReading(
                reason=f"timeout after {self.spec.timeout_s:g}s: {len(done)} of {self.lab.runs} lab runs finished",
                judge_ms=elapsed_ms()), sum(r.cost_usd for r in done)
        except ReelError as exc:
            await self._cancel(self.client, started, done)
            return InvalidReading(reason=f"crash: lab run refused: {exc.message}", judge_ms=elapsed_ms()), \
                sum(r.cost_usd for r in done)
        passes = sum(r.passed for r in done)
        cost = sum(r.cost_usd for r in done)
        log.info("crucible.lab", passes=passes, runs=len(done), cost_usd=cost, ms=elapsed_ms(),
                 **{k.removeprefix("crucible."): v for k, v in (tag or {}).items() if k != "crucible.session"})
        return (passes / len(done), len(done)), cost

    async def _batch(self, client: ReelClient, spec: WorkflowSpec, tree: Path, tag: dict[str, str],
                     started: dict[int, str], done: list[_Run]) -> None:
        gate = asyncio.Semaphore(self.lab.concurrency)
        source_dir = str((tree / self.lab.workflow).parent)  # the measure tree's path is absolute and normalised

        async def one(i: int) -> None:
            async with gate:
                labels = {**tag, "crucible.run": str(i)}
                reply = await client.start(spec, labels=labels, timeout_s=min(START_TIMEOUT_S, self.spec.timeout_s / 2),
                                           source_dir=source_dir)
                if not reply.ok or reply.run_id is None:
                    raise _Refused(reply.error.message if reply.error else "no run id")
                started[i] = reply.run_id
                state = await client.wait_for(reply.run_id, RESTED, timeout_s=self.spec.timeout_s)
                done.append(_rested(state, self.lab.verifier))

        try:
            async with asyncio.TaskGroup() as tg:
                for i in range(self.lab.runs):
                    tg.create_task(one(i))
        except ExceptionGroup as group:  # one cause: an unanswered start, a timeout, then a refusal
            leaves = _leaves(group)
            raise next((e for kind in (CommandTimeout, TimeoutError, ReelError) for e in leaves
                        if isinstance(e, kind)), leaves[0]) from None

    async def _cancel(self, client: ReelClient, started: dict[int, str], done: list[_Run]) -> None:
        """Cancel the batch's runs that have not finished, at once (best effort, :data:`CANCEL_TIMEOUT_S` each:
        they are real runs and would go on)."""
        finished = {r.run_id for r in done}

        async def cancel(run_id: str) -> None:
            try:
                await client.cancel(run_id, "crucible: the lab reading was abandoned", by="crucible",
                                    timeout_s=CANCEL_TIMEOUT_S)
            except (ReelError, TimeoutError, OSError) as exc:
                log.warning("crucible.lab_cancel_failed", run_id=run_id, error=str(exc)[:200])

        await asyncio.gather(*(cancel(r) for r in started.values() if r not in finished))
