"""Crucible's exceptions: one base under :class:`~reel.shared.core.errors.ReelError`, shaped by how callers react."""

from __future__ import annotations

from reel.shared.core.errors import ReelError


class CrucibleError(ReelError):
    """Base of every error Crucible raises on purpose (one clear line in ``message``)."""

    code = "crucible_error"


class ConfigInvalid(CrucibleError):
    """A session config failed validation; the message names the field."""

    code = "crucible_config_invalid"


class SessionNotFound(CrucibleError):
    """No session log with this id exists."""

    code = "crucible_session_not_found"


class SessionExists(CrucibleError):
    """``run`` was asked to create a session id that already has a log (use ``resume``)."""

    code = "crucible_session_exists"


class SessionBusy(CrucibleError):
    """Another process drives this session (world lock held, or the log moved under us)."""

    code = "crucible_session_busy"
    retryable = True


class WorldError(CrucibleError):
    """A git operation on the session's world failed (message carries git's last line)."""

    code = "crucible_world_error"
