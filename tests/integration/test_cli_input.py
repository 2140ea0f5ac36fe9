"""Human input from the command line, as a user would: `reel run` stops at a run waiting for
input (exit 6, the requests and how to answer them), `reel ls` and `reel pending` show it, and `reel answer` /
`reel approve` wake it and follow it to the end. Real processes against the test server."""

from __future__ import annotations

import json

from reel.shared.core.input import requestfold
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.runtime.config import Config
from tests.integration.test_cli import reel


async def test_run_waits_for_input_then_answers_from_the_command_line_finish_it(
        cfg: Config, event_log: JetStreamEventLog) -> None:
    code, out, err = await reel(cfg, "run", "examples/agent/approval.yaml")
    assert code == 6, (out, err)
    assert "awaiting input" in out and "needs approval (deploy)" in out and "asks: Which version" in out
    code, listed, err = await reel(cfg, "pending", "--json")
    assert code == 0, err
    pending = json.loads(listed)
    assert [(p["tool"], p["kind"], p["run_status"]) for p in pending] == [("deploy", "approval", "awaiting_input"),
                                                                          ("ask_user", "question", "awaiting_input")]
    run_id = pending[0]["run_id"]
    deploy, question = pending[0]["request_id"], pending[1]["request_id"]
    assert f"reel approve {run_id} {deploy}" in out and f"reel answer {run_id} {question}" in out
    code, ls, err = await reel(cfg, "ls")
    assert code == 0 and "awaiting_input" in ls, (ls, err)

    code, out, err = await reel(cfg, "answer", run_id, question, "v2", "--by", "ana", "--json")
    assert code == 6, (out, err)  # the deploy still waits: the run rests again, and says what for
    assert len(out.strip().splitlines()) == 1, out  # --json: one object on stdout, the follow-up inside it
    doc = json.loads(out)
    assert doc["ok"] is True and doc["detail"]["resume"] == "published", doc
    assert (doc["run_status"], doc["exit"]) == ("awaiting_input", 6), doc
    assert [r["request_id"] for r in doc["requests"]] == [deploy], doc
    code, out, err = await reel(cfg, "approve", run_id, deploy, "--args", '{"env": "staging", "version": "v2"}')
    assert code == 0, (out, err)
    assert out.startswith(f"approved request {deploy} of run {run_id} (lsn "), out  # a sentence, not raw JSON
    assert "outcome passed" in out
    state = await event_log.load(run_id)
    answers = {r.tool_name: r.response for r in requestfold.requests_of(state.branches["main"]).values()}
    assert answers["ask_user"] is not None and (answers["ask_user"].text, answers["ask_user"].by) == ("v2", "ana")
    assert answers["deploy"] is not None and answers["deploy"].arguments == '{"env":"staging","version":"v2"}'
    code, out, err = await reel(cfg, "reject", run_id, deploy, "--note", "too late", "--no-wait")
    assert code == 1 and "request_answered" in err, (out, err)
    code, out, err = await reel(cfg, "approve", run_id, "q-000000000000")
    assert code == 1 and "request_not_found" in err, (out, err)


async def test_verdicts_follow_stops_at_input_and_an_answer_to_a_cancelled_run_is_a_refusal(cfg: Config) -> None:
    code, out, err = await reel(cfg, "run", "examples/agent/approval.yaml")
    assert code == 6, (out, err)
    code, listed, err = await reel(cfg, "pending", "--json")
    pending = json.loads(listed)
    run_id, question = pending[1]["run_id"], pending[1]["request_id"]
    code, out, err = await reel(cfg, "verdicts", run_id, "-f", "--timeout", "4")
    assert code == 6, (code, out, err)  # README: 6, awaiting input, the requests printed
    assert "awaiting input" in out and question in out and pending[0]["request_id"] in out, out
    code, out, err = await reel(cfg, "cancel", run_id)
    assert code == 0, (out, err)
    code, out, err = await reel(cfg, "answer", run_id, question, "v2")
    assert code == 4 and out.strip() == "", (code, out, err)  # README: 4, the run was cancelled
    assert err.strip().splitlines()[-1] == "error: run_cancelled: the run is cancelled: nothing to answer", err
    code, out, err = await reel(cfg, "answer", run_id, question, "v2", "--json")
    doc = json.loads(out)
    assert code == 4 and doc == {"ok": False, "code": "run_cancelled", "exit": 4,
                                 "reason": "the run is cancelled: nothing to answer"}, (out, err)
