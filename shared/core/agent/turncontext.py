"""The context of an agent turn: candidates, packing, and the chat messages sent.

Candidates of turn *t* of agent ``solve``, in candidate (= prompt) order, each with a stable id:

==========================  ===========  =========================================================
id                          kind         packing
==========================  ===========  =========================================================
``instructions``            ``system``   required (always packed, first)
the step's ``context:``     as declared  ``task`` items required; the others as in a model step
``solve:t<k>:msg``          assistant    group ``solve:t<k>`` with the turn's results: packed or
``solve:t<k>:c<i>:obs``     tool         left out together (k < t)
==========================  ===========  =========================================================

Packed items become a valid chat transcript (:func:`turn_messages`): one ``system``
message (the instructions), one ``user`` message (the packed context items, rendered
as a model step renders them), then per packed turn its ``assistant`` message —
text from the turn's output blob, tool calls from the log's declarations (the ids the
model is answered with) — followed by one ``tool`` message per call, in call order,
answering its ``tool_call_id``. A failed call's result reads ``error (<kind>): <message>``; a call a
human rejected ``error (rejected): … <note>``, an ``ask_user`` call the answer, and a call approved with
edited arguments starts with them (:func:`reel.shared.core.input.requestfold.observation`, ``edited_prefix``).

A tool result longer than :func:`result_max_tokens` (half the turn's budget for candidates, or the policy's
``max_item_tokens`` when lower) is cut to its head and tail, with a note between them saying how much was left
out (:func:`cut_result`), and listed in the partition's ``trimmed``: a result too large to pack whole would
otherwise take its whole turn out of the transcript, and the model would not know it had called the tool.

Two passes keep this pure: :func:`needed_blobs` lists the blobs to read, then
:func:`build_turn` makes the request from their bodies.

A ``kind: model`` step is the first turn of an agent without tools (:func:`model_turn`): the
same head items, packing and messages, plus its ``include_previous_outputs`` items.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.agent.actions import DispatchTurn
from reel.shared.core.agent.turnstate import Declared, TurnRecord
from reel.shared.core.chat.messages import ChatMessage, ChatRequest, ToolCall, ToolSchema, chat_request, wire_tool
from reel.shared.core.input import requestfold
from reel.shared.core.pack.packer import Candidate, Packed, PackPolicy, accounted, pack, reserving
from reel.shared.core.run.events import AttemptEnd, AttemptFailed, AttemptSucceeded, BlobRef
from reel.shared.core.run.ids import BranchId, ContextItemId, StepId
from reel.shared.core.run.planning import TextFacts, policy_for, trimmed_text
from reel.shared.core.run.state import AttemptStatus, BranchState, RunState, final_success
from reel.shared.core.run.stepids import message_item_id, observation_item_id
from reel.shared.core.workflow.spec import AgentStep, ModelStep, WorkflowSpec

INSTRUCTIONS = ContextItemId("instructions")


class TurnItem(msgspec.Struct, frozen=True, kw_only=True):
    """One candidate item of a turn and what it becomes in the transcript.

    Attributes:
        kind: ``system``, a context item's kind, ``assistant`` or ``tool``.
        text: the message content (what is counted and sent).
        group: the turn (``solve:t<k>``) whose message and results are packed together.
        tool_calls: an assistant item's calls; tool_call_id: which call a tool item answers.
        is_error: a tool item holding a failed call's error.
        trimmed: a tool item whose result was cut to fit (:func:`cut_result`).
    """

    id: ContextItemId
    kind: str
    text: str
    group: str | None = None
    required: bool = False
    priority: float = 0.0
    stale: bool = False
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    is_error: bool = False
    trimmed: bool = False


class TurnContext(msgspec.Struct, frozen=True, kw_only=True):
    """Turn *t*'s candidates, their partition (for the intent) and the request (its ``wire_request`` is the prompt)."""

    items: tuple[TurnItem, ...]
    packed: Packed
    request: ChatRequest


