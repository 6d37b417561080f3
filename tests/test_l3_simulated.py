"""L3 on simulated kernel windows: a collective of one group degrading behind overlap (iteration
time flat) is a confirmed kernel finding and no incident; members that only wait are no culprits;
a healthy run confirms none."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.service.analyzer_service import AnalyzerService
from rankscope import schema
from simulator.kernel_windows import kernel_names
from simulator.scenario import Scenario, ScenarioError
from simulator.simulate import simulate

T0 = 1_770_000_000_000
TOPOLOGY = {"tp": 1, "pp": 2, "dp": 32, "ep": 8, "gpus_per_node": 8}


def _run(store, kernel_fault: list[dict], seed: int = 3):
    sc = Scenario.from_dict({"topology": TOPOLOGY, "run": {"job": "l3", "iterations": 60, "seed": seed,
                                                           "kernel_every": 5},
                             "kernel_fault": kernel_fault})
    truth = simulate(sc, store, start_ms=T0, progress=False)
    svc = AnalyzerService(store, jobs=["l3"])
    svc.cycle(final=True)
    found = store.read(schema.L3_KERNEL, "l3")
    return truth, svc, found


def test_a_collective_degrading_behind_overlap_is_a_kernel_finding_not_an_incident(influx_store):
    # EP group 1 (ranks 8-15, one host): its dispatch all-to-all 4x slow on every member, hidden
    truth, svc, found = _run(influx_store, [{"ranks": "8-15", "stage": "dispatch", "factor": 4.0, "start": 30}])
    stats = influx_store.read(schema.KERNEL_STATS, "l3")
    assert stats["iteration"].nunique() == 12 and len(stats) == 12 * 64
    confirmed = found[found["confirmed"] == 1]
    assert set(confirmed["rank"]) == set(range(8, 16)), found[["iteration", "rank", "name", "cause"]]
    assert set(confirmed["name"]) == {"nccl:dispatch"} and set(confirmed["kind"]) == {"comm"}
    assert set(confirmed["cause"]) == {"link"}           # all its members: the collective itself
    assert confirmed["iteration"].min() == 39            # windows 34 and 39: two in a row
    assert set(confirmed["host"]) == {"gpu-node-00001"} and (confirmed["ratio"] > 2).all()
    # the iteration time never moved: L1 and L2 have nothing to say, L3 is the only witness
    assert svc.incidents() == [] and not len(influx_store.read(schema.L1_CHANGEPOINT, "l3"))


def test_members_of_a_collective_that_wait_are_not_confirmed(influx_store):
    # one node of a 32-rank data-parallel reduce-scatter longer: its members waited, nobody's link
    _, svc, found = _run(influx_store, [{"ranks": "8-15", "stage": "reduce_scatter", "factor": 10.0,
                                         "start": 30}])
    late = found[found["name"] == "nccl:reduce_scatter"]
    assert set(late["rank"]) == set(range(8, 16)) and set(late["cause"]) == {"wait"}
    assert not (found["confirmed"] == 1).any()


def test_a_healthy_run_with_kernel_windows_confirms_nothing(influx_store):
    _, svc, found = _run(influx_store, [], seed=11)
    assert not len(found) or not (found["confirmed"] == 1).any(), found[["iteration", "rank", "name"]]
    assert svc.incidents() == []


def test_kernel_faults_are_checked_when_the_scenario_is_built():
    base = {"topology": TOPOLOGY, "run": {"kernel_every": 5}}
    for bad, match in (({"ranks": "8-15", "stage": "dataloader", "factor": 2.0}, "compute or comm stage"),
                       ({"ranks": "8-15", "stage": "mlp", "factor": -1}, "positive number"),
                       ({"ranks": "8-15", "stage": "mlp", "factor": 2.0, "start": 9, "end": 3}, "after start"),
                       ({"ranks": "8-999", "stage": "mlp", "factor": 2.0}, "outside the world"),
                       ({"ranks": "1", "stage": "mlp", "factor": 2.0, "speed": 1}, "speed")):
        with pytest.raises(ScenarioError, match=match):
            Scenario.from_dict({**base, "kernel_fault": [bad]})
    with pytest.raises(ScenarioError, match="kernel_every"):
        Scenario.from_dict({"topology": TOPOLOGY, "run": {"kernel_every": -5}})
    names = kernel_names(schema.DEFAULT_STAGES)
    assert "dataloader" not in names and names["mlp"] == ("mlp_gemm", "compute", "")
    assert names["dispatch"] == ("nccl:dispatch", "comm", "ep")
    assert np.all([k in ("compute", "comm") for _, k, _ in names.values()])


def _stall_run(store, host_side: bool):
    fault = {"kind": "transient_stall", "ranks": "8-15", "stage": "attention", "factor": 40.0, "start": 24,
             "end": 25, "every": 10, "repeats": 4, "host_side": host_side}
    sc = Scenario.from_dict({"topology": TOPOLOGY, "fault": [fault],
                             "run": {"job": "stall", "iterations": 60, "seed": 3, "kernel_every": 5}})
    simulate(sc, store, start_ms=T0, progress=False)
    svc = AnalyzerService(store, jobs=["stall"])
    for _ in range(2):   # live: windows and incidents come in their own order; the last cycle final
        svc.cycle(final=_ == 1)
    return svc, store.read(schema.INCIDENT, "stall"), store.read(schema.L3_KERNEL, "stall")


def test_a_stall_of_the_host_is_said_to_be_the_hosts_not_the_gpus(influx_store):
    svc, stored, found = _stall_run(influx_store, host_side=True)
    (inc,) = svc.incidents()
    assert inc.cls.value == "transient_stall" and inc.ranks == list(range(8, 16)) and inc.host_side
    assert inc.evidence["host_gap_ms"] > 100 and "the host did not launch" in inc.evidence["summary"]
    assert inc.action.startswith("Do not drain the GPUs")
    assert stored["title"].str.contains("host-side").all() and len(stored) == 1
    gaps = found[found["kernel"] == "launch_gap"]
    assert set(gaps["rank"]) == set(range(8, 16)) and set(gaps["cause"]) == {"host"}
    assert not (found["confirmed"] == 1).any()          # the gap explains, it does not page


def test_a_stall_of_the_gpus_stays_the_gpus(influx_store):
    svc, stored, found = _stall_run(influx_store, host_side=False)
    (inc,) = svc.incidents()
    assert inc.cls.value == "transient_stall" and not inc.host_side and "host-side" not in inc.title
    assert not len(found) or "launch_gap" not in set(found["kernel"])


def test_host_side_is_only_for_transient_stalls():
    with pytest.raises(ScenarioError, match="only for a transient_stall"):
        Scenario.from_dict({"topology": TOPOLOGY, "fault": [{"kind": "compute_slowdown", "ranks": "8-15",
                                                             "stage": "mlp", "factor": 2.0, "host_side": True}]})
