"""Generate docs/schemas/*.json — the JSON Schemas of Reel's public interface — from the msgspec types.

Usage::

    python scripts/gen_schemas.py            # (re)write docs/schemas/
    python scripts/gen_schemas.py --check    # exit 1 if the committed files drifted

Every schema is ``msgspec.json.schema(Type)`` (JSON Schema 2020-12, with ``$defs``)
plus ``$schema``, ``title`` and ``description``; the files are written
with sorted keys so the output is stable. ``tests/unit/test_schemas.py`` fails
when a type changed and this script was not re-run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from reel.shared.core.run.events import Commit, Verdict
from reel.shared.core.wire.commands import (
    CancelRun,
    RecoverRuns,
    Reply,
    RespondRun,
    ResumeRun,
    RewindRun,
    StartRun,
    VerifyRun,
)
from reel.shared.core.wire.livemessages import RunControl, StreamChunk
from reel.shared.core.workflow.spec import WorkflowSpec

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "schemas"
DRAFT = "https://json-schema.org/draft/2020-12/schema"

# file name → (type, where it travels)
SCHEMAS: dict[str, tuple[type[Any], str]] = {
    "start_run.json": (StartRun, "command on <ns>.cmd.start"),
    "cancel_run.json": (CancelRun, "command on <ns>.cmd.cancel"),
    "rewind_run.json": (RewindRun, "command on <ns>.cmd.rewind"),
    "resume_run.json": (ResumeRun, "command on <ns>.cmd.resume"),
    "recover_runs.json": (RecoverRuns, "command on <ns>.cmd.recover"),
    "verify_run.json": (VerifyRun, "verification trigger on <ns>.cmd.verify.<run_id>"),
    "respond_run.json": (RespondRun, "command on <ns>.cmd.respond"),
    "reply.json": (Reply, "answer to every command, on the subject of its Reel-Reply-To header"),
    "commit.json": (Commit, "one run event commit: a message on <ns>.ev.<run_id> (LSN = its stream sequence)"),
    "verdict.json": (Verdict, "a verdict: a message on <ns>.verdict.<run_id>, and inside verdict_recorded events"),
    "workflow.json": (WorkflowSpec, "a workflow spec (StartRun.workflow, or a YAML/JSON file)"),
    "run_control.json": (RunControl, "a core-NATS message on <ns>.ctl.<run_id>, after the commit it announces"),
    "stream_chunk.json": (StreamChunk, "a core-NATS message on <ns>.stream.<run_id>.<branch>.<step>.<attempt>"),
}


def schema_of(kind: type[Any], where: str) -> dict[str, Any]:
    """The JSON Schema document of one type."""
    body = msgspec.json.schema(kind)
    doc = (kind.__doc__ or "").strip().splitlines()[0]
    return {"$schema": DRAFT, "title": kind.__name__, "description": f"{doc} ({where})", **body}


def render() -> dict[str, str]:
    """File name → the exact text the committed file must have."""
    return {name: json.dumps(schema_of(kind, where), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            for name, (kind, where) in SCHEMAS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift instead of writing")
    args = parser.parse_args(argv)
    rendered = render()
    if args.check:
        drift = [n for n, text in rendered.items() if not (OUT / n).is_file() or (OUT / n).read_text() != text]
        for name in drift:
            print(f"drift: docs/schemas/{name} (run python scripts/gen_schemas.py)", file=sys.stderr)
        return 1 if drift else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(rendered)} schemas to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
