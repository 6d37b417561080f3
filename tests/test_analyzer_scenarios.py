"""The analyzer on every fault-kind built-in, through the real InfluxDB: right class, exact culprits.

compute-slowdown is the session's ``compute_slowdown_influx`` (written once, also analyzed by
the idempotency test below and by ``analyze --once --json`` in test_analyzer_il0477.py).
"""

import numpy as np
import pytest

from analyzer.service.run_once import run_once
from evaluation.accuracy import EXPECTED_CLASS
from simulator.scenario import load_scenario
from simulator.simulate import simulate

START = 1_750_000_000_000


@pytest.fixture
def builtin_in_influx(request, name, compute_slowdown_influx):
    """(store, scenario, truth) of the built-in ``name`` in the real InfluxDB."""
    if name == "compute-slowdown":
        return compute_slowdown_influx
    store = request.getfixturevalue("influx_store")
    scenario = load_scenario(name)
    return store, scenario, simulate(scenario, store, start_ms=START, progress=False)


@pytest.mark.parametrize("name", ["compute-slowdown", "link-degradation", "stage-imbalance",
                                  "transient-stall", "host-stall", "silent-rank"])
def test_builtin_fault_is_diagnosed_exactly(builtin_in_influx, name):
    influx_store, scenario, truth = builtin_in_influx
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


def test_written_points_are_idempotent(compute_slowdown_influx):
    influx_store, scenario, _ = compute_slowdown_influx
    first = run_once(influx_store, job=scenario.job)
    n1 = {m: len(influx_store.read(m, scenario.job)) for m in ("incident", "l1_changepoint", "l2_group")}
    # a second service over the same data: adopts the stored incidents, rewrites the same points
    second = run_once(influx_store, job=scenario.job)
    n2 = {m: len(influx_store.read(m, scenario.job)) for m in ("incident", "l1_changepoint", "l2_group")}
    assert [i["id"] for i in first] == [i["id"] for i in second]
    assert n1["incident"] == n2["incident"] == 1
    assert n2["l1_changepoint"] == n1["l1_changepoint"] >= 1
    assert np.all(np.array(list(n1.values())) > 0)
