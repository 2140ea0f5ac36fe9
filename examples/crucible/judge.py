"""Judge of the worked example: how small can Reel's packed context get without losing the evidence?

Runs *this world's* context packing (``reel.shared.core.run.planning`` + ``reel.shared.core.pack.packer``, imported
from the world the judge runs in, under the policy in ``examples/crucible/policy.json``)
over every model step of the recorded runs whose verdict is a pass — tau-bench
airline episodes with reward 1 and the SWE-bench-resolved mini-swe-agent run in
$REEL_DATA_DIR — loaded with ``reel.shared.core.trajectories.load_trajectories`` in its linear
form (``form="linear"``: one model step per recorded turn, each packed as a model step's
context; ``reel replay`` runs the agent form).

Evidence: the values the successful agent put into its action at that step — every
string argument (≥ 3 chars) of a tau-bench tool call, every path-like token of a
mini-swe-agent bash command — that occur in some earlier context item. A value is
*kept* when an item containing it was packed; a step whose system prompt or task was
not packed keeps nothing (the agent must see its instructions).

Score (minimize): the mean packed prompt in tokens, plus 100,000 per unit of evidence
recall below 0.99 — i.e. the smallest context that still holds ≥ 99 % of what the
successful agents used. Prints ``{"score": …, "total": <evidence values>}``; details on stderr.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

WORLD = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(WORLD))  # measure the packer of this world, not the installed one

from reel.shared.core.agent.turncontext import model_items, turn_candidates  # noqa: E402
from reel.shared.core.pack.packer import Candidate, PackPolicy, pack  # noqa: E402
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER  # noqa: E402
from reel.shared.core.run.planning import TextFacts  # noqa: E402
from reel.shared.core.trajectories import load_trajectories  # noqa: E402
from reel.shared.core.workflow.spec import ModelStep, ToolStep  # noqa: E402

RUNS = ("taubench_gpt-4o-airline.json", "minisweagent_gemini3pro_django__django-11163.traj.json")
RECALL_FLOOR = 0.99
PENALTY_TOKENS = 100_000.0
REQUIRED_KINDS = ("system", "task")
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_BASH = re.compile(r"```bash\s*\n(.*?)```", re.S)
_PATHISH = re.compile(r"[\w./-]*[A-Za-z_][\w-]*\.[A-Za-z]{1,4}\b|[\w-]+/[\w./-]+")


def _leaves(x: Any) -> Iterator[str]:
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, list):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, str) and len(x) >= 3:
        yield x


def evidence_values(output: str) -> set[str]:
    """Values the recorded action used: tool-call string arguments, bash path-like tokens."""
    values: set[str] = set()
    for m in _CALL.finditer(output):
        try:
            call = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        values.update(_leaves(call.get("arguments") or {}))
    for m in _BASH.finditer(output):
        values.update(t for t in _PATHISH.findall(m.group(1)) if len(t) >= 5)
    return values


def cases(data_dir: Path) -> list[tuple[list[Candidate], list[list[str]], list[str]]]:
    """Per model step with evidence: its candidates, the source items of each value, the required items."""
    out = []
    facts = TextFacts(DEFAULT_COUNTER)
    for name in RUNS:
        for spec in load_trajectories(data_dir / name, form="linear"):
            if spec.source.get("outcome") is not True:  # only runs whose recorded verdict is a pass
                continue
            outputs: dict[str, str] = {}
            for step in spec.steps:
                if isinstance(step, ToolStep):
                    outputs[step.id] = step.tool.output or ""
                    continue
                assert isinstance(step, ModelStep)
                items = model_items(step, spec, outputs)
                sources = [[i.id for i in items if v in i.text] for v in evidence_values(step.model.output or "")]
                sources = [s for s in sources if s]
                if sources:
                    cands = turn_candidates(items, facts)
                    out.append((cands, sources, [c.id for c in cands if c.kind in REQUIRED_KINDS]))
                outputs[step.id] = step.model.output or ""
    return out


def main() -> None:
    policy = json.loads((WORLD / "examples" / "crucible" / "policy.json").read_text())
    data_dir = Path(os.environ["REEL_DATA_DIR"])
    pack_policy = PackPolicy(budget_tokens=int(policy["budget_tokens"]), max_item_tokens=policy["max_item_tokens"],
                             exclude_kinds=tuple(policy["exclude_kinds"]), dedupe=bool(policy["dedupe"]))
    priority = {str(k): float(v) for k, v in policy["priority"].items()}
    kept = total = tokens = steps = 0
    for cands, sources, required in cases(data_dir):
        ranked = [Candidate(id=c.id, kind=c.kind, tokens=c.tokens, priority=priority.get(c.kind, 0.0),
                            stale=c.stale, content_hash=c.content_hash) for c in cands]
        packed = pack(ranked, pack_policy)
        in_view = set(packed.partition.packed)
        instructions = all(r in in_view for r in required)
        kept += sum(1 for s in sources if instructions and any(i in in_view for i in s))
        total += len(sources)
        tokens += packed.packed_tokens
        steps += 1
    recall, mean_tokens = kept / total, tokens / steps
    score = mean_tokens + PENALTY_TOKENS * max(0.0, RECALL_FLOOR - recall)
    print(f"steps={steps} evidence={total} recall={recall:.4f} mean_packed_tokens={mean_tokens:.1f}", file=sys.stderr)
    print(json.dumps({"score": round(score, 3), "total": total}))


if __name__ == "__main__":
    main()