def _observation(branch: BranchState, call: Declared,
                 outcomes: Mapping[str, AttemptEnd]) -> AttemptEnd | BlobRef | None:
    """A call's result: an outcome not yet folded, else its final success's output ref, else its last failure."""
    if call.decl.step_id in outcomes:
        return outcomes[call.decl.step_id]
    attempts = branch.attempts.get(call.decl.step_id, ())
    win = final_success(attempts)
    if win is not None:
        return win.output_ref
    failed = [a for a in attempts if a.status == AttemptStatus.FAILED]
    if not failed:
        return None
    last = failed[-1]
    return AttemptFailed(branch_id=branch.branch_id, step_id=last.step_id, attempt=last.attempt, at_ms=0,
                         error_kind=last.error_kind or "error", message=last.error_message or "")


EarlierTurn = tuple[StepId, BlobRef | None, tuple[Declared, ...]]
"""One earlier turn: its step id, its answer's output ref (``None`` before it succeeded), its declared calls."""


def earlier_turn(branch: BranchState, t: TurnRecord) -> EarlierTurn:
    """What the context reads of one declared turn ``t`` on ``branch``."""
    win = final_success(branch.attempts.get(t.decl.step_id, ()))
    return t.decl.step_id, win.output_ref if win is not None else None, t.calls


def _earlier_turns(state: RunState, branch_id: BranchId, agent: StepId, turn: int) -> list[EarlierTurn]:
    branch = state.branches[branch_id]
    rec = turnfold.record(branch, agent)
    return [earlier_turn(branch, t) for t in (rec.turns[:turn - 1] if rec is not None else [])]


def turn_refs(branch: BranchState, earlier: EarlierTurn, by_step: Mapping[str, AttemptEnd]) -> list[BlobRef]:
    """The blobs :func:`group_items` reads for one earlier turn: its answer, its calls' large arguments and results."""
    _, answer, calls = earlier
    refs: list[BlobRef] = [answer] if answer is not None else []
    for c in calls:
        if c.decl.arguments_ref is not None:
            refs.append(c.decl.arguments_ref)
        obs = _observation(branch, c, by_step)
        if isinstance(obs, BlobRef):
            refs.append(obs)
        elif isinstance(obs, AttemptSucceeded):
            refs.append(obs.output_ref)
    return refs


def needed_blobs(state: RunState, branch_id: BranchId, agent: StepId, turn: int,
                 outcomes: Sequence[AttemptEnd] = ()) -> list[BlobRef]:
    """Every blob :func:`build_turn` reads for turn ``turn``: earlier answers, results and large arguments."""
    branch = state.branches[branch_id]
    by_step: dict[str, AttemptEnd] = {o.step_id: o for o in outcomes}
    refs = [r for t in _earlier_turns(state, branch_id, agent, turn) for r in turn_refs(branch, t, by_step)]
    return list({r.sha256: r for r in refs}.values())


def message_text(body: bytes) -> str:
    """The ``content`` of an assistant-message output blob (the exact response message); the body itself when it
    is not such a JSON object."""
    try:
        message = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body.decode(errors="replace")
    if isinstance(message, dict):
        content = message.get("content")
        return content if isinstance(content, str) else ""
    return body.decode(errors="replace")


def head_items(agent: AgentStep | ModelStep, outputs: Mapping[str, str]) -> list[TurnItem]:
    """The items every turn starts with, in order: the instructions, then the step's ``context:`` items
    (``outputs``: output texts of the earlier steps they name, ``from_step``) — an agent's, or a ``kind: model``
    step's (:func:`model_turn`)."""
    items: list[TurnItem] = []
    if agent.instructions:
        items.append(TurnItem(id=INSTRUCTIONS, kind="system", text=agent.instructions, required=True))
    for ci in agent.context:
        text = ci.text if ci.text is not None else outputs.get(ci.from_step or "", "")
        items.append(TurnItem(id=ContextItemId(ci.id), kind=ci.kind, text=text, required=ci.kind == "task",
                              priority=ci.priority, stale=ci.stale))
    return items


