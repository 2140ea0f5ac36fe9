"""The security suite: each attack on one real auth-on nats-server, its ledger and its one-line summary.

One server for the package (the accounts and users of ``reel auth init``: tests/integration/authserver.py),
every service running on it as its own role — executor, verifier, rewind, cancel (with the consumer gate),
recovery, crucible — with the executor's NATS credentials and a model key in the environment the way
``reel up`` gives them (tests/support/canary.py). Every service log line of the package goes, through the
services' real structlog chain (secrets scrubbed), to one JSON-lines file (:class:`ServiceLogs`).

Every module is marked ``security`` (``pytestmark``; ``pytest -m security``). Each attack is tried as the
attacker would (the ``client`` role unless the test says otherwise) and, before its checks are asserted,
recorded in the session's :class:`SecurityLedger`::

    security_ledger.record("forged run_created", refused=True, let_in=False, secrets_found=0)

When any attack recorded, pytest's terminal summary (also under ``-q``) ends with exactly one line::

    security: 212 attacks, 212 refused, 0 let in, 0 secrets found
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog

from reel.shared.nats.client import ReelClient
from reel.shared.runtime.logging import setup_logging
from tests.integration.authserver import AuthServer, auth_server, client_of, gate_up, services_as_roles
from tests.support.canary import as_reel_up

_LEDGER = pytest.StashKey["SecurityLedger"]()

SERVICES = ("executor", "verifier", "rewind", "cancel", "recovery", "crucible")
"""The services the package runs, each as its role."""


@dataclass(frozen=True)
class AttackRecord:
    """One attack's outcome.

    Attributes:
        attack: what was tried (unique in the session; a second record replaces the first).
        refused: the system said no (a permission error, a refusal reply, an ignored signal).
        let_in: the attack changed something it must not (a stored message, a stopped tool, a consumer).
        secrets_found: secret values seen where the attacker can read them (outputs, streams, logs).
    """

    attack: str
    refused: bool
    let_in: bool
    secrets_found: int


@dataclass
class SecurityLedger:
    """The session's attack records, summed into the terminal line."""

    records: dict[str, AttackRecord] = field(default_factory=dict)

    def record(self, attack: str, *, refused: bool, let_in: bool, secrets_found: int = 0) -> None:
        """Record one attack (call before asserting its checks, so a failing attack is counted too).

        Raises:
            ValueError: ``secrets_found`` is negative.
        """
        if secrets_found < 0:
            raise ValueError(f"negative secrets_found for {attack}: {secrets_found}")
        self.records[attack] = AttackRecord(attack, refused, let_in, secrets_found)

    def line(self) -> str:
        """The summary line: ``security: N attacks, R refused, L let in, S secrets found``."""
        rs = self.records.values()
        return (f"security: {len(self.records)} attacks, {sum(r.refused for r in rs)} refused, "
                f"{sum(r.let_in for r in rs)} let in, {sum(r.secrets_found for r in rs)} secrets found")

    def let_in(self) -> list[str]:
        """The attacks that got in or found a secret."""
        return [r.attack for r in self.records.values() if r.let_in or r.secrets_found or not r.refused]


def _ledger(config: pytest.Config) -> SecurityLedger:
    ledger = config.stash.get(_LEDGER, None)
    if ledger is None:
        ledger = config.stash[_LEDGER] = SecurityLedger()
    return ledger


@pytest.fixture(scope="session")
def security_ledger(pytestconfig: pytest.Config) -> SecurityLedger:
    """The session's :class:`SecurityLedger` (``record(attack, refused=, let_in=, secrets_found=)``)."""
    return _ledger(pytestconfig)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    """Print the security line when any attack recorded (shown under ``pytest -q`` too), and what got in."""
    ledger = config.stash.get(_LEDGER, None)
    if ledger is not None and ledger.records:
        for attack in ledger.let_in():
            terminalreporter.write_line(f"security: let in: {attack}")
        terminalreporter.write_line(ledger.line())


@dataclass
class ServiceLogs:
    """The package's log lines, as the services render them (JSON, secrets scrubbed), in ``path``."""

    path: Path

    def text(self) -> str:
        """Every line written so far."""
        return self.path.read_text(encoding="utf-8", errors="replace")

    def lines(self) -> list[dict[str, Any]]:
        """Every line written so far, decoded (a line that is not JSON is skipped)."""
        out = []
        for line in self.text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


@pytest.fixture(scope="package")
def service_logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceLogs]:
    """Route every structlog line of the package through the services' chain (shared/runtime/logging.py) to one file."""
    path = tmp_path_factory.mktemp("security-logs") / "services.jsonl"
    saved = {k: list(v) if isinstance(v, list) else v for k, v in structlog.get_config().items()}  # a copy
    with pytest.MonkeyPatch.context() as mp, path.open("a", encoding="utf-8", buffering=1) as out:
        mp.setenv("REEL_LOG_FORMAT", "json")
        setup_logging("security", "INFO")
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=out))
        try:
            yield ServiceLogs(path)
        finally:
            structlog.configure(**saved)


@dataclass
class Suite:
    """The package's server, the secrets its executor holds (name → value) and where its services log."""

    server: AuthServer
    secrets: dict[str, str]
    logs: ServiceLogs


@pytest.fixture(scope="package")
async def suite(tmp_path_factory: pytest.TempPathFactory, service_logs: ServiceLogs) -> AsyncIterator[Suite]:
    """The auth-on server with every service of :data:`SERVICES` running on it as its role."""
    with pytest.MonkeyPatch.context() as mp:
        async with auth_server(tmp_path_factory.mktemp("security")) as server:
            secrets = as_reel_up(server, mp)
            async with services_as_roles(server, *SERVICES):
                await gate_up(server)
                yield Suite(server, secrets, service_logs)


@pytest.fixture
async def client(suite: Suite) -> AsyncIterator[ReelClient]:
    """A :class:`ReelClient` connected as ``client`` — the attacker."""
    async with client_of(suite.server) as c:
        yield c
