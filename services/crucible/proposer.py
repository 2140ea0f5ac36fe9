"""Proposers: what edits the world each iteration.

**Command proposer** — any program, run in the world directory with the full
environment plus:

====================  ==========================================================
``CRUCIBLE_SESSION``  the session id
``CRUCIBLE_ITERATION`` the iteration number (1-based)
``CRUCIBLE_REGIME``   the current regime's name
``CRUCIBLE_DIRECTION`` ``maximize`` or ``minimize``
``CRUCIBLE_BEST_SCORE`` the segment's best score
``CRUCIBLE_GOAL``     the regime's goal (empty if none)
``CRUCIBLE_HISTORY``  path of a JSON file with every row so far (outside the world)
``CRUCIBLE_BUDGET_ITERATIONS`` iterations left, this one included
``CRUCIBLE_BUDGET_COST_USD`` USD left before this call (empty: no cost budget)
``CRUCIBLE_BUDGET_WALL_S`` active seconds left (empty: no time budget)
====================  ==========================================================

It edits files (and may commit them); the candidate is the best snapshot vs whatever it
leaves in the working tree, its own commits included. Its last
stdout line may be a JSON object ``{"note", "cost_usd", "escalate", "done",
"rescope"}`` (``cost_usd`` is counted even when it fails); otherwise that line is
the note. Exit 0: proposed (an empty change skips the measurement); exit 75: a
resource is unavailable (the iteration parks and retries); anything else, or a
timeout: the iteration fails (rolled back, the loop goes on).

**Model proposer** — a Reel model adapter (``replay``/``scripted`` today, real
endpoints later) asked with a prompt (instructions, goal, recent rows, files); it
answers a unified diff in a fenced block (applied with ``git apply``), or
``DONE``, ``ESCALATE: <reason>``, ``RESCOPE: <regime>``. A line ``NOTE: …`` sets
the note. A retryable :class:`~reel.shared.core.errors.ModelError` parks (provisioning), a
non-retryable one fails the iteration.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

import msgspec

from reel.services.crucible import proc
from reel.services.crucible.world import GitWorld, git
from reel.shared.core.chat.messages import prompt_request
from reel.shared.core.errors import ModelError
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.crucible.config import ProposerSpec, Regime
from reel.shared.crucible.errors import WorldError
from reel.shared.crucible.state import Row
from reel.shared.models import make_chat_model

ProposalKind = Literal["edited", "failed", "escalate", "done", "rescope", "blocked"]
_FENCE = re.compile(r"```(?:diff|patch)?[ \t]*\n(.*?)```", re.DOTALL)
RECENT_ROWS = 20
_DIRECTIVES: tuple[tuple[str, ProposalKind], ...] = (("ESCALATE:", "escalate"), ("RESCOPE:", "rescope"))


@dataclass(frozen=True)
class ProposeContext:
    """What a proposer is told about the session."""

    session_id: str
    it: int
    regime: Regime
    best_score: float
    rows: tuple[Row, ...]
    world: GitWorld
    budget: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Proposal:
    """What the proposer did (the world holds the edits; the loop stages them).

    Attributes:
        kind: ``edited`` (look at the world), ``failed``, ``escalate``, ``done``, ``rescope``, ``blocked``.
        detail: failure / escalation reason / target regime, one line.
        prompt: the model prompt, if any (stored as a blob).
        proposer_sha: the commit the proposer left HEAD at, when it committed itself.
    """

    kind: ProposalKind
    note: str = ""
    cost_usd: float = 0.0
    detail: str = ""
    proposer_ms: int = 0
    prompt: str | None = None
    proposer_sha: str = ""


class Proposer(Protocol):
    """Port: edit the world for one iteration."""

    async def propose(self, ctx: ProposeContext) -> Proposal: ...


def make_proposer(spec: ProposerSpec) -> Proposer:
    """The proposer a config names (validated to have exactly one of command/model)."""
    if spec.model is not None:
        return ModelProposer(spec)
    return CommandProposer(spec)


def _write_history(ctx: ProposeContext) -> None:
    ctx.world.history_path.write_bytes(msgspec.json.encode(list(ctx.rows)))


class CommandProposer:
    """Runs ``spec.command`` in the world (see module doc for its protocol)."""

    def __init__(self, spec: ProposerSpec) -> None:
        self.spec = spec

    def env(self, ctx: ProposeContext) -> dict[str, str]:
        return {
            **proc.base_env(self.spec.pass_env), "CRUCIBLE_SESSION": ctx.session_id, "CRUCIBLE_ITERATION": str(ctx.it),
            "CRUCIBLE_REGIME": ctx.regime.name, "CRUCIBLE_DIRECTION": ctx.regime.judge.direction,
            "CRUCIBLE_BEST_SCORE": repr(ctx.best_score),
            "CRUCIBLE_GOAL": "" if ctx.regime.goal is None else repr(ctx.regime.goal),
            "CRUCIBLE_HISTORY": str(ctx.world.history_path), **ctx.budget,
        }

    async def propose(self, ctx: ProposeContext) -> Proposal:
        _write_history(ctx)
        try:
            done = await proc.run(self.spec.command, cwd=ctx.world.root, env=self.env(ctx),
                                  timeout_s=self.spec.timeout_s)
        except OSError as exc:
            return Proposal(kind="failed", detail=f"cannot start proposer: {exc}")
        info = _last_json(done.text())
        note = str(info.get("note", "")) if info else done.last_line()
        cost = _cost(info)
        if done.timed_out:
            return Proposal(kind="failed", note=note, cost_usd=cost, proposer_ms=done.duration_ms,
                            detail=f"proposer timed out after {self.spec.timeout_s:g}s")
        if done.returncode == proc.EX_TEMPFAIL:
            return Proposal(kind="blocked", note=note, cost_usd=cost, proposer_ms=done.duration_ms,
                            detail=done.last_line("stderr") or note or "proposer unavailable (exit 75)")
        if done.returncode != 0:
            why = done.last_line("stderr") or done.last_line()
            return Proposal(kind="failed", note=note, cost_usd=cost, proposer_ms=done.duration_ms,
                            detail=f"proposer exit {done.returncode}" + (f": {why}" if why else ""))
        kind: ProposalKind = "edited"
        detail = ""
        if info and info.get("escalate"):
            kind, detail = "escalate", str(info["escalate"])
        elif info and info.get("done"):
            kind, detail = "done", str(info.get("done") if isinstance(info.get("done"), str) else "")
        elif info and info.get("rescope"):
            kind, detail = "rescope", str(info["rescope"])
        return Proposal(kind=kind, note=note[:300], cost_usd=cost, detail=detail, proposer_ms=done.duration_ms)


def _last_json(stdout: str) -> dict[str, object] | None:
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines or not lines[-1].startswith("{"):
        return None
    try:
        obj = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _cost(info: dict[str, object] | None) -> float:
    raw = (info or {}).get("cost_usd", 0.0)
    return float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) and raw >= 0 else 0.0


def _budget_line(left: Mapping[str, str]) -> str:
    """What is left of the budget, for a model proposer's prompt ("" without any)."""
    parts = [f"{n} {what}" for key, what in (("CRUCIBLE_BUDGET_ITERATIONS", "iterations"),
                                             ("CRUCIBLE_BUDGET_COST_USD", "USD"),
                                             ("CRUCIBLE_BUDGET_WALL_S", "s of active time"))
             if (n := left.get(key))]
    return "Budget left: " + ", ".join(parts) + "." if parts else ""