def result_max_tokens(policy: PackPolicy) -> int:
    """The most tokens one tool result is packed with under ``policy`` (the turn's policy, its tool schemas'
    tokens taken off the budget): half its budget, or its ``max_item_tokens`` when lower; at least 1."""
    half = policy.budget_tokens // 2
    return max(1, half if policy.max_item_tokens is None else min(half, policy.max_item_tokens))


def cut_result(text: str, max_tokens: int, facts: TextFacts) -> str | None:
    """``text`` cut to at most ``max_tokens`` tokens as ``facts`` counts them: its head and its tail (bytes, about
    half each) with a note between them saying how many of its bytes were left out
    (:func:`reel.shared.core.run.planning.trimmed_text`); ``None`` when it fits whole. Pure and deterministic."""
    tokens = facts(text)[0]
    if tokens <= max_tokens:
        return None
    body = text.encode()
    keep = len(body) * max_tokens // tokens
    while True:
        half = max(0, keep // 2)
        cut = trimmed_text(body[:half], body[len(body) - half:] if half else b"", len(body))
        if keep <= 0 or facts(cut)[0] <= max_tokens:
            return cut
        keep = keep * 4 // 5


def group_items(branch: BranchState, earlier: EarlierTurn, *, blobs: Mapping[str, bytes],
                by_step: Mapping[str, AttemptEnd], fit: tuple[int, TextFacts] | None = None) -> list[TurnItem]:
    """One earlier turn's items, in order: its assistant message, then one tool item per call (group: the turn).

    A pure function of the turn's record, the attempts and input requests of the turn and its calls,
    ``by_step`` (outcomes not folded yet, by step id), the bodies of :func:`turn_refs` and ``fit``:
    ``(max tokens, facts)``, a result longer than ``max tokens`` is cut (:func:`cut_result`; ``None``: none is).

    Raises:
        KeyError: a blob of :func:`turn_refs` is missing from ``blobs``.
    """
    turn_id, answer, calls = earlier
    content = message_text(blobs[answer.sha256]) if answer is not None else ""
    tool_calls = tuple(ToolCall(id=c.decl.call_id or "", name=c.decl.tool_name or "", arguments=(
        c.decl.arguments if c.decl.arguments_ref is None else blobs[c.decl.arguments_ref.sha256].decode()
    ) or "{}") for c in calls)
    items = [TurnItem(id=message_item_id(turn_id), kind="assistant", text=content, group=turn_id,
                      tool_calls=tool_calls)]
    for c, call in zip(calls, tool_calls, strict=True):
        obs = _observation(branch, c, by_step)
        answered = requestfold.observation(branch, c.decl.step_id)
        if answered is not None:
            text, err = answered
        elif isinstance(obs, AttemptFailed):
            text, err = f"error ({obs.error_kind}): {obs.message}", True
        else:
            ref = obs.output_ref if isinstance(obs, AttemptSucceeded) else obs
            text, err = (blobs[ref.sha256].decode(errors="replace") if ref is not None else ""), False
        text = requestfold.edited_prefix(branch, c.decl.step_id) + text
        cut = cut_result(text, *fit) if fit is not None else None
        items.append(TurnItem(id=observation_item_id(c.decl.step_id), kind="tool", text=text if cut is None else cut,
                              group=turn_id, tool_call_id=call.id, is_error=err, trimmed=cut is not None))
    return items


def with_trimmed(packed: Packed, items: Sequence[TurnItem]) -> Packed:
    """``packed`` with the tool results :func:`group_items` cut listed in its partition's ``trimmed``."""
    cut = tuple(i.id for i in items if i.trimmed)
    if not cut:
        return packed
    return msgspec.structs.replace(packed, partition=msgspec.structs.replace(packed.partition, trimmed=cut))


def turn_items(state: RunState, branch_id: BranchId, agent: AgentStep, turn: int, *, outputs: Mapping[str, str],
               blobs: Mapping[str, bytes], outcomes: Sequence[AttemptEnd] = (),
               fit: tuple[int, TextFacts] | None = None) -> list[TurnItem]:
    """The candidate items of turn ``turn``, in candidate order (see the module docstring):
    :func:`head_items`, then :func:`group_items` of each earlier turn.

    Args:
        outputs: output texts of the earlier steps the context items name (``from_step``).
        blobs: sha256 → body of every blob of :func:`needed_blobs`.
        outcomes: call outcomes about to be committed with this turn's intent (not folded yet).
        fit: ``(max tokens, facts)`` of a tool result (:func:`group_items`).

    Raises:
        KeyError: a blob of :func:`needed_blobs` is missing from ``blobs``.
    """
    branch = state.branches[branch_id]
    by_step: dict[str, AttemptEnd] = {o.step_id: o for o in outcomes}
    items = head_items(agent, outputs)
    for earlier in _earlier_turns(state, branch_id, StepId(agent.id), turn):
        items += group_items(branch, earlier, blobs=blobs, by_step=by_step, fit=fit)
    return items


def counted_text(item: TurnItem) -> str:
    """What an item's token estimate counts: its text, plus the names and arguments of its calls."""
    if not item.tool_calls:
        return item.text
    return "\n".join([item.text, *(f"{c.name} {c.arguments}" for c in item.tool_calls)])


def turn_candidates(items: Sequence[TurnItem], facts: TextFacts) -> list[Candidate]:
    """Packer candidates of the items (token estimates and hashes memoized in ``facts``)."""
    out = []
    for i in items:
        tokens, digest = facts(counted_text(i))
        out.append(Candidate(id=i.id, kind=i.kind, tokens=tokens, priority=i.priority, stale=i.stale,
                             content_hash=digest, group=i.group, required=i.required))
    return out


def item_message(item: TurnItem) -> ChatMessage:
    """The transcript message of a turn's item (:func:`group_items`): the assistant's, or a tool result."""
    if item.kind == "assistant":
        return ChatMessage(role="assistant", content=item.text or None, tool_calls=item.tool_calls)
    return ChatMessage(role="tool", content=item.text, tool_call_id=item.tool_call_id)


def turn_messages(items: Sequence[TurnItem], packed: Sequence[str]) -> tuple[ChatMessage, ...]:
    """The transcript of the packed items: system, one user message of the context items, then each packed turn's
    assistant message followed by its tool results (see the module docstring)."""
    by_id = {i.id: i for i in items}
    chosen = [by_id[ContextItemId(p)] for p in packed]
    out: list[ChatMessage] = [ChatMessage(role="system", content=i.text) for i in chosen if i.kind == "system"]
    context = [i for i in chosen if i.group is None and i.kind != "system"]
    if context:
        out.append(ChatMessage(role="user", content="\n\n".join(
            f"<context id={i.id!r} kind={i.kind!r}>\n{i.text}\n</context>" for i in context)))
    out += [item_message(i) for i in chosen if i.kind == "assistant" or i.group is not None]
    return tuple(out)


def tool_schemas(agent: AgentStep) -> tuple[ToolSchema, ...]:
    """The tools offered to the model: name, description, parameters (JSON Schema)."""
    return tuple(ToolSchema(name=t.name, description=t.about, parameters=t.schema) for t in agent.tools)


def tools_tokens(tools: Sequence[ToolSchema], facts: TextFacts) -> int:
    """Tokens of the tool schemas exactly as sent: the JSON text of the request's ``tools`` (0 for none)."""
    if not tools:
        return 0
    return facts(msgspec.json.encode([wire_tool(t) for t in tools]).decode())[0]


def turn_policy(agent: AgentStep, spec: WorkflowSpec, facts: TextFacts) -> tuple[PackPolicy, int, int]:
    """The turn's packing policy, its budget less the tool schemas' tokens (:func:`tools_tokens`); those
    tokens (recorded as the partition's ``reserved_tokens``); and the whole budget (``budget_tokens``)."""
    reserved = tools_tokens(tool_schemas(agent), facts)
    policy = policy_for(agent, spec)
    return reserving(policy, reserved), reserved, policy.budget_tokens


def build_turn(state: RunState, action: DispatchTurn, agent: AgentStep, spec: WorkflowSpec, *, run_outputs: Mapping[
        str, str], blobs: Mapping[str, bytes], facts: TextFacts, outcomes: Sequence[AttemptEnd] = ()) -> TurnContext:
    """Candidates → partition → request of ``action``'s turn (the intent's ``context``; ``wire_request(request)``
    is the prompt blob).

    Raises:
        KeyError: a blob of :func:`needed_blobs` is missing from ``blobs``.
    """
    policy, reserved, budget = turn_policy(agent, spec, facts)
    items = turn_items(state, action.branch_id, agent, action.turn, outputs=run_outputs, blobs=blobs,
                       outcomes=outcomes, fit=(result_max_tokens(policy), facts))
    packed = with_trimmed(accounted(pack(turn_candidates(items, facts), policy), reserved, facts.counter.name,
                                    budget), items)
    messages = turn_messages(items, packed.partition.packed)
    request = chat_request(agent.model, run_id=state.run_id, step_id=action.step_id, messages=messages,
                           tools=tool_schemas(agent), attempt=action.attempt, turn=action.turn)
    return TurnContext(items=tuple(items), packed=packed, request=request)


def previous_outputs(step: ModelStep, spec: WorkflowSpec, outputs: Mapping[str, str]) -> list[TurnItem]:
    """A model step's ``include_previous_outputs`` items: every earlier step's output (of those in ``outputs``)
    as ``out-<step>`` (kind ``output``), in step order, unless its ``context:`` has that id already."""
    if not step.include_previous_outputs:
        return []
    have = {i.id for i in step.context}
    items: list[TurnItem] = []
    for s in spec.steps:
        if s.id == step.id:
            break
        if f"out-{s.id}" not in have and s.id in outputs:
            items.append(TurnItem(id=ContextItemId(f"out-{s.id}"), kind="output", text=outputs[s.id]))
    return items


def model_items(step: ModelStep, spec: WorkflowSpec, outputs: Mapping[str, str]) -> list[TurnItem]:
    """A model step's candidate items, in candidate (= prompt) order: those of the first turn of an agent with
    its instructions and ``context:`` (:func:`head_items`), then :func:`previous_outputs`."""
    return head_items(step, outputs) + previous_outputs(step, spec, outputs)


def model_turn(step: ModelStep, spec: WorkflowSpec, *, run_id: str, attempt: int, outputs: Mapping[str, str],
               facts: TextFacts, trimmed: Collection[str] = ()) -> TurnContext:
    """A ``kind: model`` step's attempt as what it is: the first turn of an agent without tools — candidates
    (:func:`model_items`) → partition → request, as :func:`build_turn` makes turn 1's. The request's
    ``prompt_tokens`` is the packed tokens (what an estimating adapter reports). ``trimmed``: the earlier
    steps whose outputs were read only in part (:func:`reel.shared.core.run.planning.trimmed_text`); the items
    holding them are listed in the partition's ``trimmed``."""
    items = model_items(step, spec, outputs)
    policy = policy_for(step, spec)
    packed = accounted(pack(turn_candidates(items, facts), policy), 0, facts.counter.name, policy.budget_tokens)
    if trimmed:  # recorded beside the buckets: what was cut before packing (never silent)
        declared = {i.id for i in step.context}
        cut = {i.id for i in step.context if i.from_step in trimmed} | {
            f"out-{s}" for s in trimmed if f"out-{s}" not in declared}
        packed = msgspec.structs.replace(packed, partition=msgspec.structs.replace(
            packed.partition, trimmed=tuple(i.id for i in items if i.id in cut)))
    request = chat_request(step.model, run_id=run_id, step_id=step.id, messages=turn_messages(
        items, packed.partition.packed), attempt=attempt)
    request = msgspec.structs.replace(request, prompt_tokens=packed.packed_tokens)
    return TurnContext(items=tuple(items), packed=packed, request=request)
