"""Runtime configuration, read from the environment once at service start.

The complete table of every variable any process reads is docs/operations.md "Configuration"
(``tests/unit/test_config_docs.py`` keeps it complete); the ones read here:

=======================  =========================  ===========================================
variable                 default                    meaning
=======================  =========================  ===========================================
``NATS_URL``             ``nats://127.0.0.1:4222``  server(s) to connect to (comma-separated)
``REEL_NAMESPACE``       ``reel``                   prefix of every subject/stream (subjects.py)
``REEL_REPLICAS``        ``1``                      stream/bucket replicas (3 in a cluster)
``REEL_STORAGE``         ``file``                   ``file`` or ``memory``
``REEL_LEASE_TTL_S``     ``5``                      executor lease TTL, whole seconds (≥ 1)
``REEL_MAX_CONCURRENT_RUNS`` ``16`` / ``256``      commands one instance handles at once: jobs of a verifier
                                                    or crucible (16); runs an executor drives, across all
                                                    its durables (256: runs mostly wait on models)
``REEL_COMMAND_ACK_WAIT_S`` ``30``                 redelivery delay of a command whose executor, verifier
                                                    or crucible instance died (long handlers are kept
                                                    alive by in-progress acks every third of it)
``REEL_MUTATOR_ACK_WAIT_S`` ``5``                  the same for rewind, cancel and recovery: a command
                                                    whose mutator died is handled again after it
``REEL_CANCEL_CHECK_S``  ``1``                      how often an executor reads the log of each run it
                                                    drives for a cancel (a lost signal's bound; 0: never)
``REEL_DRAIN_DEADLINE_S`` ``45``                   after SIGTERM, how long an executor lets attempts run
                                                    before it interrupts them (retried elsewhere)
``REEL_INLINE_MAX_BYTES`` ``2048``                bodies up to this size ride inline in their refs
``REEL_FAILOVER_S``      ``30``                     how long a client re-sends a command (same msg id)
                                                    while no server answers (a failover), then errors
``REEL_TOOL_MAX_OUTPUT_BYTES`` ``8388608``        a ``command`` tool step's output cap (bytes, stdout
                                                    and stderr merged); a tool's ``max_output_bytes`` wins
``REEL_TOOL_ON_OVERFLOW`` ``fail``                 past the cap: ``fail`` (``output_too_large``) or
                                                    ``truncate`` (head kept, ``truncated``); per tool:
                                                    ``on_overflow`` (shared/core/workflow/toolspec.py)
``REEL_LOG_FORMAT``      auto                       ``json`` or ``console`` (auto: console on a TTY)
``REEL_LOG_LEVEL``       ``INFO``                   structlog level (shared/runtime/logging.py; ``reel``: ``ERROR``)
``REEL_PARTITIONS``      ``0``                      executor command partitions N (0: one shared durable)
``REEL_EXECUTOR_PARTITIONS`` all                   an executor's own partitions, e.g. ``0,2`` (others'
                                                    are adopted while no live executor owns them)
``REEL_BUDGET``          unset                      the namespace's default run budget, JSON, e.g.
                                                    ``{"max_cost_usd": 5}``: the limits a workflow's
                                                    ``budget:`` leaves unset (docs/workflow.md "Budgets")
``REEL_RETENTION_KEEP_DAYS`` unset                 retention: finished runs older than this (days) go
``REEL_RETENTION_KEEP_NEWEST`` unset               retention: the newest N finished runs stay
``REEL_RETENTION_SWEEP_S`` ``60``                  how often the retention service sweeps (s)
``REEL_BLOB_GRACE_S``    ``3600``                   a blob younger than this (s) is never collected
                                                    (≥ 2 × the writers' 300 s cache; docs/operations.md)
=======================  =========================  ===========================================

Credentials and TLS (:class:`NatsAuth`, docs/security.md; all unset by default — an auth-off server):

============================  ===============================================================
variable                      meaning
============================  ===============================================================
``REEL_NATS_USER``            user name (a role of ``reel auth init``: client, executor, …)
``REEL_NATS_PASSWORD``        its password (or ``REEL_NATS_PASSWORD_FILE``: a file holding it)
``REEL_NATS_CREDS``           a ``.creds`` file (JWT + nkey seed; operator-mode servers)
``REEL_NATS_NKEY_SEED``       an nkey user seed (``SU…``) or a file holding one
``REEL_NATS_TLS_CA``          CA bundle to verify the server (turns TLS on)
``REEL_NATS_TLS_CERT``        client certificate (mutual TLS), with ``REEL_NATS_TLS_KEY``
``REEL_NATS_JS_API_PREFIX``   JetStream API prefix (clients: ``JS.<NS>.API``, from ``client.env``)
``REEL_NATS_INBOX_PREFIX``    inbox prefix of the connection (services: ``_INBOX_<role>``)
============================  ===============================================================

Secrets never appear in a log line, an error or a ``repr``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from reel.shared.core.run.events import Budget
from reel.shared.core.run.retention import RetentionPolicy
from reel.shared.core.wire.subjects import Names
from reel.shared.core.workflow.toolspec import DEFAULT_MAX_OUTPUT_BYTES, ON_OVERFLOW, OutputLimit

CONNECTION_FLAGS = {
    "--nats-user": ("REEL_NATS_USER", "NATS user (a role of `reel auth init`)"),
    "--nats-password": ("REEL_NATS_PASSWORD", "its password (prefer $REEL_NATS_PASSWORD or --nats-password-file)"),
    "--nats-password-file": ("REEL_NATS_PASSWORD_FILE", "a file holding the password"),
    "--nats-creds": ("REEL_NATS_CREDS", "a .creds file (JWT + nkey seed)"),
    "--nats-nkey-seed": ("REEL_NATS_NKEY_SEED", "an nkey user seed file (or the seed)"),
    "--nats-tls-ca": ("REEL_NATS_TLS_CA", "CA bundle verifying the server (turns TLS on)"),
    "--nats-tls-cert": ("REEL_NATS_TLS_CERT", "client certificate (mutual TLS)"),
    "--nats-tls-key": ("REEL_NATS_TLS_KEY", "client certificate's key"),
    "--nats-js-api-prefix": ("REEL_NATS_JS_API_PREFIX", "JetStream API prefix (client account: JS.<NS>.API)"),
    "--nats-inbox-prefix": ("REEL_NATS_INBOX_PREFIX", "inbox prefix of the connection"),
}
"""Every connection flag of the ``reel`` CLI and the services, with its environment variable and help."""


@dataclass(frozen=True)
class NatsAuth:
    """How to authenticate to NATS (see the module table); every field optional."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    creds: str | None = None
    nkey_seed: str | None = field(default=None, repr=False)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    js_api_prefix: str | None = None
    inbox_prefix: str | None = None

    @property
    def configured(self) -> bool:
        """True if any credential is set (a user, a ``.creds`` file or an nkey seed)."""
        return bool(self.user or self.creds or self.nkey_seed)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NatsAuth:
        """Read the ``REEL_NATS_*`` variables of ``env`` (default ``os.environ``); empty values count as unset.

        Raises:
            OSError: ``REEL_NATS_PASSWORD_FILE`` names a file that cannot be read.
        """
        e = os.environ if env is None else env

        def get(name: str) -> str | None:
            return e.get(f"REEL_NATS_{name}") or None

        password = get("PASSWORD")
        if password is None and (pw_file := get("PASSWORD_FILE")):
            password = Path(pw_file).read_text().strip()
        return cls(user=get("USER"), password=password, creds=get("CREDS"), nkey_seed=get("NKEY_SEED"),
                   tls_ca=get("TLS_CA"), tls_cert=get("TLS_CERT"), tls_key=get("TLS_KEY"),
                   js_api_prefix=get("JS_API_PREFIX"), inbox_prefix=get("INBOX_PREFIX"))