class ModelProposer:
    """Asks a Reel model adapter for a diff (see module doc)."""

    def __init__(self, spec: ProposerSpec) -> None:
        assert spec.model is not None
        self.spec = spec
        self.model = spec.model
        self.adapter = make_chat_model(spec.model)

    async def prompt(self, ctx: ProposeContext) -> str:
        files = (await git(ctx.world.root, "ls-files")).splitlines()[:200]
        rows = "\n".join(
            f"{r.it}\t{r.verdict}\t{'' if r.score is None else f'{r.score:.6g}'}\t{r.note}" for r in
            ctx.rows[-RECENT_ROWS:]
        )
        goal = "none" if ctx.regime.goal is None else f"{ctx.regime.goal:g}"
        return "\n\n".join(p for p in (
            self.spec.instructions,
            f"Regime {ctx.regime.name}: {ctx.regime.judge.direction} the judge's score; goal {goal}; "
            f"best so far {ctx.best_score:.6g}. Iteration {ctx.it}.",
            _budget_line(ctx.budget),
            f"Recent iterations (it, verdict, score, note):\n{rows or '(none)'}",
            "Files:\n" + "\n".join(files),
            "Answer with one unified diff in a ```diff fenced block (and a line `NOTE: <what you changed>`), "
            "or `DONE` if you have nothing more to try, or `ESCALATE: <reason>` if a human is needed.",
        ) if p)

    async def propose(self, ctx: ProposeContext) -> Proposal:
        prompt = await self.prompt(ctx)
        started = time.perf_counter()
        try:
            resp = await self.adapter.complete_chat(prompt_request(
                self.model, run_id=ctx.session_id, step_id="propose", attempt=ctx.it, prompt=prompt,
                prompt_tokens=DEFAULT_COUNTER.count(prompt)))
        except ModelError as exc:
            ms = int((time.perf_counter() - started) * 1000)
            cost = exc.cost_usd
            return Proposal(kind="blocked" if exc.retryable else "failed", cost_usd=cost, proposer_ms=ms,
                            detail=f"model error {exc.kind}: {exc.message}"[:300], prompt=prompt)
        ms = int((time.perf_counter() - started) * 1000)
        return await self._interpret(ctx, resp.text, resp.cost_usd, ms, prompt)

    async def _interpret(self, ctx: ProposeContext, text: str, cost: float, ms: int, prompt: str) -> Proposal:
        stripped = text.strip()
        note = next((ln[5:].strip() for ln in stripped.splitlines() if ln.startswith("NOTE:")), "")
        head = stripped.splitlines()[0] if stripped else ""
        for word, kind in _DIRECTIVES:
            if head.startswith(word):
                return Proposal(kind=kind, note=note, cost_usd=cost, proposer_ms=ms, prompt=prompt,
                                detail=head[len(word):].strip())
        if head == "DONE":
            return Proposal(kind="done", note=note, cost_usd=cost, proposer_ms=ms, prompt=prompt)
        m = _FENCE.search(stripped)
        patch = m.group(1) if m else (stripped if stripped.startswith(("diff --git", "--- ")) else "")
        if not patch:
            return Proposal(kind="failed", note=note, cost_usd=cost, proposer_ms=ms, prompt=prompt,
                            detail="model answer holds no diff, DONE or ESCALATE")
        try:
            await git(ctx.world.root, "apply", "--whitespace=nowarn", "-", stdin=patch.encode())
        except WorldError as exc:
            return Proposal(kind="failed", note=note, cost_usd=cost, proposer_ms=ms, prompt=prompt,
                            detail=f"patch does not apply: {exc.message}"[:300])
        return Proposal(kind="edited", note=note or "model proposal", cost_usd=cost, proposer_ms=ms, prompt=prompt)
