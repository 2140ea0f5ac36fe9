"""examples/hello.yaml in Python: a model step packing context under a budget, a command tool step running its
output, a model step retried once after a scripted failure; two verifiers. Same workflow, same commits.

Run from the repository root:  python -m examples.python.hello
"""

from __future__ import annotations

import reel
from reel.shared.core.workflow.modelspec import ScriptedFailure  # a scripted failed attempt (not in reel's names)

LONG_LOG = ("log line one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
            "sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five "
            "twenty-six twenty-seven twenty-eight twenty-nine thirty")

workflow = reel.Workflow(
    name="hello-reel",
    description="pack context, call a model, run a tool, retry once; verifiers judge the result",
    budget_tokens=120,
    steps=(
        reel.ModelStep(
            id="plan", instructions="Write a shell command that prints a greeting.",
            model=reel.ModelSpec(adapter="scripted", outputs=("echo 'hello from reel'",)),
            policy=reel.Policy(exclude_kinds=("scratch",), max_item_tokens=60),
            context=(
                reel.ContextItem(id="task", kind="task", priority=10.0, text="Greet the user in one line of shell."),
                reel.ContextItem(id="style-guide", kind="document", priority=5.0,
                                 text="Prefer POSIX shell. Quote strings. Keep it short."),
                reel.ContextItem(id="old-notes", kind="document", stale=True,
                                 text="Notes from a previous run that no longer apply."),
                reel.ContextItem(id="scratchpad", kind="scratch",
                                 text="Internal scratch notes the model should not see."),
                reel.ContextItem(id="long-log", kind="observation", text=LONG_LOG),
                reel.ContextItem(id="faq-1", kind="document", priority=1.0,
                                 text="Q: What shell is used? A: /bin/sh on Linux."),
                reel.ContextItem(id="faq-2", kind="document", priority=1.0,
                                 text="Q: May the command write files? A: No, only print to stdout."),
                reel.ContextItem(id="faq-3", kind="document", priority=0.0,
                                 text="Q: Is networking allowed? A: No network access is available during the run."),
            )),
        reel.ToolStep(id="run", tool=reel.ToolSpec(type="command", argv=("sh", "-c", "sh -s"), stdin_from="plan",
                                                   timeout_s=10.0)),
        reel.ModelStep(
            id="summarize", max_attempts=3, include_previous_outputs=True,
            model=reel.ModelSpec(adapter="scripted", outputs=(
                ScriptedFailure(error="rate_limited", message="429 Too Many Requests (scripted)"),
                "The command printed a greeting; the run succeeded."))),
    ),
    verifiers=(
        reel.Verifier(type="output_regex", name="greeting-printed", step="run", pattern="hello from reel"),
        reel.Verifier(type="context_requires", name="task-was-packed", step="plan", item="task"),
    ),
)

if __name__ == "__main__":
    result = reel.run_sync(workflow)
    print(result.outcome, [(v.verifier, v.status) for v in result.verdicts])
