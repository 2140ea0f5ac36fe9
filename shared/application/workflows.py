"""The one workflow cache: a run's workflow read from its blob and parsed once, by sha256.

A run names its workflow by content (``RunCreated.workflow_ref``), so a parsed spec never goes
stale: the cache only bounds memory. :class:`WorkflowCache` is a least-recently-used map of at
most ``max_entries`` (default :data:`MAX_WORKFLOWS`) specs by sha256; every reader of a run's
workflow goes through it (the executor, the verifier, the respond handler, the CLI's timelines
and ``reel trace``). Each spec parsed is passed to :func:`reel.shared.auth.secrets.remember_workflow` (its
models' key names, scrubbed from what this process stores). The executor also keeps a
workflow's resolved ``python:`` tools with it, per search path (:meth:`WorkflowCache.python_tools`).

Typed against the :class:`~reel.shared.core.ports.BlobStore` port; no NATS here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from reel.shared.application.toolimports import PythonTools, Registered, check_tool_imports, tool_search_path
from reel.shared.auth import secrets
from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.ports import BlobStore
from reel.shared.core.run.events import BlobRef
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow

MAX_WORKFLOWS = 256
"""Specs kept per process (a spec is a few KiB: ~1 MiB at most for typical workflows)."""


@dataclass
class _Entry:
    spec: WorkflowSpec
    tools: dict[tuple[str, ...], PythonTools] = field(default_factory=dict)  # by the folders searched


class WorkflowCache:
    """Parsed workflows by the sha256 of their blob, least recently used evicted past ``max_entries``.

    Args:
        blobs: where workflow blobs are read from (JSON, as the executor stores them).
        max_entries: how many specs to keep (≥ 1).
        registered: function objects this process serves by ``module:function`` path (resolved before an
            import is tried; :func:`~reel.shared.application.toolimports.check_tool_imports`).
    """

    def __init__(self, blobs: BlobStore, *, max_entries: int = MAX_WORKFLOWS, registered: Registered | None = None
                 ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.blobs, self.max_entries, self.registered = blobs, max_entries, registered
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, sha256: str, spec: WorkflowSpec, tools: PythonTools | None = None,
                 search: Sequence[str] = ()) -> None:
        """Keep ``spec``, stored as the blob ``sha256`` (``tools``: its python tools, if resolved already, from the
        folders ``search``)."""
        secrets.remember_workflow(spec)  # its models' keys: scrubbed from what this process stores
        entry = self._entries.get(sha256) or _Entry(spec)
        if tools is not None:
            entry.tools[tuple(search)] = tools
        self._entries[sha256] = entry
        self._entries.move_to_end(sha256)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def _entry(self, ref: BlobRef) -> _Entry:
        entry = self._entries.get(ref.sha256)
        if entry is not None:
            self._entries.move_to_end(ref.sha256)
            return entry
        try:
            spec = parse_workflow(await self.blobs.get(ref), fmt="json")
        except WorkflowInvalid as exc:
            raise WorkflowInvalid(f"workflow blob {ref.sha256[:12]}…: {exc.message}") from exc
        self.remember(ref.sha256, spec)
        return self._entries[ref.sha256]

    async def load(self, ref: BlobRef) -> WorkflowSpec:
        """The workflow stored as ``ref`` (read and parsed on its first use, or again once evicted).

        Raises:
            BlobMissing: the blob store has no such (intact) blob.
            WorkflowInvalid: the blob is not a valid workflow (the message names the blob).
        """
        return (await self._entry(ref)).spec

    async def python_tools(self, ref: BlobRef, source_dir: str | None = None) -> PythonTools:
        """The resolved ``python:`` tools of the workflow ``ref`` of a run started from a file in ``source_dir``
        (looked up in :func:`~reel.shared.application.toolimports.tool_search_path` of it; resolved once per
        search path, kept with its spec).

        Raises:
            BlobMissing, WorkflowInvalid: as :meth:`load`; WorkflowInvalid also when a tool path does not
                resolve (the message names the field and the folders searched).
        """
        entry = await self._entry(ref)
        search = tool_search_path(source_dir)
        if search not in entry.tools:
            entry.tools[search] = check_tool_imports(entry.spec, self.registered, search=search)
        return entry.tools[search]
