"""``reel ui`` keeps agent runs readable, in a real browser. A 24-turn run under a small budget (its oldest
turns are left out, ``available``) shows its first turn's partition in full and every later one as "same as turn
k except …", listing exactly the items whose group, tokens or reason changed since the turn before — so the
page's partition chips are the first turn's plus the changes, not the sum of every turn's items (each collapsed one
opens in full on a click). A turn's prompt
and output read as a conversation, with the raw bytes one click away."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reel.shared.core.run.events import ContextPartition
from reel.shared.core.run.views import build_episode_view
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.eventlog import JetStreamEventLog
from tests.ui.support import artifact, chromium, env_for, reel, reel_ui, until

pytestmark = pytest.mark.ui

TURNS = 24


def long_workflow(turns: int = TURNS) -> str:
    """An agent of ``turns`` scripted turns, each noting something with a recorded tool, then an answer; a budget
    that fits about ten turns."""
    calls = "\n".join(
        f'        - {{text: "note {i}", tool_calls: [{{name: note, arguments: {{n: {i}, text: "<b>line {i}</b>\\n'
        f'second line"}}}}]}}' for i in range(1, turns + 1))
    return f"""name: ui-long
budget_tokens: 900
steps:
  - kind: agent
    id: long
    max_turns: {turns + 1}
    instructions: "Take {turns} notes, one a turn."
    context:
      - {{id: task, kind: task, text: "Write {turns} notes."}}
    model:
      adapter: scripted
      turns:
{calls}
        - text: "Done: {turns} notes."
    tools:
      - name: note
        description: Keep a note.
        recorded: {{output: "noted <i>it</i>; {'x' * 120}"}}
        parameters:
          type: object
          properties: {{n: {{type: integer}}, text: {{type: string}}}}
          required: [n, text]
verifiers:
  - {{type: output_regex, name: says-done, pattern: "Done"}}
"""


def groups_of(c: ContextPartition) -> dict[str, tuple[str, int]]:
    """Each item's (group, tokens) as the log recorded it."""
    assert isinstance(c.item_tokens, tuple)
    ids = [(i, g) for g in ("packed", "available", "dropped") for i in getattr(c, g)]
    return {i: (g, t) for (i, g), t in zip(ids, c.item_tokens, strict=True)}


def changes(before: ContextPartition, after: ContextPartition) -> set[tuple[str, str, str]]:
    """(item, was, now) of every item whose group or tokens differ (``""``: not a candidate)."""
    b, a = groups_of(before), groups_of(after)
    out = {(i, b[i][0] if i in b else "", g) for i, (g, t) in a.items() if b.get(i) != (g, t)}
    return out | {(i, g, "") for i, (g, _) in b.items() if i not in a}