DEFAULT_EXECUTOR_RUNS = 256
"""``REEL_MAX_CONCURRENT_RUNS`` of an executor when unset: the runs it drives at once. A live agent run mostly
waits on its model (≈ 20 KB and no CPU while it waits), so 16 left cores idle: 1,000 two-turn runs against a
1 s model took 147 s at 16 and 38 s at 256 (docs/benchmarks.md section 13). At 1,000 the burst of turns all
answered at once starved the event loop on a loaded machine past the lease TTL (lease lost, runs handed back)."""

DEFAULT_PARTITIONS = 0
"""``REEL_PARTITIONS`` when unset: executor command partitions N (docs/architecture.md, "Executor partitions")."""


@dataclass(frozen=True)
class Config:
    """Connection and JetStream settings shared by every service."""

    nats_url: str = "nats://127.0.0.1:4222"
    names: Names = field(default_factory=Names)
    replicas: int = 1
    storage: str = "file"
    lease_ttl_s: int = 5
    max_concurrent_runs: int = 16
    executor_max_runs: int = DEFAULT_EXECUTOR_RUNS
    command_ack_wait_s: float = 30.0
    mutator_ack_wait_s: float = 5.0
    cancel_check_s: float = 1.0
    auth: NatsAuth = field(default_factory=NatsAuth)
    drain_deadline_s: float = 45.0
    inline_max_bytes: int = 2048
    failover_s: float = 30.0
    executor_partitions: tuple[int, ...] | None = None  # None: all of names.partitions
    tool_output: OutputLimit = field(default_factory=OutputLimit)
    budget: Budget | None = None  # the namespace's default run budget (REEL_BUDGET)

    @classmethod
    def from_env(cls, **overrides: object) -> Config:
        """Build from environment variables; keyword overrides win (``None`` is ignored).

        Raises:
            ValueError: a variable holds a value it cannot take (named in the message).
        """
        values: dict[str, object] = {
            "nats_url": os.environ.get("NATS_URL", cls.nats_url),
            "names": Names(os.environ.get("REEL_NAMESPACE", "reel"),
                           int(os.environ.get("REEL_PARTITIONS", DEFAULT_PARTITIONS))),
            "replicas": int(os.environ.get("REEL_REPLICAS", "1")),
            "storage": os.environ.get("REEL_STORAGE", "file"),
            "lease_ttl_s": max(1, int(os.environ.get("REEL_LEASE_TTL_S", "5"))),
            "max_concurrent_runs": int(os.environ.get("REEL_MAX_CONCURRENT_RUNS", "16")),
            "executor_max_runs": int(os.environ.get("REEL_MAX_CONCURRENT_RUNS", DEFAULT_EXECUTOR_RUNS)),
            "command_ack_wait_s": float(os.environ.get("REEL_COMMAND_ACK_WAIT_S", "30")),
            "mutator_ack_wait_s": float(os.environ.get("REEL_MUTATOR_ACK_WAIT_S", "5")),
            "cancel_check_s": float(os.environ.get("REEL_CANCEL_CHECK_S", "1")),
            "auth": NatsAuth.from_env(),
            "drain_deadline_s": float(os.environ.get("REEL_DRAIN_DEADLINE_S", "45")),
            "inline_max_bytes": int(os.environ.get("REEL_INLINE_MAX_BYTES", "2048")),
            "failover_s": float(os.environ.get("REEL_FAILOVER_S", "30")),
            "executor_partitions": _partition_set(os.environ.get("REEL_EXECUTOR_PARTITIONS", "")),
            "tool_output": tool_output_from_env(os.environ),
            "budget": budget_from_env(os.environ),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


def _partition_set(text: str) -> tuple[int, ...] | None:
    """``REEL_EXECUTOR_PARTITIONS`` (``0,2``) as a tuple; empty: ``None`` (all)."""
    return tuple(sorted({int(x) for x in text.split(",") if x.strip()})) or None


def budget_from_env(env: Mapping[str, str]) -> Budget | None:
    """The namespace's default run budget from ``REEL_BUDGET`` (JSON of a workflow's ``budget:``); ``None``: unset.

    Raises:
        ValueError: not such JSON, or a limit not > 0 (named in the message).
    """
    raw = env.get("REEL_BUDGET", "").strip()
    if not raw:
        return None
    try:
        budget = msgspec.json.decode(raw, type=Budget)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"REEL_BUDGET must be JSON such as {{\"max_cost_usd\": 5}}: {exc}") from None
    for name in budget.__struct_fields__:
        value = getattr(budget, name)
        if value is not None and value <= 0:
            raise ValueError(f"REEL_BUDGET: {name} must be > 0, not {value!r}")
    return budget if budget.limits else None


