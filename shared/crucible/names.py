"""Crucible's JetStream names, derived from Reel's namespace (:class:`reel.shared.core.wire.subjects.Names`).

=============================  ===================================  ======================================
what                           subject / name (namespace ``reel``)  notes
=============================  ===================================  ======================================
session log stream             ``REEL_CRUCIBLE``                    one subject per session, LSN = seq
one session's log              ``reel.crucible.<session_id>``       one writer, guarded appends
start a session (service)      ``reel.cmd.crucible.run``            in the commands stream ``REEL_CMDS``
resume a session (service)     ``reel.cmd.crucible.resume``         ″
service durable consumer       ``reel_crucible``
=============================  ===================================  ======================================

They derive from :class:`reel.shared.core.wire.subjects.Names`, so they hang off the same
namespace and several deployments can share a server.
"""

from __future__ import annotations

from dataclasses import dataclass

from reel.shared.core.wire.subjects import Names


@dataclass(frozen=True)
class CrucibleNames:
    """Subjects and stream of Crucible under one Reel namespace."""

    names: Names

    @property
    def stream(self) -> str:
        """The session-log stream, ``<NS>_CRUCIBLE``."""
        return f"{self.names.events_stream.removesuffix('_EVENTS')}_CRUCIBLE"

    def session(self, session_id: str) -> str:
        """The subject of one session's log."""
        return f"{self.names.namespace}.crucible.{session_id}"

    @property
    def sessions_prefix(self) -> str:
        """Prefix shared by every session subject (``<ns>.crucible.``)."""
        return f"{self.names.namespace}.crucible."

    @property
    def all_sessions(self) -> str:
        """Wildcard of every session subject (the stream's subject filter)."""
        return f"{self.names.namespace}.crucible.*"

    def command(self, name: str) -> str:
        """Command subject for the service: ``run`` or ``resume``."""
        return self.names.command(f"crucible.{name}")

    @property
    def consumer_service(self) -> str:
        """Service name of the durable command consumer (``<ns>_crucible``)."""
        return "crucible"
