"""The analyzer on every fault-kind built-in, through the real InfluxDB: right class, exact culprits."""

import numpy as np
import pytest

from analyzer.service.analyzer_service import run_once
from evaluation.accuracy import EXPECTED_CLASS
from simulator.scenario import load_scenario
from simulator.simulate import simulate

START = 1_750_000_000_000


@pytest.mark.parametrize("name", ["compute-slowdown", "link-degradation", "stage-imbalance",
                                  "transient-stall", "host-stall", "silent-rank"])
def test_builtin_fault_is_diagnosed_exactly(influx_store, name):
    scenario = load_scenario(name)
    truth = simulate(scenario, influx_store, start_ms=START, progress=False)
    incidents = run_once(influx_store, job=scenario.job)
    assert len(truth.faults) == 1
    fault = truth.faults[0]
    assert [(i["class"], i["ranks"]) for i in incidents] == [(EXPECTED_CLASS[fault["kind"]], sorted(fault["ranks"]))]
    inc = incidents[0]
    assert inc["nodes"] == sorted(fault["nodes"])
    # detected at (or within a few iterations of) the injected onset
    assert abs(inc["onset_iteration"] - fault["start"]) <= 1
    if fault.get("end") is not None and fault["kind"] != "silent_rank":
        assert inc["status"] == "resolved"
        assert abs(inc["resolved_iteration"] - fault["end"]) <= 1
    if fault["kind"] in ("compute_slowdown", "host_stall", "transient_stall") and fault.get("stage"):
        assert inc["stage"] == fault["stage"]
    # the event the scenario raises on the culprit node is judged
    for ev in truth.events:
        judged = [e for e in inc["events"] if e["name"] == ev["name"]]
        assert judged, ev


def test_written_points_are_idempotent(influx_store):
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=30)
    simulate(scenario, influx_store, start_ms=START, progress=False)
    first = run_once(influx_store, job=scenario.job)
    n1 = {m: len(influx_store.read(m, scenario.job)) for m in ("incident", "l1_changepoint", "l2_group")}
    # a second service over the same data: adopts the stored incidents, rewrites the same points
    second = run_once(influx_store, job=scenario.job)
    n2 = {m: len(influx_store.read(m, scenario.job)) for m in ("incident", "l1_changepoint", "l2_group")}
    assert [i["id"] for i in first] == [i["id"] for i in second]
    assert n1["incident"] == n2["incident"] == 1
    assert n2["l1_changepoint"] == n1["l1_changepoint"] >= 1
    assert np.all(np.array(list(n1.values())) > 0)
