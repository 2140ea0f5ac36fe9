"""Chat types of the model port, and the OpenAI chat-completions wire format (docs/models.md).

Pure: no I/O. A :class:`ChatRequest` is what an agent turn asks a model;
:func:`wire_request` is the exact chat-completions body sent for it (the executor
stores it as the prompt blob *before* the call, and the ``openai`` adapter sends
exactly it); :func:`response_from_wire` reads a provider's answer into a
:class:`ChatResponse`, whose ``message`` is the response message exactly as the
provider sent it (the output blob). Tool-call ids are kept as the provider gave
them; only empty or duplicate ones are replaced (:func:`assign_call_ids`).

Source: the OpenAI chat-completions API reference (request ``messages``/``tools``,
response ``choices[0].message``, ``usage``), which vLLM, llama.cpp's server,
Ollama and LiteLLM serve.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

import msgspec

from reel.shared.core.errors import ModelError, ToolCallInvalid
from reel.shared.core.run.eventfields import UsageSource
from reel.shared.core.wire import limits
from reel.shared.core.workflow.modelcompat import ToolCallContent
from reel.shared.core.workflow.modelspec import ModelSpec

Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One call a model asked for.

    Attributes:
        id: the provider's call id (echoed back unchanged as the tool message's ``tool_call_id``).
        name: the tool named (may be one that was never declared).
        arguments: the raw JSON text exactly as the provider returned it (may be malformed).
    """

    id: str
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a JSON object; blank text counts as ``{}``.

        Raises:
            ToolCallInvalid: the text is not JSON, not a JSON object, or nested deeper than
                :data:`~reel.shared.core.wire.limits.MAX_DEPTH` (message names call and tool).
        """
        if not self.arguments.strip():
            return {}
        if limits.json_deeper_than(self.arguments):
            raise ToolCallInvalid(f"arguments of tool call {self.id!r} ({self.name}) are {limits.too_deep()}",
                                  call_id=self.id, name=self.name)
        try:
            value = msgspec.json.decode(self.arguments)
        except msgspec.DecodeError as exc:
            raise ToolCallInvalid(f"arguments of tool call {self.id!r} ({self.name}) are not valid JSON: {exc}",
                                  call_id=self.id, name=self.name) from None
        if not isinstance(value, dict):
            raise ToolCallInvalid(f"arguments of tool call {self.id!r} ({self.name}) must be a JSON object, got "
                                  f"{type(value).__name__}", call_id=self.id, name=self.name)
        return value


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message of a chat transcript.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        content: the text (None: an assistant message that only calls tools).
        tool_calls: the calls of an assistant message.
        tool_call_id: which call a ``tool`` message answers.
        name: optional participant name.
    """

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


class ToolSchema(msgspec.Struct, frozen=True, kw_only=True):
    """A tool the model may call: name, description, JSON Schema of its arguments object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})


class ChatRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What one attempt of one turn asks a chat model.

    Attributes:
        run_id, step_id: for logs (not sent).
        attempt: 1-based attempt of this turn (scripted models choose failures by it; not sent).
        turn: 1-based turn of the agent step (scripted models choose their answer by it; not sent).
        messages: the transcript sent.
        tools: the tools offered (empty: none).
        params: extra body fields (temperature, …), from the spec.
        model: the model name sent.
        stream: ask for a streamed response (the spec's ``stream: true``, unless its profile streams no
            turn that offers tools): the body ends with ``"stream": true, "stream_options": {"include_usage": true}``.
        tool_call_content: the ``content`` sent for an assistant message with tool calls and no text
            (``empty``: ``""``; ``null``; ``omit``: no key), from the spec's profile.
        parallel_tool_calls: sent as ``parallel_tool_calls`` when tools are offered (None: not sent).
        prompt_tokens: the messages' tokens as Reel packed them (a ``kind: model`` step's packed items,
            instructions included; not sent): what an adapter that estimates usage counts in. ``None``: it counts the
            messages itself.
    """

    run_id: str
    step_id: str
    attempt: int = 1
    turn: int = 1
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSchema, ...] = ()
    params: dict[str, Any] = {}
    model: str = ""
    stream: bool = False
    tool_call_content: ToolCallContent = "empty"
    parallel_tool_calls: bool | None = None
    prompt_tokens: int | None = None


