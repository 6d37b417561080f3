"""deploy/kubernetes/ holds together without a cluster: each resource is valid against the
Kubernetes API's own schemas (strict: no unknown field), the StatefulSets give pod K the shard
K/N with N their replica count, the two replica sets differ in their names only, secrets come
from a Secret, and the liveness probe's command says what it should about the heartbeat.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from analyzer.service.analyze_cli import resolve_shard
from analyzer.service.shards import SHARD_ENV, Shard
from rankscope import __version__
from rankscope.cli import build_parser
from rankscope.config import store_settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "kubernetes"
KUSTOMIZATION = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
RESOURCES = {name: yaml.safe_load((DEPLOY / name).read_text()) for name in KUSTOMIZATION["resources"]}
BY_KIND: dict[str, list[dict]] = {}
for _doc in RESOURCES.values():
    BY_KIND.setdefault(_doc["kind"], []).append(_doc)
SETS = {s["metadata"]["name"]: s for s in BY_KIND["StatefulSet"]}
#: The oldest Kubernetes the manifests are for (the pod-index label: 1.28; matchLabelKeys in a
#: pod affinity term: 1.29), and the newest whose schemas the validator ships.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


def _container(sts: dict) -> dict:
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return container


def _env(sts: dict) -> dict[str, dict]:
    return {e["name"]: e for e in _container(sts)["env"]}


def test_the_kustomization_lists_every_file_and_sets_the_image():
    assert set(RESOURCES) == {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(BY_KIND) == {"ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget", "ServiceAccount",
                            "ClusterRole", "ClusterRoleBinding"}
    (image,) = KUSTOMIZATION["images"]
    assert image["newTag"] == __version__
    assert {_container(s)["image"] for s in SETS.values()} == {image["name"]}
    if shutil.which("kubectl"):   # where kubectl is installed, its own kustomize builds them too
        built = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True,
                               check=True, timeout=60).stdout
        docs = list(yaml.safe_load_all(built))
        assert sorted(d["metadata"]["name"] for d in docs) == sorted(
            d["metadata"]["name"] for d in RESOURCES.values())
        assert {f"rankscope:{__version__}"} == {c["image"] for d in docs if d["kind"] == "StatefulSet"
                                                 for c in d["spec"]["template"]["spec"]["containers"]}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(RESOURCES))
def test_each_resource_is_valid_against_the_api_schema(name, version):
    kubernetes_validate.validate(RESOURCES[name], version, strict=True)


def test_a_field_the_api_does_not_know_is_caught():
    """The validation above can fail: a misspelt field is refused."""
    sts = yaml.safe_load((DEPLOY / "analyzer-a.yaml").read_text())
    sts["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, VERSIONS[-1], strict=True)


def test_the_two_replica_sets_differ_in_their_names_only():
    a, b = (DEPLOY / "analyzer-a.yaml").read_text(), (DEPLOY / "analyzer-b.yaml").read_text()
    strip = lambda text: re.sub(r"^#.*\n", "", text, flags=re.M)   # noqa: E731 - the comments differ
    assert strip(b) == strip(a).replace("rankscope-analyzer-a", "rankscope-analyzer-b")
    assert set(SETS) == {"rankscope-analyzer-a", "rankscope-analyzer-b"}


@pytest.mark.parametrize("name", ["rankscope-analyzer-a", "rankscope-analyzer-b"])
def test_pod_k_analyzes_shard_k_of_n_and_the_n_pods_cover_every_job(name, monkeypatch):
    sts = SETS[name]
    spec = sts["spec"]
    env = _env(sts)
    count = int(env["SHARD_COUNT"]["value"])
    assert spec["replicas"] == count >= 2
    assert env["SHARD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    template = env[SHARD_ENV]["value"]
    assert template == "$(SHARD_INDEX)/$(SHARD_COUNT)"
    command = _container(sts)["command"]
    assert command[:2] == ["rankscope", "analyze"] and "--shard" not in command
    jobs = [f"job-{i}" for i in range(500)]
    owned: list[str] = []
    for ordinal in range(spec["replicas"]):   # Kubernetes' $(VAR) expansion, pod by pod
        value = template.replace("$(SHARD_INDEX)", str(ordinal)).replace("$(SHARD_COUNT)", str(count))
        monkeypatch.setenv(SHARD_ENV, value)
        args = build_parser().parse_args(command[1:])
        assert args.every == 30 and not args.once
        shard = resolve_shard(args)
        assert shard == Shard(ordinal, count)
        owned += shard.select(jobs)
    assert sorted(owned) == sorted(jobs)
    assert spec["serviceName"] == BY_KIND["Service"][0]["metadata"]["name"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert BY_KIND["Service"][0]["spec"]["clusterIP"] == "None"
    assert BY_KIND["Service"][0]["spec"]["selector"].items() <= labels.items()
    pdb = BY_KIND["PodDisruptionBudget"][0]["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"]["matchLabels"].items() <= labels.items()


def test_secrets_come_from_a_secret_and_the_settings_are_what_rankscope_reads():
    (config,) = BY_KIND["ConfigMap"]
    data = config["data"]
    secretish = re.compile(r"TOKEN|PASSWORD|SECRET|KEY", re.I)
    assert not [k for k in data if secretish.search(k)]
    for sts in SETS.values():
        container = _container(sts)
        assert container["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]
        for name, entry in _env(sts).items():
            if secretish.search(name):
                assert "value" not in entry and entry["valueFrom"]["secretKeyRef"]["name"] == "rankscope-influxdb"
    settings = store_settings(env={**data, "INFLUXDB_V2_TOKEN": "from-the-secret"})
    assert settings.is_influx and settings.bucket == "rankscope" and settings.org == "rankscope"
    assert settings.token == "from-the-secret"


def test_resources_security_and_the_heartbeat_on_a_writable_volume(monkeypatch):
    for sts in SETS.values():
        pod = sts["spec"]["template"]["spec"]
        container = _container(sts)
        res = container["resources"]
        assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert f"--uid {pod['securityContext']['runAsUser']} " in (ROOT / "Dockerfile").read_text()
        heartbeat = _env(sts)["RANKSCOPE_HEARTBEAT"]["value"]
        monkeypatch.setenv("RANKSCOPE_HEARTBEAT", heartbeat)   # what --heartbeat defaults to
        assert build_parser().parse_args(container["command"][1:]).heartbeat == heartbeat
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert str(Path(heartbeat).parent) in mounts                # writable: an emptyDir
        assert container["livenessProbe"]["exec"]["command"][:2] == ["python", "-c"]


def test_the_liveness_command_fails_once_the_heartbeat_is_old(tmp_path):
    probe = _container(SETS["rankscope-analyzer-a"])["livenessProbe"]
    code = probe["exec"]["command"][2]
    beat = tmp_path / "heartbeat"
    run = lambda: subprocess.run([sys.executable, "-c", code], env={**os.environ, "RANKSCOPE_HEARTBEAT": str(beat)},  # noqa: E731
                                 timeout=30).returncode
    beat.touch()
    assert run() == 0
    os.utime(beat, (time.time() - 601, time.time() - 601))
    assert run() == 1
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 120


#: What the actor may do to nodes (deploy/kubernetes/actor-clusterrole.yaml); the actions tests
#: check that every request it makes to the fake API server is one of these.
ACTOR_VERBS = {"get", "list", "patch"}


def test_the_actor_may_get_list_and_patch_nodes_and_nothing_more():
    (role,) = BY_KIND["ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": sorted(ACTOR_VERBS)}]
    (binding,) = BY_KIND["ClusterRoleBinding"]
    (account,) = BY_KIND["ServiceAccount"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert [s["name"] for s in binding["subjects"]] == [account["metadata"]["name"]]
    for sts in SETS.values():
        assert sts["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
