"""``reel auth init DIR``: a server authorization config and per-role credentials (docs/security.md).

The directory holds, all files mode 0600:

* ``auth.conf`` — the two NATS accounts of :mod:`reel.shared.auth.roles` with one user per role
  (passwords bcrypt-hashed: the file holds no usable secret), its permissions, the
  Reel account's exports and the client account's imports; ``include`` it from a server config;
* ``server.conf`` — a minimal server config including it (JetStream on; the listen
  address and store come from the command line, as ``reel up --auth`` passes them);
* per role ``<role>.env`` (``REEL_NATS_USER``, ``REEL_NATS_PASSWORD``, the role's inbox
  prefix, the client's JetStream API prefix, ``REEL_NAMESPACE``: a compose ``env_file``
  or ``set -a; . client.env``) and ``<role>.password`` (for ``REEL_NATS_PASSWORD_FILE``);
* with ``k8s=True``, ``k8s-secrets.yaml``: a Secret ``reel-nats-auth`` (``auth.conf``) and
  a Secret ``reel-<role>`` per role (the ``.env`` variables, for ``envFrom``).

Passwords are 32 random URL-safe characters (``secrets.token_urlsafe``).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import bcrypt

from reel.shared.auth.roles import (
    CLIENT_ROLES,
    ROLES,
    SERVICE_ROLE,
    Grant,
    accounts,
    client_imports,
    client_js_api_prefix,
    client_streams,
    grants,
    inbox_prefix,
)
from reel.shared.core.wire.subjects import Names
from reel.shared.runtime.config import Config, NatsAuth

AUTH_CONF = "auth.conf"
SERVER_CONF = "server.conf"
K8S_SECRETS = "k8s-secrets.yaml"
BCRYPT_COST = 11


class AuthDirExists(FileExistsError):
    """``reel auth init`` would overwrite an existing ``auth.conf`` (pass ``force``)."""


def _q(s: str) -> str:
    return json.dumps(s)  # a NATS config string: quoted, so ``$`` is never a variable reference


def _perms(g: Grant, indent: str) -> str:
    if g.publish == (">",) and g.subscribe == (">",):
        return ""
    pub = f"allow: [{', '.join(map(_q, g.publish))}]"
    if g.deny_publish:
        pub += f", deny: [{', '.join(map(_q, g.deny_publish))}]"
    sub = f"allow: [{', '.join(map(_q, g.subscribe))}]"
    i = indent
    resp = f"\n{i}    allow_responses: {{max: 1, expires: \"10s\"}}" if g.responses else ""
    return f",\n{i}  permissions: {{\n{i}    publish: {{{pub}}}\n{i}    subscribe: {{{sub}}}{resp}\n{i}  }}"


def render_auth_conf(names: Names, password_hashes: Mapping[str, str]) -> str:
    """The ``accounts { … }`` block for ``names`` with ``password_hashes`` (role → bcrypt hash)."""
    reel, clients = accounts(names)
    g = grants(names)
    ind = " " * 6

    def user(role: str) -> str:
        return f"{ind}{{user: {_q(role)}, password: {_q(password_hashes[role])}{_perms(g[role], ind)}}}"

    imports = client_imports(names)
    exports: dict[str, str] = {}
    for i in imports:
        exports.setdefault(i.subject, i.response)
    export_lines = [f"{ind}{{service: {_q(s)}" + (f", response_type: {_q(r)}" if r != "singleton" else "") + "}"
                    for s, r in exports.items()]
    export_lines += [f"{ind}{{stream: {_q(x)}}}" for x in client_streams(names)]
    import_lines = [f"{ind}{{service: {{account: {_q(reel)}, subject: {_q(i.subject)}}}, to: {_q(i.local)}}}"
                    for i in imports]
    import_lines += [f"{ind}{{stream: {{account: {_q(reel)}, subject: {_q(x)}}}}}" for x in client_streams(names)]
    service_users = "\n".join(user(r) for r in ROLES if r not in CLIENT_ROLES)
    client_users = "\n".join(user(r) for r in CLIENT_ROLES)
    return (
        f"# Reel's NATS accounts for namespace {names.namespace!r}: written by `reel auth init`; docs/security.md.\n"
        "# One user per role, passwords bcrypt-hashed. Include this file from the server config.\n"
        "accounts {\n"
        f"  {reel}: {{\n    jetstream: enabled\n    users: [\n{service_users}\n    ]\n"
        f"    exports: [\n" + "\n".join(export_lines) + "\n    ]\n  }\n"
        f"  {clients}: {{\n    users: [\n{client_users}\n    ]\n"
        f"    imports: [\n" + "\n".join(import_lines) + "\n    ]\n  }\n"
        "}\n"
    )


def role_env(names: Names, role: str, password: str) -> dict[str, str]:
    """The environment a connection of ``role`` needs (``REEL_NATS_*`` and ``REEL_NAMESPACE``)."""
    env = {"REEL_NATS_USER": role, "REEL_NATS_PASSWORD": password, "REEL_NAMESPACE": names.namespace}
    if role in CLIENT_ROLES:
        env["REEL_NATS_JS_API_PREFIX"] = client_js_api_prefix(names)
    else:
        env["REEL_NATS_INBOX_PREFIX"] = inbox_prefix(role)
    return env


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT


def _k8s_secrets(auth_conf: str, envs: Mapping[str, Mapping[str, str]]) -> str:
    docs = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "reel-nats-auth"}, "type": "Opaque",
             "stringData": {AUTH_CONF: auth_conf}}]
    docs += [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"reel-{role}"}, "type": "Opaque",
              "stringData": dict(env)} for role, env in envs.items()]
    return "# Reel's NATS credentials as Kubernetes Secrets (reel auth init --k8s). Keep secret.\n" + \
        "".join("---\n" + json.dumps(d, indent=2) + "\n" for d in docs)


def init(directory: Path, names: Names, *, force: bool = False, k8s: bool = False,
         bcrypt_cost: int = BCRYPT_COST) -> AuthDir:
    """Write a fresh auth directory (see module doc) with new random passwords.

    Raises:
        AuthDirExists: ``directory/auth.conf`` exists and ``force`` is false.
    """
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    if (directory / AUTH_CONF).exists() and not force:
        raise AuthDirExists(f"{directory / AUTH_CONF} exists (reel auth init --force replaces every password)")
    passwords = {r: secrets.token_urlsafe(24) for r in ROLES}
    hashes = {r: bcrypt.hashpw(p.encode(), bcrypt.gensalt(bcrypt_cost, prefix=b"2a")).decode()
              for r, p in passwords.items()}
    auth_conf = render_auth_conf(names, hashes)
    _write(directory / AUTH_CONF, auth_conf)
    _write(directory / SERVER_CONF, "# A nats-server config with Reel's accounts (reel auth init). The listen address\n"
           "# and store come from the command line (reel up --auth); set them here to run it alone.\n"
           f"jetstream {{}}\ninclude {AUTH_CONF}\n")
    envs = {r: role_env(names, r, passwords[r]) for r in ROLES}
    for role, env in envs.items():
        _write(directory / f"{role}.env", f"# Reel NATS credentials of role {role} (reel auth init). Keep secret.\n"
               + "".join(f"{k}={v}\n" for k, v in env.items()))
        _write(directory / f"{role}.password", passwords[role] + "\n")
    if k8s:
        _write(directory / K8S_SECRETS, _k8s_secrets(auth_conf, envs))
    return AuthDir(directory)


def parse_env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of an env file (``#`` comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class AuthDir:
    """A directory written by :func:`init`."""

    path: Path

    @property
    def auth_conf(self) -> Path:
        """``<dir>/auth.conf``: the accounts and users (nats-server include)."""
        return self.path / AUTH_CONF

    @property
    def server_conf(self) -> Path:
        """``<dir>/server.conf``: the nats-server config that includes ``auth.conf``."""
        return self.path / SERVER_CONF

    def exists(self) -> bool:
        """True if the directory holds an ``auth.conf``."""
        return self.auth_conf.is_file()

    def env(self, role: str) -> dict[str, str]:
        """The ``<role>.env`` variables.

        Raises:
            FileNotFoundError: the directory has no such role file.
        """
        return parse_env_file(self.path / f"{role}.env")

    def auth(self, role: str) -> NatsAuth:
        """The :class:`NatsAuth` of ``role`` (its credentials and prefixes)."""
        return NatsAuth.from_env(self.env(role))

    def config(self, role: str, base: Config) -> Config:
        """``base`` connecting as ``role``."""
        return replace(base, auth=self.auth(role))

    def service_config(self, service: str, base: Config) -> Config:
        """``base`` connecting as the role of ``service`` (:data:`reel.shared.auth.roles.SERVICE_ROLE`)."""
        return self.config(SERVICE_ROLE[service], base)
