"""The session config: world, regimes (judge + goal), proposer, noise, budgets, gates.

A config is validated once, with every path made absolute and every ``${VAR}``
expanded, and is then frozen into the session log (``SessionStarted.config``):
``resume`` reads it from the log, never from the file again, so editing the file
mid-session cannot move the goalpost or the budget.

Expansion (:func:`parse_config`): ``${CONFIG_DIR}`` is the config file's
directory; ``${NAME}`` / ``${NAME:-default}`` read the environment (the judge's
declared ``env`` first). It applies to ``world.repo``, ``world.workdir``,
``judge.env`` values, ``judge.reads`` and ``gates.protect``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from reel.shared.core.env import interpolate
from reel.shared.core.env.toolenv import check_tool_env
from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.fieldhint import with_field_hint
from reel.shared.core.workflow.spec import ModelSpec
from reel.shared.crucible.errors import ConfigInvalid

Direction = Literal["maximize", "minimize"]
OnDeny = Literal["escalate", "skip"]

DEFAULT_WORKDIR = "${REEL_HOME:-.reel}/crucible"
"""Sessions' directories by default: ``$REEL_HOME/crucible`` (``.reel/crucible`` without ``$REEL_HOME``)."""


class _Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the config structs (unknown fields are an error that names them)."""


class WorldSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where the world comes from : a clone of ``repo`` at ``rev``, one per session.

    Attributes:
        repo: path of the source git repository (absolute after parsing).
        rev: the revision the session starts from (the committed tree; uncommitted edits are not carried).
        workdir: sessions' directories go to ``<workdir>/<session_id>/`` (world clone, lock, history).
    """

    repo: str
    rev: str = "HEAD"
    workdir: str = ".reel/crucible"


class LabSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A ``lab:`` judge: the score is the pass rate of a batch of live runs of a workflow of the world.

    Each reading starts ``runs`` runs of ``workflow`` (as found in the measured tree) through Reel's client,
    at most ``concurrency`` at once, waits until each rests and counts those the verifier ``verifier``
    judged ``pass``: the reading is ``passes / runs``. The workflow is loaded with ``${NAME}`` replaced
    from ``env`` and, for each ``files`` entry, by the text of that world file (an agent's instructions
    kept in a file of their own).

    Attributes:
        workflow: world-relative path of the workflow file (YAML or JSON).
        runs: runs per reading (N ≥ 1).
        verifier: the name of the workflow's verifier whose ``pass`` counts.
        concurrency: runs in flight at once (≥ 1).
        files: ``NAME`` → world-relative file whose text replaces ``${NAME}`` in the workflow.
        env: ``NAME`` → value replacing ``${NAME}`` in the workflow (e.g. a model's endpoint).

    The judge's ``timeout_s`` bounds one batch: runs not finished by then make the reading invalid.
    """

    workflow: str
    runs: int
    verifier: str
    concurrency: int = 4
    files: dict[str, str] = {}
    env: dict[str, str] = {}


class JudgeSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A command that prints a score, or a ``lab`` of live runs scored by their pass rate (frozen by a
    fingerprint: docs/crucible.md).

    Attributes:
        command: argv run in the world directory; ``{python}`` is replaced by this interpreter.
        lab: instead of ``command``: the pass rate of live runs of a workflow of the world (:class:`LabSpec`).
        direction: ``maximize`` or ``minimize`` — required, never inferred.
        reads: files or directories the judge reads (world-relative unless absolute);
            hashed into the fingerprint and protected from candidates (deny gate).
        env: environment the judge declares (fingerprinted). The judge gets only these
            plus ``PATH``, ``HOME``, ``LANG``, ``LC_ALL``, ``TMPDIR``.
        timeout_s: a run longer than this is an invalid reading (s).
        repeats: how many times one measurement runs the command (noise).
        unit: what the score counts (``tokens``, ``s``, ``%``…), for the plot and the tables.
    """

    command: tuple[str, ...] = ()
    lab: LabSpec | None = None
    direction: Direction
    reads: tuple[str, ...] = ()
    env: dict[str, str] = {}
    timeout_s: float = 300.0
    repeats: int = 1
    unit: str = ""


class Regime(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One segment's goalpost: a judge and an optional goal (Solved when the best reaches it).

    Regimes run in order: when one is solved and another follows, the loop rescopes
    to the next (one ``Segment`` assignment).
    """

    name: str
    judge: JudgeSpec
    goal: float | None = None


ConfirmRule = Literal["all", "mean"]


class NoiseSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Keep/discard margin and the confirmation before a keep.

    A candidate is kept only if its improvement over the best exceeds
    ``max(abs_margin, rel_margin·|best|, k_sigma·σ)`` where σ is the sample standard
    deviation of the segment's repeated baseline readings (needs ``baseline_repeats ≥ 2``).

    A would-be keep (its first reading passes that test against the best snapshot's
    readings) is confirmed first: it is measured ``confirm_repeats`` more times and, with
    ``remeasure_incumbent``, the best snapshot as often (at least once), alternately. Every
    value of the best snapshot (its earlier ones and the fresh ones) gives its corrected
    score (their mean), committed whatever the decision. Then ``confirm_rule`` decides:

    * ``all`` (default) — every value of the candidate beats every value of the best
      snapshot by more than the margin (a no-op passes with probability 1/C(n+m, n) for
      n candidate and m incumbent values: 1/35 at the defaults' first confirmation);
    * ``mean`` — the mean of the candidate's values beats the corrected score by more than the margin.

    ``confirm_repeats: 0`` with ``remeasure_incumbent: false`` is the one-reading rule.

    Attributes:
        confirm_repeats: extra measurements of a would-be keep (each ``judge.repeats`` runs).
        remeasure_incumbent: measure the best snapshot again while confirming.
        confirm_rule: how candidate and incumbent values combine with the margin.
    """

    abs_margin: float = 0.0
    rel_margin: float = 0.0
    k_sigma: float = 0.0
    baseline_repeats: int = 1
    remeasure_incumbent: bool = True
    confirm_repeats: int = 3
    confirm_rule: ConfirmRule = "all"


class ProposerSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Exactly one of ``command`` (edits the world) or ``model`` (a Reel model adapter, answers a diff).

    Attributes:
        instructions: prepended to a model proposer's prompt.
        timeout_s: a proposer run longer than this fails the iteration (s).
        max_cost_usd: the most one proposer call may cost (USD), declared: the cost budget
            stops before an iteration when this much more could pass it (else the estimate).
        pass_env: variables a ``command`` proposer gets from crucible's environment (e.g. the API key of
            the model it calls), besides ``PATH``, ``HOME``, ``LANG``, ``LC_ALL``, ``TMPDIR`` and its
            ``CRUCIBLE_*`` variables; nothing else crosses (``REEL_NATS_*`` is refused).
    """

    command: tuple[str, ...] = ()
    model: ModelSpec | None = None
    instructions: str = ""
    timeout_s: float = 600.0
    max_cost_usd: float | None = None
    pass_env: tuple[str, ...] = ()


class BudgetSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Budgets: iterations, active wall time (parked time excluded), cost in USD.

    The loop stops *before* an iteration that could overshoot: the next iteration
    is estimated at the most expensive/longest one so far (at least
    ``cost_estimate_usd`` / ``wall_estimate_s``).
    """

    iterations: int = 20
    wall_s: float | None = None
    cost_usd: float | None = None
    cost_estimate_usd: float = 0.0
    wall_estimate_s: float = 0.0


class ParkSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A probe run before every iteration: exit 0 = go, 75 = park (stdout's last line is the reason).

    Any other exit escalates (a broken gate needs a human). While parked the loop
    re-probes every ``poll_s`` seconds; parked time does not count against ``wall_s``. The probe gets
    ``PATH``, ``HOME``, ``LANG``, ``LC_ALL``, ``TMPDIR`` and the variables ``pass_env`` names, nothing else.
    """

    command: tuple[str, ...]
    poll_s: float = 5.0
    pass_env: tuple[str, ...] = ()


class GateSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Gates: deny, park, provisioning.

    Attributes:
        protect: world paths (files or directories) no candidate may touch, besides the
            judges' ``reads`` and the config file itself (always protected).
        on_deny: ``escalate`` (default: stop, roll back, needs a human) or ``skip``.
        retry_s: wait between retries while a resource is unavailable (exit 75) (s).
        max_block_s: escalate when one block lasts longer than this (s).
    """

    protect: tuple[str, ...] = ()
    park: ParkSpec | None = None
    on_deny: OnDeny = "escalate"
    retry_s: float = 5.0
    max_block_s: float = 600.0


class SessionConfig(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One crucible session's settings, frozen into its log at start."""

    name: str = "crucible"
    world: WorldSpec
    regimes: tuple[Regime, ...]
    proposer: ProposerSpec
    noise: NoiseSpec = NoiseSpec()
    budget: BudgetSpec = BudgetSpec()
    gates: GateSpec = GateSpec()
    config_path: str = ""

    def regime(self, name: str) -> Regime:
        """The regime called ``name``.

        Raises:
            ConfigInvalid: no such regime.
        """
        for r in self.regimes:
            if r.name == name:
                return r
        raise ConfigInvalid(f"no regime {name!r} (have {', '.join(r.name for r in self.regimes)})")

    def next_regime(self, name: str) -> Regime | None:
        """The regime after ``name``, or ``None`` if it is the last."""
        names = [r.name for r in self.regimes]
        i = names.index(name)
        return self.regimes[i + 1] if i + 1 < len(names) else None


def expand(text: str, env: Mapping[str, str]) -> str:
    """Replace ``${NAME}`` / ``${NAME:-default}`` from ``env`` (innermost first).

    Raises:
        ConfigInvalid: a variable without default is not set.
    """
    return interpolate.expand(text, env, lambda name: ConfigInvalid(f"${{{name}}} is not set and has no default"))


def _abs(path: str, base: str) -> str:
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(base, path))


def _judge(raw: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    out = dict(raw)
    if isinstance(raw.get("lab"), dict):
        lab = dict(raw["lab"])
        if isinstance(lab.get("env"), dict):
            values = {k: expand(str(v), env) for k, v in lab["env"].items()}
            lab["env"] = {k: os.path.normpath(v) if "/../" in v or v.endswith("/..") else v for k, v in values.items()}
        out["lab"] = lab
        out.setdefault("direction", "maximize")
        out.setdefault("unit", "pass rate")
    declared = {k: expand(str(v), env) for k, v in (raw.get("env") or {}).items()}
    declared = {k: os.path.normpath(v) if "/../" in v or v.endswith("/..") else v for k, v in declared.items()}
    out["env"] = declared
    scope = {**env, **declared}
    out["reads"] = [expand(str(p), scope) for p in raw.get("reads") or ()]
    return out


def parse_config(data: Mapping[str, Any], *, config_dir: str, cwd: str, environ: Mapping[str, str],
                 config_path: str = "") -> SessionConfig:
    """Validate a config mapping (from YAML/JSON) into a :class:`SessionConfig` (pure).

    A top-level ``judge`` (+ ``goal``) is shorthand for one regime named ``main``.

    Args:
        config_dir: directory of the config file (``${CONFIG_DIR}``; base of relative ``world.repo``).
        cwd: base of a relative ``world.workdir``.
        environ: the environment ``${NAME}`` reads.

    Raises:
        ConfigInvalid: unknown or missing fields, bad types, or an inconsistent config.
    """
    env = {**environ, "CONFIG_DIR": config_dir}
    raw = dict(data)
    if "judge" in raw:
        if "regimes" in raw:
            raise ConfigInvalid("give either `judge` (+ `goal`) or `regimes`, not both")
        raw["regimes"] = [{"name": "main", "judge": raw.pop("judge"), "goal": raw.pop("goal", None)}]
    raw["regimes"] = [{**r, "judge": _judge(dict(r.get("judge") or {}), env)} for r in raw.get("regimes") or ()]
    world = dict(raw.get("world") or {})
    if "repo" in world:
        world["repo"] = _abs(expand(str(world["repo"]), env), config_dir)
    world["workdir"] = _abs(expand(str(world.get("workdir", DEFAULT_WORKDIR)), env), cwd)
    raw["world"] = world
    gates = dict(raw.get("gates") or {})
    gates["protect"] = [expand(str(p), env) for p in gates.get("protect") or ()]
    raw["gates"] = gates
    raw["config_path"] = config_path
    try:
        cfg = msgspec.convert(raw, SessionConfig)
    except msgspec.ValidationError as exc:
        raise ConfigInvalid(f"invalid crucible config: {with_field_hint(str(exc), SessionConfig, raw)}") from exc
    validate(cfg)
    return cfg


def validate(cfg: SessionConfig) -> SessionConfig:
    """Check what the schema cannot (returns ``cfg``).

    Raises:
        ConfigInvalid: the first problem found.
    """
    if not cfg.regimes:
        raise ConfigInvalid("at least one regime (or a top-level `judge`) is required")
    names = [r.name for r in cfg.regimes]
    if len(set(names)) != len(names):
        raise ConfigInvalid(f"regime names must be unique: {names}")
    for r in cfg.regimes:
        if r.judge.lab is not None:
            _check_lab(r.name, r.judge)
        elif not r.judge.command:
            raise ConfigInvalid(f"regime {r.name!r}: the judge needs a `command` or a `lab`")
        if r.judge.repeats < 1 or r.judge.timeout_s <= 0:
            raise ConfigInvalid(f"regime {r.name!r}: judge.repeats must be ≥ 1 and timeout_s > 0")
    if bool(cfg.proposer.command) == (cfg.proposer.model is not None):
        raise ConfigInvalid("proposer needs exactly one of `command` or `model`")
    if cfg.budget.iterations < 0:
        raise ConfigInvalid("budget.iterations must be ≥ 0")
    if cfg.noise.baseline_repeats < 1:
        raise ConfigInvalid("noise.baseline_repeats must be ≥ 1")
    if cfg.noise.confirm_repeats < 0:
        raise ConfigInvalid("noise.confirm_repeats must be ≥ 0")
    if cfg.proposer.max_cost_usd is not None and cfg.proposer.max_cost_usd < 0:
        raise ConfigInvalid("proposer.max_cost_usd must be ≥ 0")
    if cfg.noise.k_sigma > 0 and max(cfg.noise.baseline_repeats, *(r.judge.repeats for r in cfg.regimes)) < 2:
        raise ConfigInvalid("noise.k_sigma needs a repeated baseline (noise.baseline_repeats ≥ 2)")
    _check_process_envs(cfg)
    return cfg


def _check_lab(regime: str, judge: JudgeSpec) -> None:
    """A ``lab`` judge's settings: one kind of judge, a pass rate maximized, counts ≥ 1, world-relative files.

    Raises:
        ConfigInvalid: naming the regime and the setting.
    """
    lab = judge.lab
    assert lab is not None
    where = f"regime {regime!r}: judge.lab"
    if judge.command:
        raise ConfigInvalid(f"regime {regime!r}: a judge is a `command` or a `lab`, not both")
    if judge.direction != "maximize":
        raise ConfigInvalid(f"{where} scores a pass rate: its direction must be maximize, not {judge.direction}")
    if lab.runs < 1:
        raise ConfigInvalid(f"{where}.runs must be ≥ 1 (runs per reading), got {lab.runs}")
    if lab.concurrency < 1:
        raise ConfigInvalid(f"{where}.concurrency must be ≥ 1, got {lab.concurrency}")
    if not lab.verifier.strip():
        raise ConfigInvalid(f"{where}.verifier must name one of the workflow's verifiers")
    for what, path in (("workflow", lab.workflow), *((f"files.{k}", v) for k, v in lab.files.items())):
        parts = os.path.normpath(path).split(os.sep)
        if not path.strip() or os.path.isabs(path) or parts[0] == "..":
            raise ConfigInvalid(f"{where}.{what} must be a path inside the world (relative, no `..`), got {path!r}")
    if os.path.splitext(lab.workflow)[1] not in (".yaml", ".yml", ".json"):
        raise ConfigInvalid(f"{where}.workflow must be a .yaml, .yml or .json workflow file, got {lab.workflow!r}")
    clash = sorted(set(lab.files) & set(lab.env))
    if clash:
        raise ConfigInvalid(f"{where}: {', '.join(clash)} is both in `files` and in `env`")


def _check_process_envs(cfg: SessionConfig) -> None:
    """The judges' ``env``, the proposer's and the park probe's ``pass_env``: no ``REEL_NATS_*`` name
    (:func:`reel.shared.core.env.toolenv.check_tool_env`)."""
    try:
        for r in cfg.regimes:
            check_tool_env(r.judge.env, (), f"regime {r.name}: judge")
        check_tool_env({}, cfg.proposer.pass_env, "proposer")
        if cfg.gates.park is not None:
            check_tool_env({}, cfg.gates.park.pass_env, "gates.park")
    except WorkflowInvalid as exc:
        raise ConfigInvalid(exc.message) from None