class ChatResponse(msgspec.Struct, frozen=True, kw_only=True):
    """A chat model's answer.

    Attributes:
        text: the assistant text ("" when it only calls tools).
        tool_calls: its calls, ids unique and non-empty (see :func:`assign_call_ids`).
        finish_reason: the provider's, as sent (``stop``, ``tool_calls``, ``length``, ``content_filter``,
            any other string as-is; ``None``: it sent none).
        input_tokens, output_tokens: usage (tokens); cost_usd: from the spec's price (USD).
        usage_source: where the token counts come from (``reported`` by the server, ``estimated`` by
            Reel's counter, ``recorded`` in a recording; :data:`~reel.shared.core.run.eventfields.UsageSource`).
        model: the model that answered, as the provider named it.
        message: the response message exactly as the provider sent it (the output blob).
    """

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = "stop"
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    model: str = ""
    message: dict[str, Any] = {}
    usage_source: UsageSource = "reported"

    def assistant_message(self) -> ChatMessage:
        """The message to put in the next turn's transcript (with Reel's ids where it assigned any)."""
        return ChatMessage(role="assistant", content=self.text or None, tool_calls=self.tool_calls)


def chat_request(spec: ModelSpec, *, run_id: str, step_id: str, messages: Sequence[ChatMessage],
                 tools: Sequence[ToolSchema] = (), attempt: int = 1, turn: int = 1) -> ChatRequest:
    """A request for the model ``spec`` names: its model name, params and wire settings
    (:attr:`ModelSpec.wire_compat`) filled in; streamed when the spec streams and the profile
    streams turns with ``tools`` (or none are offered)."""
    compat = spec.wire_compat
    return ChatRequest(run_id=run_id, step_id=step_id, attempt=attempt, turn=turn, messages=tuple(messages),
                       tools=tuple(tools), params=spec.request_params, model=spec.model_name,
                       stream=spec.streams and (compat.stream_tool_turns or not tools),
                       tool_call_content=compat.tool_call_content, parallel_tool_calls=compat.parallel_tool_calls)


def prompt_request(spec: ModelSpec, *, run_id: str, step_id: str, attempt: int, prompt: str,
                   prompt_tokens: int) -> ChatRequest:
    """A request of one user message, ``prompt``, and no tools (``prompt_tokens``: its tokens as counted) — a
    proposer's question (services/crucible); a ``kind: model`` step's request is an agent's first turn
    (:func:`reel.shared.core.agent.turncontext.model_turn`)."""
    return msgspec.structs.replace(chat_request(spec, run_id=run_id, step_id=step_id, attempt=attempt, messages=(
        ChatMessage(role="user", content=prompt),)), prompt_tokens=prompt_tokens)


