"""examples/agent/fix_typo.yaml in Python: a scripted model reads a tiny package, runs its failing unittest, fixes
the typo in a scratch copy and runs the tests again. The tools are the YAML's: ``read_file``/``write_file`` are the
functions of examples/agent/tools.py (served by object here, named ``examples.agent.tools:…`` in the workflow),
``run_tests`` the same command. Same workflow, same commits.

Run from the repository root (``run_tests`` is a path relative to it):  python -m examples.python.fix_typo
"""

from __future__ import annotations

from pathlib import Path

import reel
from examples.agent.tools import read_file, write_file

TASK = "The unit tests of the `wordfreq` package fail. Find the bug and fix it."
PATH = {"type": "string", "description": "path relative to the project root"}
FIXED = (Path(__file__).resolve().parents[1] / "agent" / "project" / "wordfreq" / "__init__.py").read_text().replace(
    "most_comon(", "most_common(")  # what the scripted model writes back: the shipped file with the typo fixed

WORKSPACE = reel.Workspace(from_="examples/agent/project")  # run from the repository root, as run_tests is

TOOLS: list[reel.Tool] = [
    reel.tool(read_file, description="Read a text file of the project.", retry_safe=True,
              parameters={"type": "object", "properties": {"path": PATH}, "required": ["path"],
                          "additionalProperties": False}),
    reel.tool(write_file, description="Replace a file of the project with new content.", retry_safe=True,
              parameters={"type": "object", "properties": {
                  "path": PATH, "content": {"type": "string", "description": "the whole new text of the file"}},
                  "required": ["path", "content"], "additionalProperties": False}),
    reel.command_tool("run_tests", ["python3", "examples/agent/run_tests.py"], retry_safe=True, timeout_s=60,
                      description="Run the project's unit tests (python3 -m unittest) and return their output.",
                      parameters={"type": "object", "properties": {}, "additionalProperties": False}),
]

SCRIPTED = reel.ScriptedModel(name="scripted-typo-fixer", turns=[
    {"text": "Let me read the package and run its tests.",
     "tool_calls": [{"name": "read_file", "arguments": {"path": "wordfreq/__init__.py"}},
                    {"name": "run_tests", "arguments": {}}]},
    {"text": "`Counter` has no method `most_comon`: a typo for `most_common`. Fixing it.",
     "tool_calls": [{"name": "write_file", "arguments": {"path": "wordfreq/__init__.py", "content": FIXED}}]},
    {"text": "Running the tests again.", "tool_calls": [{"name": "run_tests", "arguments": {}}]},
    {"text": "Fixed the typo in wordfreq/__init__.py: `most_comon` is now `most_common`; both tests pass."},
])


def fixer(model: reel.Model) -> reel.Agent:
    """The fix-typo agent with ``model`` (fix_typo_live.py gives it an OpenAI-compatible endpoint)."""
    return reel.Agent(
        name="fix-typo", step_id="fix",
        description="an agent reads a tiny package, runs its failing unittest, fixes the typo and runs the tests again",
        budget_tokens=1400, max_turns=8, max_attempts=2, max_parallel_tools=4,
        instructions="You are a careful Python engineer working in a checkout of a small package. Use the tools to "
                     "read and write its files and to run its unit tests. Fix the failing test by changing the "
                     "package, never the test. When the tests pass, answer in one sentence what you changed.",
        context=[reel.ContextItem(id="layout", kind="document", priority=1,
                                  text="Files: wordfreq/__init__.py (the package), test_wordfreq.py (its unittest "
                                       "tests)."),
                 reel.ContextItem(id="old-notes", kind="document", stale=True,
                                  text="Notes from an earlier attempt that no longer apply.")],
        model=model, tools=TOOLS, workspace=WORKSPACE,
        verifiers=[reel.Verifier(type="command", name="tests-pass", step="fix",
                                 argv=("python3", "examples/agent/run_tests.py"))])


agent = fixer(SCRIPTED)

if __name__ == "__main__":
    result = reel.run_sync(agent, input=TASK)
    print(result.outcome, result.output)
