"""The derived cells of ``reel show`` (services/timeline/rows.py): exit codes, commands, latency, drop notes."""

from __future__ import annotations

import msgspec

from reel.services.timeline.rows import call_cells, drop_summary, exit_code_cell, fmt_ms, latency_cell
from reel.shared.core.run.events import ContextPartition, Usage
from reel.shared.core.run.ids import LSN, AttemptNo, ExecutorId, StepId
from reel.shared.core.run.views import AttemptView, StepView
from reel.shared.core.workflow.spec import parse_workflow
from tests.golden.regen import GOLDEN_DIR, fold_log


def _attempt(status: str = "succeeded", kind: str | None = None, message: str | None = None) -> AttemptView:
    return AttemptView(step_id=StepId("s"), attempt=AttemptNo(1), status=status,  # type: ignore[arg-type]
                       executor_id=ExecutorId("x"), dispatched_lsn=LSN(1), error_kind=kind, error_message=message,
                       usage=Usage(latency_ms=0.0213))


def test_exit_codes_only_where_a_command_ran() -> None:
    assert exit_code_cell(True, _attempt()) == "0"
    assert exit_code_cell(True, _attempt("failed", "exit_2", "sh exited 2: boom")) == "2"
    assert exit_code_cell(True, _attempt("failed", "tool_error", "run_tests exited 1: FAIL")) == "1"
    assert exit_code_cell(False, _attempt()) == ""  # a recorded or Python tool has no exit code
    assert exit_code_cell(True, _attempt("failed", "timeout", "did not finish")) == ""


def test_latency_keeps_microseconds_visible() -> None:
    assert fmt_ms(0.0213) == "0.021" and fmt_ms(12.46) == "12.5" and fmt_ms(850.2) == "850"
    assert latency_cell(_attempt(), None) == ("0.021", "")  # the old one-decimal column read 0.0


def test_plain_command_steps_show_their_argv_and_agent_calls_their_command() -> None:
    spec = parse_workflow({"name": "w", "steps": [{"kind": "tool", "id": "run", "tool": {
        "type": "command", "argv": ["sh", "-c", "echo hi"]}}]})
    state, _ = fold_log(GOLDEN_DIR / "hand_agent_rewind.jsonl")
    branch = state.active
    step = StepView(step_id=StepId("run"), kind="tool", status="succeeded")  # type: ignore[arg-type]
    assert call_cells(spec, branch, step, _attempt()) == ("sh -c 'echo hi'", "0")
    call = StepView(step_id=StepId("solve:t1:c0"), kind="tool", status="succeeded",  # type: ignore[arg-type]
                    parent_step=StepId("solve"), tool_name="read_file")
    assert call_cells(None, branch, call, _attempt()) == ('{"path": "calc/ops.py"}', "")


def test_drop_summary_groups_ids_by_reason() -> None:
    part = ContextPartition(packed=("a",), available=(), dropped=("d1", "d2", "d3"),
                            drop_reasons=("stale", "duplicate", "stale"))
    assert drop_summary(part) == "d1 d3 (stale), d2 (duplicate)"
    old = msgspec.json.decode(b'{"packed":[],"available":[],"dropped":["x"]}', type=ContextPartition)
    assert drop_summary(old) == "x (reason not recorded)"


def test_timeline_cells_print_brackets_as_written() -> None:
    """Tool arguments (``list[str]``, ``[w.strip(P) for w in ws]``) are text, not Rich markup."""
    import io

    from rich.console import Console
    from rich.table import Table

    from reel.services.timeline.render import _plain

    table = Table()
    table.add_column("args")
    table.add_row(*_plain(("def words(text: str) -> list[str]: return [w.strip(P) for w in ws] [bold]x[/]",)))
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(table)
    assert "list[str]" in out.getvalue() and "[w.strip(P) for w in ws]" in out.getvalue()
    assert "[bold]x[/]" in out.getvalue()
