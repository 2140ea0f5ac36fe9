"""Recorded agent trajectories → replayable Reel workflows (see docs/trajectories.md).

:func:`load_trajectories` reads one trajectory file, detects its format
(:func:`detect_format`) and returns one :class:`~reel.shared.core.workflow.spec.WorkflowSpec` per
recorded run in it. Pure: no NATS, no clock; the only I/O is reading the file and,
for mini-swe-agent, its companion SWE-bench ``report.json`` (the outcome label).

One module per job:

* :mod:`.loader` — read the file (JSON or JSON Lines), detect the format, dispatch;
* :mod:`.mini_swe_agent`, :mod:`.swe_agent`, :mod:`.tau_bench`, :mod:`.openhands` —
  one parser per format, each ``parse(data, path, limit) -> list[Recording]``;
* :mod:`.recording` — the format-neutral recording they produce (literal messages,
  model turns, observations) and the chat shapes and helpers they share;
* :mod:`.builder` — recording → workflow, the same mapping for every format.

The mapping is the same for every format:

* each recorded model turn (assistant message) → a model step ``tNN-model`` with
  the ``replay`` adapter, ``output`` = the recorded text (tool calls rendered as
  ``<tool_call>{"name": …, "arguments": …}</tool_call>`` lines) and the recorded
  usage where the file has it;
* each environment answer to that turn (tool observation; in tau-bench also the
  simulated user's reply to a text turn) → a ``recorded`` tool step ``tNN-tool``;
* the candidate context of turn N = every earlier message, in order: literal
  ``text`` for what no step produced (``system``, ``task``, ``demo``, other
  ``message``s) and ``from_step`` references for earlier model outputs
  (kind ``output``) and tool results (kind ``observation``, or ``message`` for a
  simulated user). A workflow therefore grows O(n) with the turns, not O(n²).

Context item ids are stable across turns: ``m0003`` is message 3 of the file
(``e0042`` is OpenHands event 42), so partitions of successive turns can be diffed.
"""

from reel.shared.core.trajectories.builder import EXCLUDED_KINDS, MAX_WORKFLOW_BYTES, PRIORITY
from reel.shared.core.trajectories.loader import FORMATS, PARSERS, TrajectoryFormat, detect_format, load_trajectories

__all__ = [
    "EXCLUDED_KINDS",
    "FORMATS",
    "MAX_WORKFLOW_BYTES",
    "PARSERS",
    "PRIORITY",
    "TrajectoryFormat",
    "detect_format",
    "load_trajectories",
]