def wire_call(call: ToolCall) -> dict[str, Any]:
    """A tool call in the wire format: ``{id, type: function, function: {name, arguments}}``."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def wire_message(m: ChatMessage, tool_call_content: ToolCallContent = "empty") -> dict[str, Any]:
    """One message in the wire format: ``content`` is the text, ``""`` when there is none — except for a
    message with tool calls and no text, whose ``content`` ``tool_call_content`` says (``empty``: ``""``,
    ``null``, ``omit``: no key)."""
    out: dict[str, Any] = {"role": m.role}
    if m.content is not None:
        out["content"] = m.content
    elif not m.tool_calls or tool_call_content == "empty":
        out["content"] = ""
    elif tool_call_content == "null":
        out["content"] = None
    if m.tool_calls:
        out["tool_calls"] = [wire_call(c) for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def wire_tool(t: ToolSchema) -> dict[str, Any]:
    """A tool schema in the wire format: ``{type: function, function: {name, description?, parameters}}``."""
    fn: dict[str, Any] = {"name": t.name}
    if t.description:
        fn["description"] = t.description
    fn["parameters"] = t.parameters
    return {"type": "function", "function": fn}


def wire_request(req: ChatRequest) -> dict[str, Any]:
    """The exact chat-completions request body for ``req``: model, messages, tools (if any), then params;
    when tools are offered, ``tool_choice: "auto"`` and ``req.parallel_tool_calls`` (if set) unless params
    set them; then (``req.stream``) ``stream: true`` and ``stream_options: {include_usage: true}``.

    ``params`` never override model, messages, tools or stream (workflow validation refuses such params).
    Some servers (llama-cpp-python's) take a missing ``tool_choice`` for ``none``: it is always sent.
    """
    body: dict[str, Any] = {"model": req.model,
                            "messages": [wire_message(m, req.tool_call_content) for m in req.messages]}
    if req.tools:
        body["tools"] = [wire_tool(t) for t in req.tools]
    body.update((k, v) for k, v in req.params.items() if k not in body)
    if req.tools:
        body.setdefault("tool_choice", "auto")
        if req.parallel_tool_calls is not None:
            body.setdefault("parallel_tool_calls", req.parallel_tool_calls)
    if req.stream:
        body["stream"], body["stream_options"] = True, {"include_usage": True}
    return body


def assign_call_ids(calls: Sequence[ToolCall], *, turn: int, taken: Collection[str] = ()) -> tuple[ToolCall, ...]:
    """``calls`` with every empty or repeated id replaced by ``call_t<turn>_<i>`` (i = position).

    Provider ids that are non-empty and unique (also against ``taken``, e.g. the transcript's
    earlier ids) are kept unchanged. Deterministic: the same calls give the same ids.
    """
    seen: set[str] = set(taken)
    out: list[ToolCall] = []
    for i, call in enumerate(calls):
        new_id = call.id
        if not new_id or new_id in seen:
            new_id, n = f"call_t{turn}_{i}", 1
            while new_id in seen:
                new_id, n = f"call_t{turn}_{i}_{n}", n + 1
        seen.add(new_id)
        out.append(call if new_id == call.id else msgspec.structs.replace(call, id=new_id))
    return tuple(out)


def _malformed(what: str) -> ModelError:
    return ModelError(f"malformed chat-completions response: {what}", kind="malformed_response", retryable=True)


def _read_calls(raw: Any) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _malformed("`tool_calls` is not a list")
    calls = []
    for i, c in enumerate(raw):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _malformed(f"tool call {i} has no function name")
        args = fn.get("arguments")
        # A provider that sends an object instead of its JSON text: keep it, canonically encoded.
        text = args if isinstance(args, str) else "" if args is None else msgspec.json.encode(args).decode()
        calls.append(ToolCall(id=str(c.get("id") or ""), name=fn["name"], arguments=text))
    return tuple(calls)


def response_from_wire(body: Mapping[str, Any], *, turn: int, spec: ModelSpec,
                       taken: Collection[str] = ()) -> ChatResponse:
    """Read a chat-completions response body (``choices[0]``, ``usage``, ``model``).

    Tokens are the provider's ``usage`` (``usage_source`` ``reported``; 0 and ``none`` when it reports
    none); cost is ``spec``'s price; the finish reason is ``choices[0].finish_reason`` as sent (a
    non-string kept as its JSON text; ``None`` when absent or null).

    Raises:
        ModelError: ``empty_response`` (no choice, or neither text nor tool calls) or
            ``malformed_response`` — both retryable; an empty one carries the usage and cost reported.
    """
    reported = isinstance(body.get("usage"), dict)
    usage = body.get("usage") if reported else {}
    assert isinstance(usage, dict)
    tokens_in, tokens_out = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    cost = spec.cost_usd(tokens_in, tokens_out)

    def empty(what: str) -> ModelError:
        return ModelError(f"empty response: {what}", kind="empty_response", retryable=True, cost_usd=cost,
                          input_tokens=tokens_in, output_tokens=tokens_out,
                          usage_source="reported" if reported else "none")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise empty("no choices")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise _malformed("`choices[0].message` is not an object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _malformed("`content` is not a string")
    calls = assign_call_ids(_read_calls(message.get("tool_calls")), turn=turn, taken=taken)
    if not content and not calls:
        raise empty("neither content nor tool calls")
    return ChatResponse(text=content or "", tool_calls=calls, finish_reason=finish_reason_of(choice),
                        input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost,
                        model=str(body.get("model") or spec.model_name), message=dict(message),
                        usage_source="reported" if reported else "none")


def finish_reason_of(choice: Mapping[str, Any]) -> str | None:
    """``choice["finish_reason"]`` as the server sent it: a string as-is, ``None`` when absent or null,
    anything else as its JSON text."""
    value = choice.get("finish_reason")
    if value is None or isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def flatten(messages: Sequence[ChatMessage]) -> str:
    """A transcript as one text (what an estimating adapter counts).

    Each message becomes ``[role] content`` (tool calls as ``call name(arguments)``,
    tool results as ``[tool <id>] content``), separated by blank lines.
    """
    parts = []
    for m in messages:
        head = f"[tool {m.tool_call_id}]" if m.role == "tool" else f"[{m.role}]"
        body = [m.content] if m.content else []
        body += [f"call {c.name}({c.arguments})" for c in m.tool_calls]
        parts.append(head + " " + "\n".join(body))
    return "\n\n".join(parts)
