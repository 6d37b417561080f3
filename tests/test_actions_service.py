"""The actor run by the analyzer service after each cycle ([actions] mode), found through the core's
entry points, on a background thread the cycle never waits for; and one actor at a time across
replicas, through the store's lease. The Kubernetes fake stands in for the cluster's scheduler."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from actions.actor import Actor
from actions.kubernetes_nodes import ANNOTATION, KubernetesScheduler
from actions.lease import StoreLease
from actions.records import read_records
from analyzer.service.after_cycle import AfterCycle, after_cycle
from analyzer.service.analyzer_service import AnalyzerService
from analyzer.service.schedule import CycleGuard
from rankscope.after_cycle import after_cycle_hooks
from rankscope.cli import main
from simulator.scenario import Scenario
from simulator.simulate import simulate
from tests.action_incidents import incident, policy, write
from tests.kube_api_server import FakeKubeAPI, node

TOPO = {"tp": 1, "pp": 2, "dp": 8, "ep": 4, "gpus_per_node": 4}   # 16 ranks on gpu-node-00000..3


@pytest.fixture
def api():
    fake = FakeKubeAPI([node(f"gpu-node-{i:05d}") for i in range(4)]).start()
    try:
        yield fake
    finally:
        fake.stop()


def _config(tmp_path, api: FakeKubeAPI, mode: str) -> str:
    conf = tmp_path / "rankscope.toml"
    conf.write_text(f"[actions]\nmode = \"{mode}\"\nscheduler = \"kubernetes\"\nsettle_s = 0.1\n"
                    f"kubeconfig = \"{api.kubeconfig(tmp_path / 'kubeconfig')}\"\n")
    return str(conf)


def test_analyze_once_in_dry_run_plans_the_culprit_node_and_patches_nothing(influx_store, api, tmp_path):
    sc = Scenario.from_dict({"topology": TOPO, "run": {"job": "svc", "iterations": 40, "seed": 4},
                             "fault": [{"kind": "compute_slowdown", "ranks": "5", "factor": 2.5, "start": 15}]})
    simulate(sc, influx_store, progress=False)                                  # ends about now: fresh
    code = main(["analyze", "--once", "--quiet", "--store", influx_store.url, "--bucket", influx_store.bucket,
                 "--config", _config(tmp_path, api, "dry-run")])
    assert code == 0
    (r,) = read_records(influx_store)
    assert (r.job, r.node, r.action, r.state, r.mode) == ("svc", "gpu-node-00001", "drain", "planned", "dry-run")
    assert r.incident.startswith("cs-") and "cordon gpu-node-00001" in r.reason
    assert not [m for m, _, _ in api.requests if m == "PATCH"]


def test_the_mode_decides_whether_anything_runs_after_the_cycles(influx_store, api, tmp_path):
    assert after_cycle(influx_store, None) is None                              # no config: off
    assert after_cycle(influx_store, _config(tmp_path, api, "off")) is None
    hooks = after_cycle_hooks(influx_store, {"mode": "dry-run"})                 # found through entry points
    assert [name for name, _ in hooks] == ["actions"]
    with pytest.raises(ValueError, match="mode = 'on': must be one of off, dry-run, enforce"):
        after_cycle(influx_store, _config(tmp_path, api, "on"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[actions]\nmode = \"enforce\"\nmax_drains_per_hour = -1\n")
    with pytest.raises(ValueError, match="max_drains_per_hour = -1"):
        after_cycle(influx_store, bad)


def test_the_cycle_never_waits_on_a_hung_scheduler(influx_store, caplog):
    release, started = threading.Event(), threading.Event()

    def hung_pass() -> None:
        started.set()
        release.wait(30)

    after = AfterCycle([("actions", hung_pass)], slow_s=0.2)
    guard = CycleGuard(AnalyzerService(influx_store), 30, after=after)
    try:
        t0 = time.monotonic()
        assert guard.run()                                                      # a cycle (nothing stored)
        assert started.wait(5) and time.monotonic() - t0 < 5
        time.sleep(0.3)
        with caplog.at_level(logging.WARNING, "rankscope.analyze"):
            assert guard.run() and after.kick() is None                         # not started twice
        assert "the cycles go on without waiting" in caplog.text
        assert after.passes == 0
    finally:
        release.set()
        after.close()
    assert after.wait(5) and after.passes == 1


def test_two_replicas_in_enforce_mode_act_once_through_the_lease(influx_store, api, tmp_path):
    write(influx_store, incident("ha", ["gpu-node-00002"], rank=16))
    kube = KubernetesScheduler.from_config(api.kubeconfig(tmp_path / "kubeconfig"), timeout_s=5)
    actors = [Actor(influx_store, policy(settle_s=0.5), kube, enforce=True, name=f"replica-{k}",
                    lease=StoreLease(influx_store, f"replica-{k}", 120, 0.5)) for k in "ab"]
    results = [None, None]
    threads = [threading.Thread(target=lambda k=k: results.__setitem__(k, actors[k].run())) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r.held for r in results) == [False, True]
    (holder,) = [r for r in results if r.held]
    assert [a.state for a in holder.actions] == ["done"]
    assert [m for m, _, _ in api.requests if m == "PATCH"] == ["PATCH"]
    assert api.get("gpu-node-00002")["metadata"]["annotations"][ANNOTATION] == "cs-30-r16"
    loser = next(a for a, r in zip(actors, results, strict=True) if not r.held)
    assert not loser.run().held                                                 # the holder's lease stands
    winner = next(a for a, r in zip(actors, results, strict=True) if r.held)
    winner.lease.release()
    assert loser.run().held                                                     # released: the other acts
