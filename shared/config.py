"""Runtime configuration, read from the environment once at service start.

=======================  =========================  ===========================================
variable                 default                    meaning
=======================  =========================  ===========================================
``NATS_URL``             ``nats://127.0.0.1:4222``  server(s) to connect to (comma-separated)
``REEL_NAMESPACE``       ``reel``                   prefix of every subject/stream (subjects.py)
``REEL_REPLICAS``        ``1``                      stream/bucket replicas (3 in a cluster)
``REEL_STORAGE``         ``file``                   ``file`` or ``memory``
``REEL_LEASE_TTL_S``     ``5``                      executor lease TTL, whole seconds (≥ 1)
``REEL_COMMAND_ACK_WAIT_S`` ``30``                 redelivery delay of a command whose service died
``REEL_LOG_FORMAT``      auto                       ``json`` or ``console`` (auto: console on a TTY)
=======================  =========================  ===========================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from shared.core.subjects import Names


@dataclass(frozen=True)
class Config:
    """Connection and JetStream settings shared by every service."""

    nats_url: str = "nats://127.0.0.1:4222"
    names: Names = field(default_factory=Names)
    replicas: int = 1
    storage: str = "file"
    lease_ttl_s: int = 5
    max_concurrent_runs: int = 16
    command_ack_wait_s: float = 30.0

    @classmethod
    def from_env(cls, **overrides: object) -> Config:
        """Build from environment variables; keyword overrides win (``None`` is ignored)."""
        values: dict[str, object] = {
            "nats_url": os.environ.get("NATS_URL", cls.nats_url),
            "names": Names(os.environ.get("REEL_NAMESPACE", "reel")),
            "replicas": int(os.environ.get("REEL_REPLICAS", "1")),
            "storage": os.environ.get("REEL_STORAGE", "file"),
            "lease_ttl_s": max(1, int(os.environ.get("REEL_LEASE_TTL_S", "5"))),
            "max_concurrent_runs": int(os.environ.get("REEL_MAX_CONCURRENT_RUNS", "16")),
            "command_ack_wait_s": float(os.environ.get("REEL_COMMAND_ACK_WAIT_S", "30")),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