def tool_output_from_env(env: Mapping[str, str]) -> OutputLimit:
    """The default tool output cap from ``REEL_TOOL_MAX_OUTPUT_BYTES`` and ``REEL_TOOL_ON_OVERFLOW``.

    Raises:
        ValueError: the cap is not an integer ≥ 1, or the policy is not ``fail``/``truncate``.
    """
    raw = env.get("REEL_TOOL_MAX_OUTPUT_BYTES") or str(DEFAULT_MAX_OUTPUT_BYTES)
    policy = env.get("REEL_TOOL_ON_OVERFLOW") or "fail"
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"REEL_TOOL_MAX_OUTPUT_BYTES must be a whole number of bytes >= 1, not {raw!r}")
    if policy not in ON_OVERFLOW:
        raise ValueError(f"REEL_TOOL_ON_OVERFLOW must be one of {', '.join(ON_OVERFLOW)}, not {policy!r}")
    return OutputLimit(max_bytes=int(raw), on_overflow=policy)  # policy checked just above


@dataclass(frozen=True)
class RetentionConfig:
    """The retention service's settings (docs/operations.md, "Retention and archives")."""

    policy: RetentionPolicy = field(default_factory=RetentionPolicy)
    sweep_s: float = 60.0
    blob_grace_s: float = 3600.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetentionConfig:
        """Read ``REEL_RETENTION_KEEP_DAYS``, ``REEL_RETENTION_KEEP_NEWEST``, ``REEL_RETENTION_SWEEP_S`` and
        ``REEL_BLOB_GRACE_S`` (empty: unset).

        Raises:
            ValueError: a value that is not a number > 0 (``KEEP_NEWEST``: a whole number ≥ 0), named in the message.
        """
        e = os.environ if env is None else env

        def positive(name: str) -> float | None:
            raw = e.get(name, "").strip()
            if not raw:
                return None
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{name} must be a number, not {raw!r}") from None
            if not value > 0:
                raise ValueError(f"{name} must be > 0, not {raw!r}")
            return value

        newest = e.get("REEL_RETENTION_KEEP_NEWEST", "").strip()
        if newest and not newest.isdigit():
            raise ValueError(f"REEL_RETENTION_KEEP_NEWEST must be a whole number >= 0, not {newest!r}")
        return cls(policy=RetentionPolicy(keep_days=positive("REEL_RETENTION_KEEP_DAYS"),
                                          keep_newest=int(newest) if newest else None),
                   sweep_s=positive("REEL_RETENTION_SWEEP_S") or 60.0,
                   blob_grace_s=positive("REEL_BLOB_GRACE_S") or 3600.0)
