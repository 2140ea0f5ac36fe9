"""The secrets of this process, which nothing it records may hold (the scrubbing: shared/core/env/redact.py).

What is remembered: the NATS credentials a connection of this process uses (its password, nkey
seed, the JWT and seed of its ``.creds`` file — remembered by :func:`reel.shared.nats.infra.connect`);
the ``REEL_NATS_*`` secrets of the environment (:data:`NATS_SECRET_ENV`); the API keys models name
(``api_key_env``: :func:`remember_workflow`, called by the executor and the verifier on each workflow
they load) and the usual ones (:data:`MODEL_KEY_ENV`), read from the environment by name. Values
only ever grow: a secret once seen stays scrubbed for the life of the process.

:func:`scrub` and :func:`scrub_bytes` are what the recording points call (tool outputs and errors,
prompts: services/executor, shared/proc/tools.py); :func:`log_processor` is in the structlog
chain (shared/runtime/logging.py), so no log line holds one either.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from reel.shared.core.env.redact import Secrets, StreamScrubber, secrets_of
from reel.shared.core.workflow.spec import WorkflowSpec
from reel.shared.runtime.config import NatsAuth

__all__ = ["MODEL_KEY_ENV", "NATS_SECRET_ENV", "current", "log_processor", "remember", "remember_auth",
           "remember_env", "remember_workflow", "scrub", "scrub_bytes", "stream"]

NATS_SECRET_ENV = ("REEL_NATS_PASSWORD", "REEL_NATS_NKEY_SEED", "REEL_NATS_TOKEN")
"""The ``REEL_NATS_*`` variables whose values are secrets (a file a variable names: :func:`remember_auth`)."""
MODEL_KEY_ENV = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
"""Model keys scrubbed whether or not a workflow names them (a model's ``api_key_env`` adds its own)."""

_lock = threading.Lock()
_named: dict[str, str] = {}  # value → name
_current = Secrets()


def remember(named: Iterable[tuple[str, str | None]]) -> None:
    """Add ``(name, value)`` pairs to this process's secrets (too-short values are ignored:
    shared/core/env/redact.py)."""
    global _current
    with _lock:
        before = len(_named)
        for name, value in named:
            if value and value not in _named:
                _named[value] = name
        if len(_named) != before:
            _current = secrets_of((n, v) for v, n in _named.items())


def remember_env(names: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    """Remember the values of the variables ``names`` (default environment: ``os.environ``); unset ones are skipped."""
    e = os.environ if env is None else env
    remember((n, e.get(n)) for n in names)


def remember_auth(auth: NatsAuth) -> None:
    """Remember the secrets of a connection's credentials: its password, its nkey seed (the seed itself, or the
    file's contents when it names a file), every line of its ``.creds`` file that is not a delimiter (the JWT and
    the seed). A file that cannot be read is skipped (the connection then fails and says so)."""
    pairs: list[tuple[str, str | None]] = [("REEL_NATS_PASSWORD", auth.password)]
    seed = (auth.nkey_seed or "").strip()
    if seed:
        pairs.append(("REEL_NATS_NKEY_SEED", seed if seed.startswith("SU") and "/" not in seed else _read(seed)))
    if auth.creds:
        text = _read(auth.creds) or ""
        pairs += [("REEL_NATS_CREDS", line.strip()) for line in text.splitlines()
                  if line.strip() and not line.strip().startswith(("---", "***"))]
    remember(pairs)
    remember_env(NATS_SECRET_ENV)


def remember_workflow(spec: WorkflowSpec) -> None:
    """Remember the API keys ``spec``'s models name
        (:meth:`~reel.shared.core.workflow.spec.WorkflowSpec.model_key_names`),
    read from this process's environment: a service calls it on each workflow it loads."""
    remember_env(spec.model_key_names())


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def current() -> Secrets:
    """This process's secrets as of now (a snapshot)."""
    return _current


def scrub(text: str) -> str:
    """``text`` with every secret of this process replaced by ``[redacted:NAME]``."""
    secrets = _current
    return secrets.scrub(text) if secrets else text


def scrub_bytes(data: bytes) -> bytes:
    """:func:`scrub` of raw bytes."""
    secrets = _current
    return secrets.scrub_bytes(data) if secrets else data


def stream() -> StreamScrubber:
    """A scrubber for one output stream, with this process's secrets as of now."""
    return StreamScrubber(_current)


def log_processor(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: every string of the line scrubbed (put it last before the renderer)."""
    secrets = _current
    if not secrets:
        return event
    for key, value in event.items():
        event[key] = secrets.scrub_value(value)
    return event
