"""The Python API's pure half: ``@reel.tool`` schemas and ``reel.Agent`` as the workflow a YAML file would be."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import msgspec
import pytest

import reel
from reel._tool import python_path
from reel.shared.core.workflow.spec import encode_workflow, load_workflow

REPO = Path(__file__).resolve().parents[2]


class Point(msgspec.Struct):
    x: int
    y: int = 0


@reel.tool
def shift(p: Point, dx: int = 1, *, idempotency_key: str = "", attempt: int = 0) -> Point:
    """Move a point right.

    Longer text the model does not see.

    Args:
        p: the point
            to move.
        dx: how far (units).
    """
    return Point(x=p.x + dx, y=p.y)


def test_schema_comes_from_hints_and_docstring() -> None:
    s = shift.spec
    assert s.name == "shift" and s.description == "Move a point right."
    assert s.python == f"{__name__}:shift"
    props = s.parameters["properties"]
    assert set(props) == {"p", "dx"}  # idempotency_key / attempt are filled in by the executor
    assert props["p"]["description"] == "the point to move."
    assert props["dx"] == {"type": "integer", "default": 1, "description": "how far (units)."}
    assert s.parameters["required"] == ["p"] and s.parameters["additionalProperties"] is False
    assert s.parameters["$defs"]["Point"]["properties"]["x"] == {"type": "integer"}


def test_a_decorated_function_is_still_callable_and_served_with_typed_arguments() -> None:
    assert shift(Point(x=1), 2) == Point(x=3)
    out = shift.served(p={"x": 1, "y": 5}, dx=2, idempotency_key="r/b/s", attempt=1)
    assert out == Point(x=3, y=5)  # the JSON object became a Point
    assert "idempotency_key" in inspect.signature(shift.served).parameters  # the executor sees what it asks for


def test_options_and_async_functions() -> None:
    @reel.tool(name="fetch-page", retry_safe=True, needs_approval=True, timeout_s=5, max_output_bytes=100)
    async def fetch(url: str) -> str:
        return url

    assert fetch.spec.name == "fetch-page" and fetch.spec.retry_safe and fetch.spec.needs_approval
    assert fetch.spec.timeout_s == 5 and fetch.spec.max_output_bytes == 100
    assert inspect.iscoroutinefunction(fetch.served)
    assert asyncio.run(fetch.served(url="u")) == "u"
    assert python_path(lambda: 0, "x-y").endswith(":x_y")


def test_bad_tools_are_refused_at_definition() -> None:
    with pytest.raises(TypeError, match=r"\*args"):
        reel.tool(lambda *a: a)
    with pytest.raises(reel.WorkflowInvalid, match="tool name"):
        reel.tool(name="no spaces allowed")(lambda: 0)


def test_agent_needs_only_name_instructions_model_and_input_is_the_task() -> None:
    agent = reel.Agent(name="hi", instructions="Say hi.", model=reel.ScriptedModel(turns=[{"text": "hi"}]))
    spec = agent.workflow("Greet me.")
    step = spec.agent("hi")
    assert step.id == "hi" and step.context[0].kind == "task" and step.context[0].text == "Greet me."
    with pytest.raises(reel.WorkflowInvalid, match=r"no task: give the request as input=.*kind `task`"):
        agent.workflow()  # no task at all: says how to give one


def test_a_plain_function_among_the_tools_says_to_decorate_it() -> None:
    def shout(text: str) -> str:
        return text.upper()
    with pytest.raises(TypeError, match=r"tools\[0\] is the function 'shout'.*@reel\.tool"):
        reel.Agent(name="a", instructions="x", model=reel.ScriptedModel(turns=[{"text": "ok"}]),
                   tools=[shout])  # type: ignore[list-item]


def test_openai_model_is_the_yaml_block() -> None:
    m = reel.OpenAIModel(base_url="http://127.0.0.1:8000/v1", model="m", api_key_env="MY_KEY").spec()
    assert (m.adapter, m.base_url, m.model, m.api_key_env) == ("openai", "http://127.0.0.1:8000/v1", "m", "MY_KEY")
    assert msgspec.json.encode(m) == msgspec.json.encode(msgspec.convert(
        {"adapter": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "m", "api_key_env": "MY_KEY"},
        reel.ModelSpec))


def test_the_shipped_agent_example_written_in_python_encodes_byte_for_byte_as_its_yaml() -> None:
    yaml_spec = load_workflow(REPO / "examples/agent/fix_typo.yaml")
    step = yaml_spec.agent("fix")
    turns = msgspec.to_builtins(step.model.turns)
    from examples.agent.tools import read_file, write_file

    read = reel.tool(read_file, description="Read a text file of the project.",
                     parameters=step.tools[0].parameters, retry_safe=True)
    write = reel.tool(write_file, description="Replace a file of the project with new content.",
                      parameters=step.tools[1].parameters, retry_safe=True)
    run_tests = reel.command_tool("run_tests", ["python3", "examples/agent/run_tests.py"], retry_safe=True,
                                  description=step.tools[2].description, parameters=step.tools[2].parameters)
    agent = reel.Agent(
        name="fix-typo", step_id="fix", description=yaml_spec.description, budget_tokens=1400, max_turns=8,
        max_attempts=2, instructions=step.instructions,
        model=reel.ScriptedModel(name="scripted-typo-fixer", turns=turns),
        context=[reel.ContextItem(id="layout", kind="document", priority=1, text=step.context[1].text),
                 reel.ContextItem(id="old-notes", kind="document", stale=True, text=step.context[2].text)],
        tools=[read, write, run_tests], workspace=reel.Workspace(from_="project"),
        verifiers=[reel.Verifier(type="command", name="tests-pass", step="fix",
                                 argv=("python3", "examples/agent/run_tests.py"))])
    assert read.path == "examples.agent.tools:read_file"
    assert encode_workflow(agent.workflow(step.context[0].text)) == encode_workflow(yaml_spec)


def test_public_names_are_listed_once_and_load() -> None:
    from reel import _MODULES, _WHERE

    assert reel.__all__ == sorted([*_WHERE, *_MODULES])
    for name in reel.__all__:
        assert getattr(reel, name) is not None
    with pytest.raises(AttributeError):
        _ = getattr(reel, "nothing_like_this")  # noqa: B009


def test_a_workflow_of_model_and_tool_steps_written_in_python_is_its_yaml_on_the_wire() -> None:
    """``examples/hello.yaml`` as ``reel.Workflow`` of ``ModelStep``/``ToolStep``: what the executor decodes from
    the start command (JSON) encodes byte for byte as the YAML file's workflow."""
    yaml_spec = load_workflow(REPO / "examples/hello.yaml")
    plan = yaml_spec.steps[0]
    assert isinstance(plan, reel.ModelStep)
    spec = reel.Workflow(
        name="hello-reel", description=yaml_spec.description, budget_tokens=120,
        steps=(reel.ModelStep(id="plan", instructions=plan.instructions, context=plan.context,
                              model=reel.ModelSpec(adapter="scripted", outputs=("echo 'hello from reel'",)),
                              policy=reel.Policy(exclude_kinds=("scratch",), max_item_tokens=60)),
               reel.ToolStep(id="run", tool=reel.ToolSpec(type="command", argv=("sh", "-c", "sh -s"), stdin_from="plan",
                                                          timeout_s=10)),
               yaml_spec.steps[2]),
        verifiers=(reel.Verifier(type="output_regex", name="greeting-printed", step="run", pattern="hello from reel"),
                   reel.Verifier(type="context_requires", name="task-was-packed", step="plan", item="task")))
    wire = msgspec.json.decode(msgspec.json.encode(spec), type=reel.Workflow)
    assert encode_workflow(wire) == encode_workflow(yaml_spec)