async def test_a_long_runs_partitions_collapse_to_their_differences(  # type: ignore[no-untyped-def]
        cfg, event_log: JetStreamEventLog, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    env = env_for(tmp_path)
    wf = tmp_path / "long.yaml"
    wf.write_text(long_workflow())
    code, out, err = await reel(cfg, "run", str(wf), "-q", env=env)
    assert code == 0, (out, err)
    run_id = re.search(r"run (r-[0-9a-f]{20}) created", out).group(1)  # type: ignore[union-attr]
    view = build_episode_view(await event_log.load(run_id))
    turns = [s.attempts[-1] for s in view.steps if s.kind == "model"]
    assert len(turns) == TURNS + 1 and all(len(s.attempts) == 1 for s in view.steps if s.kind == "model")
    parts = [a.context for a in turns]
    assert all(isinstance(c, ContextPartition) for c in parts)
    assert parts[-1].available, "the budget ran out: the oldest turns were left out"  # type: ignore[union-attr]
    async with reel_ui(cfg, env=env) as url:
        with chromium(tmp_path / "profile") as b:
            b.get(f"{url}/runs/{run_id}")
            await until(b, lambda d: d.find_element(By.ID, "run-id").text == run_id, "the run page")
            els = [b.find_element(By.CSS_SELECTOR, f'div.attempt[data-step="{a.step_id}"][data-attempt="1"] '
                                                   f'.partition') for a in turns]
            assert not els[0].find_elements(By.CSS_SELECTOR, ".same-as")  # the first turn: in full
            assert len(els[0].find_elements(By.CSS_SELECTOR, ".item")) == len(groups_of(parts[0]))  # type: ignore[arg-type]
            moved = 0
            for k in range(1, len(turns)):
                same = els[k].find_element(By.CSS_SELECTOR, ".same-as")
                assert same.get_attribute("data-same-as") == f"attempt-{turns[k - 1].step_id}-1", k
                assert same.text.startswith(f"same as turn {k} except:"), same.text
                shown = {(i.get_attribute("data-item"), ch.get_attribute("data-was"), ch.get_attribute("data-now"))
                         for ch in els[k].find_elements(By.CSS_SELECTOR, ".change")
                         for i in ch.find_elements(By.CSS_SELECTOR, ".item")}
                assert shown == changes(parts[k - 1], parts[k]), k  # type: ignore[arg-type]
                moved += any(was == "packed" and now == "available" for _, was, now in shown)
                # the budget line is every turn's own
                assert els[k].find_element(By.CSS_SELECTOR, ".budget").get_attribute("data-packed") == str(
                    parts[k].packed_tokens)  # type: ignore[union-attr]
            assert moved >= 5, "turns that left the oldest one out"
            chips = len(b.find_elements(By.CSS_SELECTOR, ".partition .item"))
            every = sum(len(groups_of(c)) for c in parts)  # type: ignore[arg-type]
            assert chips == len(groups_of(parts[0])) + sum(  # type: ignore[arg-type]
                len(changes(parts[k - 1], parts[k])) for k in range(1, len(parts)))  # type: ignore[arg-type]
            assert chips * 4 < every, (chips, every)
            print(f"partition chips: {chips} collapsed, {every} in full")
            # "same as turn k" jumps to turn k's attempt
            last = els[-1]
            b.execute_script("arguments[0].scrollIntoView()", last)
            assert last.screenshot(str(artifact(tmp_path, "ui-partition-collapsed.png")))
            print(f"screenshot: {artifact(tmp_path, 'ui-partition-collapsed.png')}")
            # all of a collapsed partition's items, one click away (fetched when opened), and as a page
            every_item = last.find_element(By.CSS_SELECTOR, "details.all-items")
            assert every_item.find_element(By.TAG_NAME, "summary").text == f"all {len(groups_of(parts[-1]))} items"  # type: ignore[arg-type]
            every_item.find_element(By.TAG_NAME, "summary").click()
            await until(b, lambda d: every_item.find_elements(By.CSS_SELECTOR, ".group .item"), "every item")
            for group in ("packed", "available", "dropped"):
                ids = [i.get_attribute("data-item") for i in every_item.find_elements(
                    By.CSS_SELECTOR, f'.group[data-group="{group}"] .item')]
                assert ids == list(getattr(parts[-1], group)), group
            as_page = every_item.find_element(By.CSS_SELECTOR, "a.as-page").get_attribute("href")
            last.find_element(By.CSS_SELECTOR, ".same-as a").click()
            await until(b, lambda d: d.execute_script("return location.hash") == f"#attempt-{turns[-2].step_id}-1",
                        "the jump to the turn before")
            b.get(as_page)
            assert [i.get_attribute("data-item") for i in b.find_elements(By.CSS_SELECTOR, ".partition .item")] == [
                i for g in ("packed", "available", "dropped") for i in getattr(parts[-1], g)]


async def test_prompts_and_outputs_read_as_a_conversation(  # type: ignore[no-untyped-def]
        cfg, event_log: JetStreamEventLog, blobs: JetStreamBlobStore, tmp_path: Path) -> None:
    """A turn's prompt opens as its messages (system, user, each earlier assistant message with its tool calls
    and their arguments, each tool result named by its call), its output as the assistant's message; markup in
    them is text; the raw bytes are one click away, and the conversation is a page of its own without
    JavaScript."""
    from selenium.webdriver.common.by import By

    env = env_for(tmp_path)
    wf = tmp_path / "short.yaml"
    wf.write_text(long_workflow(3))
    code, out, err = await reel(cfg, "run", str(wf), "-q", env=env)
    assert code == 0, (out, err)
    run_id = re.search(r"run (r-[0-9a-f]{20}) created", out).group(1)  # type: ignore[union-attr]
    view = build_episode_view(await event_log.load(run_id))
    turn = view.step("long:t3").attempts[-1]
    assert turn.prompt_ref is not None and turn.output_ref is not None
    body = await blobs.get(turn.prompt_ref)
    sent = json.loads(body)["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    async with reel_ui(cfg, env=env) as url:
        with chromium(tmp_path / "profile") as b:
            b.get(f"{url}/runs/{run_id}")
            viewer = b.find_element(By.CSS_SELECTOR, '.viewer[data-key="long:t3#1:prompt"]')
            viewer.find_element(By.TAG_NAME, "summary").click()
            await until(b, lambda d: viewer.find_elements(By.CSS_SELECTOR, ".chat .msg"), "the conversation")
            msgs = viewer.find_elements(By.CSS_SELECTOR, ".chat .msg")
            assert [m.get_attribute("data-role") for m in msgs] == [m["role"] for m in sent]
            text = [b.execute_script("const t = arguments[0].querySelector('.msg-text'); return t ? t.textContent "
                                     ": null", m) for m in msgs]
            for m, got in zip(sent, text, strict=True):
                assert got == (m["content"] or None), (m, got)  # the text as sent, its newlines as lines
            assert "\n" in text[1] and "<context id='task'" in text[1]
            calls = viewer.find_elements(By.CSS_SELECTOR, ".chat .tool-call")
            want = [c for m in sent for c in m.get("tool_calls", ())]
            assert [(c.get_attribute("data-tool"), c.get_attribute("data-call-id")) for c in calls] == [
                (c["function"]["name"], c["id"]) for c in want]
            for el, c in zip(calls, want, strict=True):
                args = {d.get_attribute("data-arg"): b.execute_script("return arguments[0].textContent", d)
                        for d in el.find_elements(By.CSS_SELECTOR, "dd.arg")}
                assert args == {k: v if isinstance(v, str) else json.dumps(v)
                                for k, v in json.loads(c["function"]["arguments"]).items()}
                assert args["text"].endswith("</b>\nsecond line")  # markup as text, a newline as a line break
            assert not viewer.find_elements(By.CSS_SELECTOR, ".chat b:not(.mono), .chat i")  # nothing ran as markup
            for el, m in zip(msgs, sent, strict=True):
                if m["role"] == "tool":
                    assert el.get_attribute("data-tool-call-id") == m["tool_call_id"]
                    head = " ".join(b.execute_script("return arguments[0].textContent", el.find_element(
                        By.CSS_SELECTOR, ".msg-head")).split())
                    assert head == f"tool result of note call {m['tool_call_id']}", head
            b.execute_script("arguments[0].scrollIntoView()", viewer)
            shot = artifact(tmp_path, "ui-conversation.png")
            assert viewer.screenshot(str(shot))
            print(f"screenshot: {shot}")
            # the raw bytes, one click away
            pre = viewer.find_element(By.CSS_SELECTOR, "pre.blob-text")
            assert b.execute_script("return arguments[0].textContent", pre) == ""
            viewer.find_element(By.CSS_SELECTOR, "details.raw-bytes summary").click()
            await until(b, lambda d: viewer.get_attribute("data-loaded") == "1", "the raw bytes")
            assert b.execute_script("return arguments[0].textContent", pre) == body.decode()
            # the output: the assistant's message as the model sent it, its call and arguments
            output = b.find_element(By.CSS_SELECTOR, '.viewer[data-key="long:t3#1:output"]')
            output.find_element(By.TAG_NAME, "summary").click()
            await until(b, lambda d: output.find_elements(By.CSS_SELECTOR, ".chat .msg"), "the output")
            assert output.find_element(By.CSS_SELECTOR, ".chat").get_attribute("data-kind") == "message"
            assert output.find_element(By.CSS_SELECTOR, ".msg").get_attribute("data-role") == "assistant"
            assert output.find_element(By.CSS_SELECTOR, ".tool-call").get_attribute("data-tool") == "note"
            as_page = viewer.find_element(By.CSS_SELECTOR, "a.as-chat").get_attribute("href")
        with chromium(tmp_path / "profile-nojs", javascript=False) as b:  # a page of its own, no script needed
            b.get(as_page)
            assert [m.get_attribute("data-role") for m in b.find_elements(By.CSS_SELECTOR, ".chat .msg")] == [
                m["role"] for m in sent]
            assert b.find_element(By.ID, "raw-bytes").get_attribute("href").endswith(
                f"/blobs/{turn.prompt_ref.sha256}?length=65536")


async def test_a_model_steps_prompt_reads_as_its_request_and_its_output_as_one_message(  # type: ignore[no-untyped-def]
        cfg, event_log: JetStreamEventLog, blobs: JetStreamBlobStore, tmp_path: Path) -> None:
    """A ``kind: model`` step's prompt is its request, an agent's first turn without tools (its instructions the
    system message, its packed context the user message): it opens as those messages; its output, the model's
    text, opens as one assistant message, its text as lines. (A text prompt of an older run opens as its one user
    message: tests/ui/test_chat.py.)"""
    from selenium.webdriver.common.by import By

    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "run", "examples/hello.yaml", "-q", env=env)
    assert code == 0, (out, err)
    run_id = re.search(r"run (r-[0-9a-f]{20}) created", out).group(1)  # type: ignore[union-attr]
    plan = build_episode_view(await event_log.load(run_id)).step("plan").attempts[-1]
    assert plan.prompt_ref is not None and plan.output_ref is not None
    sent = json.loads(await blobs.get(plan.prompt_ref))["messages"]
    assert [m["role"] for m in sent] == ["system", "user"] and "\n" in sent[1]["content"]
    output = (await blobs.get(plan.output_ref)).decode()
    async with reel_ui(cfg, env=env) as url:
        with chromium(tmp_path / "profile") as b:
            b.get(f"{url}/runs/{run_id}")
            for key, want in (("plan#1:prompt", sent), ("plan#1:output", [{"role": "assistant", "content": output}])):
                viewer = b.find_element(By.CSS_SELECTOR, f'.viewer[data-key="{key}"]')
                assert viewer.get_attribute("data-chat") == ("1" if key.endswith("prompt") else "assistant")
                viewer.find_element(By.CSS_SELECTOR, "summary .dim").click()  # (its centre may be the copy button)
                await until(b, lambda d, v=viewer: v.find_elements(By.CSS_SELECTOR, ".chat .msg"), key)
                msgs = viewer.find_elements(By.CSS_SELECTOR, ".chat .msg")
                assert [m.get_attribute("data-role") for m in msgs] == [m["role"] for m in want]
                assert [b.execute_script("return arguments[0].querySelector('.msg-text').textContent", m)
                        for m in msgs] == [m["content"] for m in want]
