"""The actor on Kubernetes, through the official client, against a fake of the core/v1 nodes API
that answers as the real one (tests/kube_api_server.py): cordon, taint and annotation set and
undone exactly, the node's other taints kept across a conflicting writer, every rule of the
safety policy, a slow or absent API server, bad input, and only the verbs the RBAC role grants."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from actions.actor import Actor
from actions.kubernetes_nodes import ANNOTATION, TAINT_KEY, KubernetesScheduler
from tests.action_incidents import incident, policy, rankscope, run_pass, states, write
from tests.kube_api_server import FakeKubeAPI, json_patch, merge_patch, node
from tests.test_kubernetes_manifests import ACTOR_VERBS

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture
def api():
    fake = FakeKubeAPI([node("ip-10-0-3-17", "gpu-node-01294", taints=[GPU_TAINT]), node("gpu-node-01295"),
                        node("gpu-node-00017"), node("gpu-node-00018"), node("k8s-w-1300")]).start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def kube(api, tmp_path):
    return KubernetesScheduler.from_config(api.kubeconfig(tmp_path / "kubeconfig"), timeout_s=5)


def _verbs(api: FakeKubeAPI) -> set[str]:
    """The RBAC verbs of the requests made (a GET of the collection is a list)."""
    return {"list" if (m, p) == ("GET", "/api/v1/nodes") else {"GET": "get", "PATCH": "patch"}.get(m, m)
            for m, p, _ in api.requests}


def _cli(store, api: FakeKubeAPI, tmp_path, *args: str) -> subprocess.CompletedProcess:
    conf = tmp_path / "rankscope.toml"
    conf.write_text(f"[actions]\nscheduler = \"kubernetes\"\nsettle_s = 0.1\n"
                    f"kubeconfig = \"{api.kubeconfig(tmp_path / 'kubeconfig')}\"\n")
    return rankscope(["act", "--store", store.url, "--bucket", store.bucket, "--config", str(conf), *args], {})


def test_the_plan_finds_the_node_by_its_hostname_label_and_reads_only(influx_store, api, tmp_path):
    inc = incident("il-0477", ["gpu-node-01294"])
    write(influx_store, inc)
    before = api.get("ip-10-0-3-17")
    out = _cli(influx_store, api, tmp_path, "--json")
    assert out.returncode == 0, out.stderr
    (a,) = json.loads(out.stdout)["actions"]
    assert (a["node"], a["state"]) == ("ip-10-0-3-17", "planned")
    assert f"taint {TAINT_KEY}=compute_straggler:NoSchedule" in a["reason"] and "cordon ip-10-0-3-17" in a["reason"]
    assert api.get("ip-10-0-3-17") == before and _verbs(api) == {"get", "list"}


def test_a_drain_keeps_the_other_taints_through_a_conflicting_writer_and_its_undo_removes_only_its_own(
        influx_store, api, kube):
    inc = incident("il-0477", ["gpu-node-01294"])
    write(influx_store, inc)
    original = api.get("ip-10-0-3-17")
    other = {"key": "example.com/maintenance-window", "value": "tonight", "effect": "PreferNoSchedule"}

    def someone_else(name: str) -> None:      # another controller writes the node between read and write
        api.on_patch = None
        n = api.get(name)
        n["spec"]["taints"] = [*n["spec"]["taints"], other]
        api.put(n)

    api.on_patch = someone_else
    (r,) = run_pass(influx_store, kube).actions
    assert r.state == "done"
    n = api.get("ip-10-0-3-17")
    assert n["spec"]["unschedulable"] is True and n["metadata"]["annotations"][ANNOTATION] == inc.id
    assert n["spec"]["taints"] == [GPU_TAINT, other, {"key": TAINT_KEY, "value": "compute_straggler",
                                                      "effect": "NoSchedule"}]
    assert [c for m, _, c in api.requests if m == "PATCH"] == ["application/merge-patch+json"] * 2   # 409, again
    undone = {(x.action, x.state) for x in Actor(influx_store, policy(), kube, enforce=True).undo(inc.id).actions}
    assert undone == {("resume", "done")}
    after = api.get("ip-10-0-3-17")
    assert after["spec"] == {**original["spec"], "taints": [GPU_TAINT, other]}
    assert after["metadata"]["annotations"] == original["metadata"]["annotations"]
    assert _verbs(api) <= ACTOR_VERBS


def test_budget_an_operators_cordon_and_a_manual_uncordon(influx_store, api, kube):
    cordoned = api.get("gpu-node-00018")
    cordoned["spec"]["unschedulable"] = True            # an operator's cordon, no rankscope mark
    api.put(cordoned)
    # onsets a second apart, a first: the actor takes the oldest onset first (created in the same
    # millisecond, as on a loaded machine, their order was the store's)
    write(influx_store, incident("a", ["gpu-node-01295"], rank=800, age_s=603),
          incident("b", ["gpu-node-00017"], rank=136, age_s=602),
          incident("c", ["k8s-w-1300"], rank=200, age_s=601), incident("d", ["gpu-node-00018"], rank=144))
    by_job = {r.job: r for r in run_pass(influx_store, kube).actions}
    assert (by_job["a"].state, by_job["b"].state) == ("done", "done")
    assert by_job["c"].state == "refused" and "over budget" in by_job["c"].reason
    assert by_job["d"].state == "skipped" and by_job["d"].final and "someone else" in by_job["d"].reason
    assert api.get("gpu-node-00018")["metadata"]["annotations"].get(ANNOTATION) is None
    n = api.get("gpu-node-01295")                       # an operator uncordons what rankscope cordoned
    n["spec"].pop("unschedulable")
    api.put(n)
    again = {r.job: r for r in run_pass(influx_store, kube).actions}
    assert again["a"].state == "skipped" and again["a"].final and "an operator resumed it" in again["a"].reason
    assert "unschedulable" not in api.get("gpu-node-01295")["spec"]
    assert _verbs(api) <= ACTOR_VERBS


def test_an_actor_killed_after_its_patch_never_patches_twice(influx_store, api, tmp_path):
    inc = incident("il-0477", ["gpu-node-00017"], rank=136)
    write(influx_store, inc)
    patched = threading.Event()
    api.after_patch = lambda name: (patched.set(), time.sleep(20))
    conf = tmp_path / "kill.toml"
    conf.write_text(f"[actions]\nscheduler = \"kubernetes\"\nsettle_s = 0.1\ntimeout_s = 60\n"
                    f"kubeconfig = \"{api.kubeconfig(tmp_path / 'kubeconfig')}\"\n")
    exe = os.path.join(os.path.dirname(sys.executable), "rankscope")
    proc = subprocess.Popen([exe, "act", "--enforce", "--store", influx_store.url, "--bucket", influx_store.bucket,
                             "--config", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert patched.wait(30)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    api.after_patch = None
    assert states(influx_store)[("il-0477", inc.id, "gpu-node-00017", "drain")] == "planned"
    kube = KubernetesScheduler.from_config(str(tmp_path / "kubeconfig"), timeout_s=5)
    (r,) = run_pass(influx_store, kube).actions
    assert r.state == "done"
    assert [m for m, p, _ in api.requests if m == "PATCH"] == ["PATCH"]


def test_a_slow_or_absent_api_server_gives_failed_with_its_error(influx_store, api, tmp_path):
    write(influx_store, incident("il-0477", ["gpu-node-01295"], rank=800))
    api.delay_s = 3.0
    slow = KubernetesScheduler.from_config(api.kubeconfig(tmp_path / "kubeconfig"), timeout_s=1)
    t0 = time.monotonic()
    (r,) = run_pass(influx_store, slow).actions
    assert time.monotonic() - t0 < 6
    assert r.state == "failed" and "timed out" in r.reason.lower() and r.retry_ms > r.at
    api.delay_s = 0.0
    api.stop()
    (r2,) = run_pass(influx_store, slow, clock=lambda: time.time() + 61).actions
    assert r2.state == "failed" and r2.attempt == 2 and ("refused" in r2.reason.lower() or "connect" in r2.reason.lower())


def test_bad_names_unknown_nodes_and_a_node_map_that_names_nothing(influx_store, api, kube):
    write(influx_store, incident("j1", ["gpu$(reboot)"]), incident("j2", ["gpu-node-99999"], rank=16),
          incident("j3", ["gpu-node-00017.dc1.example.com"], rank=24), incident("j4", ["rack9-slot1"], rank=32))
    by_job = {r.job: r for r in run_pass(influx_store, kube, enforce=False, node_map={"rack9-slot1": "nope"}).actions}
    assert by_job["j1"].state == "refused" and "metacharacters" in by_job["j1"].reason
    assert by_job["j2"].state == "refused" and "no Kubernetes node for host 'gpu-node-99999'" in by_job["j2"].reason
    assert (by_job["j3"].node, by_job["j3"].state) == ("gpu-node-00017", "planned")      # its short name
    assert by_job["j4"].state == "refused" and "names nothing" in by_job["j4"].reason
    assert not [m for m, _, _ in api.requests if m == "PATCH"]


def test_the_fake_answers_as_the_api_server_does(api, kube):
    assert merge_patch({"a": {"b": 1, "c": [1, 2]}, "d": 1}, {"a": {"c": [3], "b": None}}) == {"a": {"c": [3]}, "d": 1}
    with pytest.raises(Exception, match="testing value"):
        json_patch({"metadata": {"resourceVersion": "1"}}, [{"op": "test", "path": "/metadata/resourceVersion",
                                                             "value": "2"}])
    rv = api.get("gpu-node-00017")["metadata"]["resourceVersion"]
    code, answer = api.patch("gpu-node-00017", "application/merge-patch+json",
                             {"metadata": {"resourceVersion": str(int(rv) - 1)}, "spec": {"unschedulable": True}})
    assert code == 409 and answer["reason"] == "Conflict" and "unschedulable" not in api.get("gpu-node-00017")["spec"]
    code, _ = api.patch("gpu-node-00017", "application/json-patch+json",
                        [{"op": "add", "path": "/spec/taints", "value": [GPU_TAINT]}])
    assert code == 200 and api.get("gpu-node-00017")["spec"]["taints"] == [GPU_TAINT]
    assert api.patch("nosuch", "application/merge-patch+json", {})[0] == 404
    assert api.patch("gpu-node-00017", "application/strategic-merge-patch+json", {})[0] == 415
    api.token = "another"                                  # the client's token no longer accepted
    with pytest.raises(Exception, match="401"):
        kube.state("gpu-node-00017")


def test_a_slow_api_server_is_retried_with_a_doubling_backoff_until_it_answers(influx_store, api, tmp_path):
    write(influx_store, incident("il-0477", ["gpu-node-01295"], rank=800))
    slow = KubernetesScheduler.from_config(api.kubeconfig(tmp_path / "kubeconfig"), timeout_s=1)
    api.delay_s = 3.0
    (r1,) = run_pass(influx_store, slow).actions
    (r2,) = run_pass(influx_store, slow, clock=lambda: time.time() + 61).actions
    assert (r1.state, r1.attempt, r1.retry_ms - r1.at) == ("failed", 1, 60_000)
    assert (r2.state, r2.attempt, r2.retry_ms - r2.at) == ("failed", 2, 120_000)   # backoff doubles
    (same,) = run_pass(influx_store, slow, clock=lambda: time.time() + 100).actions  # before its retry time
    assert same == r2
    api.delay_s = 0.0
    (r3,) = run_pass(influx_store, slow, clock=lambda: time.time() + 200).actions
    assert r3.state == "done" and api.get("gpu-node-01295")["spec"]["unschedulable"] is True
    assert [t["key"] for t in api.get("gpu-node-01295")["spec"]["taints"]] == [TAINT_KEY]


def test_hostile_incident_ids_and_node_map_targets_never_reach_the_api(influx_store, api, kube):
    from dataclasses import replace

    bad_id = replace(incident("j1", ["gpu-node-01295"]), id='cs-30-r1", "spec": {"unschedulable": false}')
    write(influx_store, bad_id, incident("j2", ["rack9-slot1"], rank=16))
    result = run_pass(influx_store, kube, node_map={"rack9-slot1": "gpu-node-00017/../../namespaces"})
    by_job = {r.job: r for r in result.actions}
    assert by_job["j1"].state == "refused" and "incident id" in by_job["j1"].reason
    assert by_job["j2"].state == "refused" and "refused: only letters" in by_job["j2"].reason
    assert not [m for m, _, _ in api.requests if m == "PATCH"]
