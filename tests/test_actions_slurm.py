"""The actor against a real Slurm (slurmctld and one slurmd per node on this host, tests/slurm_cluster.py)
and the real InfluxDB: the plan names real nodes and changes nothing, a drain and its undo, every
rule of the safety policy (budget, an operator's drain kept, a manual resume respected, idempotent
after a kill, the scheduler down or hung) and bad input (unknown nodes, metacharacters, a node map
that names nothing)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from actions.records import read_records
from actions.scheduler import SchedulerError
from actions.slurm import SlurmScheduler
from rankscope.incident import IncidentClass
from tests.action_incidents import incident, policy, rankscope, run_pass, states, write
from tests.alertmanager_server import wait_for
from tests.influx_server import free_port
from tests.slurm_cluster import SlurmCluster

NODES = ["gpu-node-01294", "gpu-node-01295", "gpu-node-00017", "gpu-node-00018", "n1300"]


@pytest.fixture(scope="module")
def slurm():
    cluster = SlurmCluster(NODES).start()
    try:
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture
def cluster(slurm):
    slurm.reset()
    return slurm


def sched(cluster: SlurmCluster, timeout_s: float = 10.0) -> SlurmScheduler:
    return SlurmScheduler(timeout_s=timeout_s, env=cluster.env)


def _cli(store, cluster: SlurmCluster, tmp_path, *args: str, config: str = "") -> subprocess.CompletedProcess:
    conf = tmp_path / "rankscope.toml"
    conf.write_text("[actions]\nmode = \"enforce\"\nsettle_s = 0.1\n" + config)
    return rankscope(["act", "--store", store.url, "--bucket", store.bucket, "--config", str(conf), *args],
                     {"SLURM_CONF": str(cluster.conf)})


def test_the_dry_run_names_the_real_node_and_changes_nothing(influx_store, cluster, tmp_path):
    inc = incident("il-0477", ["gpu-node-01294.dc1.example.com"])   # the collector's FQDN: its short name
    write(influx_store, inc)
    out = _cli(influx_store, cluster, tmp_path, "--json")
    assert out.returncode == 0, out.stderr
    (action,) = json.loads(out.stdout)["actions"]
    assert set(action) == {"incident", "job", "node", "action", "state", "reason", "at"}
    assert (action["incident"], action["job"], action["node"], action["action"], action["state"]) == (
        inc.id, "il-0477", "gpu-node-01294", "drain", "planned")
    assert 'scontrol update NodeName=gpu-node-01294 State=DRAIN Reason="rankscope cs-30-r10352: ' \
           'compute_straggler mlp 5.7x' in action["reason"]
    assert cluster.node("gpu-node-01294")["state"] == "IDLE"                   # nothing changed
    assert "reason set to" not in cluster.log()
    assert states(influx_store) == {("il-0477", inc.id, "gpu-node-01294", "drain"): "planned"}
    again = _cli(influx_store, cluster, tmp_path, "--json")                     # the same plan: no new point
    assert json.loads(again.stdout)["actions"][0]["state"] == "planned"
    assert len(read_records(influx_store)) == 1


def test_enforce_drains_once_and_undo_resumes(influx_store, cluster, tmp_path):
    inc = incident("il-0477", ["gpu-node-01294"])
    write(influx_store, inc)
    out = _cli(influx_store, cluster, tmp_path, "--enforce")
    assert out.returncode == 0, out.stderr
    assert "[done] drain gpu-node-01294" in out.stdout
    node = cluster.node("gpu-node-01294")
    assert "DRAIN" in node["state"] and node["reason"].startswith(f"rankscope {inc.id}: compute_straggler mlp 5.7x")
    _cli(influx_store, cluster, tmp_path, "--enforce")                          # a second pass: nothing new
    assert cluster.log().count("reason set to: rankscope") == 1
    assert [r.state for r in read_records(influx_store)] == ["planned", "done"]
    undo = _cli(influx_store, cluster, tmp_path, "--enforce", "--undo", inc.id, "--json")
    assert undo.returncode == 0, undo.stderr
    assert {(a["action"], a["state"]) for a in json.loads(undo.stdout)["actions"]} == {("resume", "done")}
    wait_for(lambda: "DRAIN" not in cluster.node("gpu-node-01294")["state"] or None, 10, "resumed")
    _cli(influx_store, cluster, tmp_path, "--enforce")                          # never drained again for it
    assert "DRAIN" not in cluster.node("gpu-node-01294")["state"]
    assert states(influx_store)[("il-0477", inc.id, "gpu-node-01294", "drain")] == "skipped"


def test_the_budget_refuses_past_two_drains_an_hour_and_one_node_per_job(influx_store, cluster):
    write(influx_store, incident("a", ["gpu-node-01294"]), incident("b", ["gpu-node-01295"], rank=800),
          incident("c", ["gpu-node-00017"], rank=136), incident("a", ["gpu-node-00018"], rank=144))
    result = run_pass(influx_store, sched(cluster))
    by_node = {r.node: r for r in result.actions}
    drained = sorted(n for n, r in by_node.items() if r.state == "done")
    assert drained == ["gpu-node-01294", "gpu-node-01295"]                     # the oldest onsets first
    refused = [r for r in result.actions if r.state == "refused"]
    assert len(refused) == 2 and all("over budget: 2 drain(s) in the last hour cluster-wide" in r.reason
                                     and "a person must act" in r.reason for r in refused)
    assert sum("DRAIN" in cluster.node(n)["state"] for n in NODES) == 2


def test_one_node_per_job_an_hour(influx_store, cluster):
    write(influx_store, incident("a", ["gpu-node-01294"]), incident("a", ["gpu-node-00018"], rank=144))
    result = run_pass(influx_store, sched(cluster))
    assert sorted(r.state for r in result.actions) == ["done", "refused"]
    (refused,) = [r for r in result.actions if r.state == "refused"]
    assert "job a lost 1 node(s) in the last hour" in refused.reason
    wide = incident("b", ["gpu-node-00017", "gpu-node-01295"], rank=136)   # two hosts at once: more than a job may lose
    write(influx_store, wide)
    more = [r for r in run_pass(influx_store, sched(cluster)).actions if r.job == "b"]
    assert [r.state for r in more] == ["refused", "refused"] and "names 2 hosts" in more[0].reason


def test_an_operators_drain_is_kept(influx_store, cluster):
    cluster.scontrol("update", "NodeName=gpu-node-01294", "State=DRAIN", "Reason=maintenance by ops")
    write(influx_store, incident("il-0477", ["gpu-node-01294"]))
    (r,) = run_pass(influx_store, sched(cluster)).actions
    assert r.state == "skipped" and r.final and "someone else" in r.reason and "maintenance by ops" in r.reason
    assert cluster.node("gpu-node-01294")["reason"].startswith("maintenance by ops")
    cluster.scontrol("update", "NodeName=gpu-node-01294", "State=RESUME")   # the operator is done: still not ours
    (again,) = run_pass(influx_store, sched(cluster)).actions
    assert again == r and "DRAIN" not in cluster.node("gpu-node-01294")["state"]


def test_a_manual_resume_is_respected_for_good(influx_store, cluster):
    inc = incident("il-0477", ["gpu-node-01295"], rank=800)
    write(influx_store, inc)
    assert run_pass(influx_store, sched(cluster)).actions[0].state == "done"
    cluster.scontrol("update", "NodeName=gpu-node-01295", "State=RESUME")      # an operator put it back
    for _ in range(2):
        (r,) = run_pass(influx_store, sched(cluster)).actions
        assert r.state == "skipped" and r.final and "an operator resumed it" in r.reason
    assert "DRAIN" not in cluster.node("gpu-node-01295")["state"]
    assert cluster.log().count("reason set to: rankscope") == 1


def test_an_actor_killed_between_its_drain_and_its_record_never_drains_twice(influx_store, cluster, tmp_path):
    calls, drained = tmp_path / "calls.log", tmp_path / "drained"
    wrapper = tmp_path / "scontrol"
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nscontrol \"$@\" || exit $?\n"
                       f"case \"$*\" in *State=DRAIN*) touch {drained}; sleep 60;; esac\n")
    wrapper.chmod(0o755)
    inc = incident("il-0477", ["gpu-node-00017"], rank=136)
    write(influx_store, inc)
    conf = tmp_path / "kill.toml"
    conf.write_text(f"[actions]\nsettle_s = 0.1\nscontrol = \"{wrapper}\"\n")
    exe = os.path.join(os.path.dirname(sys.executable), "rankscope")
    proc = subprocess.Popen([exe, "act", "--enforce", "--store", influx_store.url, "--bucket", influx_store.bucket,
                             "--config", str(conf)], env={**os.environ, "SLURM_CONF": str(cluster.conf)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: drained.exists() or None, 30, "the drain call")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    key = ("il-0477", inc.id, "gpu-node-00017", "drain")
    assert states(influx_store)[key] == "planned"                            # the intent, stored before the call
    (r,) = run_pass(influx_store, SlurmScheduler(str(wrapper), 10, cluster.env)).actions
    assert r.state == "done"
    assert [c for c in calls.read_text().splitlines() if "State=DRAIN" in c] == [
        f"update NodeName=gpu-node-00017 State=DRAIN Reason=rankscope {inc.id}: compute_straggler mlp 5.7x job il-0477"]
    assert cluster.log().count("reason set to: rankscope") == 1


def test_a_controller_that_is_down_or_hangs_gives_failed_and_a_retry_with_backoff(influx_store, cluster):
    inc = incident("il-0477", ["gpu-node-01294"])
    write(influx_store, inc)
    cluster.pause_controller()                                                  # hung: answers nothing
    t0 = time.monotonic()
    (r,) = run_pass(influx_store, sched(cluster, timeout_s=1.0)).actions
    assert time.monotonic() - t0 < 8
    assert r.state == "failed" and "did not answer within 1 s" in r.reason and r.attempt == 1
    assert r.retry_ms - r.at == 60_000                                          # retry_base_s
    cluster.resume_controller()
    (same,) = run_pass(influx_store, sched(cluster)).actions                    # before its retry time: not tried
    assert same == r
    cluster.stop_controller()                                                   # down: refuses connections
    later = lambda: time.time() + 61                                            # noqa: E731
    (r2,) = run_pass(influx_store, sched(cluster), clock=later).actions
    assert r2.state == "failed" and "Unable to contact slurm controller" in r2.reason and r2.attempt == 2
    assert r2.retry_ms - r2.at == 120_000                                       # backoff doubles
    cluster.start_controller()
    (r3,) = run_pass(influx_store, sched(cluster), clock=lambda: time.time() + 200).actions
    assert r3.state == "done" and "DRAIN" in cluster.node("gpu-node-01294")["state"]


def test_bad_names_unknown_nodes_and_a_node_map_that_names_nothing_are_refused(influx_store, cluster):
    write(influx_store, incident("j1", ["gpu;rm -rf /"]), incident("j2", ["gpu-node-[01-02]"], rank=16),
          incident("j3", ["gpu-node-99999"], rank=24), incident("j4", ["rack7-slot3"], rank=32),
          incident("j5", ["rack9-slot1"], rank=40))
    result = run_pass(influx_store, sched(cluster), node_map={"rack7-slot3": "n1300", "rack9-slot1": "n404"})
    by_job = {r.job: r for r in result.actions}
    assert by_job["j1"].state == "refused" and "metacharacters" in by_job["j1"].reason
    assert by_job["j2"].state == "refused" and "metacharacters" in by_job["j2"].reason
    assert by_job["j3"].state == "refused" and "no Slurm node for host 'gpu-node-99999'" in by_job["j3"].reason
    assert by_job["j4"].node == "n1300" and by_job["j4"].state == "done"        # the map, used
    assert by_job["j5"].state == "refused" and "names nothing" in by_job["j5"].reason
    assert "DRAIN" in cluster.node("n1300")["state"]
    assert cluster.log().count("reason set to: rankscope") == 1


def test_hostile_incident_ids_and_node_map_targets_never_reach_scontrol(influx_store, cluster):
    bad_id = replace(incident("j1", ["gpu-node-01294"]), id='cs-30-r1" State=RESUME Reason="x')
    write(influx_store, bad_id, incident("j2", ["rack7-slot3"], rank=16))
    result = run_pass(influx_store, sched(cluster), node_map={"rack7-slot3": "n1300 State=DOWN"})
    by_job = {r.job: r for r in result.actions}
    assert by_job["j1"].state == "refused" and "incident id" in by_job["j1"].reason
    assert by_job["j2"].state == "refused" and "metacharacters" in by_job["j2"].reason
    assert "DRAIN" not in cluster.node("gpu-node-01294")["state"] and "DRAIN" not in cluster.node("n1300")["state"]
    assert "reason set to" not in cluster.log()


def test_the_policy_acts_on_confirmed_fresh_node_verdicts_only(influx_store, cluster):
    write(influx_store, incident("early", ["gpu-node-01294"], confirmed=False),
          incident("stale", ["gpu-node-01295"], rank=800, updated_s=7200),
          incident("stall", ["gpu-node-00017"], rank=136, cls=IncidentClass.TRANSIENT_STALL),
          incident("hw", ["gpu-node-00018"], rank=144))
    result = run_pass(influx_store, sched(cluster), enforce=False, require_hardware=True)
    by_job = {r.job: r for r in result.actions}
    assert "stall" not in by_job                                                # not a class that names a node
    assert by_job["early"].state == "skipped" and "not confirmed" in by_job["early"].reason
    assert by_job["stale"].state == "skipped" and "stale" in by_job["stale"].reason
    assert by_job["hw"].state == "skipped" and "no hardware evidence" in by_job["hw"].reason
    write(influx_store, incident("hw", ["gpu-node-00018"], rank=144, hardware={"verdict": "hardware_fault"}))
    again = {r.job: r for r in run_pass(influx_store, sched(cluster), enforce=False, require_hardware=True).actions}
    assert again["hw"].state == "planned"
    assert not any("DRAIN" in cluster.node(n)["state"] for n in NODES)


def test_slurm_conf_is_what_finds_the_cluster(cluster, tmp_path):
    assert "gpu-node-01294" in {n["NodeName"] for n in sched(cluster).nodes()}
    other = tmp_path / "slurm.conf"
    other.write_text(f"ClusterName=none\nSlurmctldHost=nowhere(127.0.0.1)\nSlurmctldPort={free_port()}\n"
                     f"AuthType=auth/munge\n")
    with pytest.raises(SchedulerError, match="scontrol show node failed .*Unable to contact"):
        SlurmScheduler(timeout_s=10, env={**cluster.env, "SLURM_CONF": str(other)}).nodes()
    assert policy().timeout_s == 20.0
