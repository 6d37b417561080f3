"""Acceptance: the analyzer reaches the IL-0477 verdict on its own, from data stored in the real InfluxDB."""

import json
import os
import subprocess
import sys

import pytest

from analyzer.config import AnalyzerConfig
from rankscope import schema
from rankscope.incident import load_incidents
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from tests.il0477_store import shared_incident

START = 1_760_000_000_000


@pytest.fixture(scope="session")
def il0477(influx_url, request):
    """IL-0477 (40 iterations, 12,960 ranks) simulated into the real InfluxDB and analyzed once.

    The same database the dashboard and report tests query (filled once per session).
    """
    data = shared_incident(influx_url, request.addfinalizer)
    assert data.source == "simulator+analyzer"
    return data.store, data.job


def test_l1_step_alert_within_two_iterations(il0477):
    store, job = il0477
    cps = store.read(schema.L1_CHANGEPOINT, job)
    steps = cps[(cps["kind"] == "step") & (cps["scope"] == "job")]
    assert len(steps) == 1
    step = steps.iloc[0]
    assert step["iteration"] == 30
    assert step["before_ms"] == pytest.approx(30_000, rel=0.1)
    assert step["after_ms"] > 90_000
    # confirmation latency: the detector confirms after l1_persist iterations
    assert AnalyzerConfig().l1_persist <= 2


def test_one_compute_straggler_incident_with_the_incident_numbers(il0477):
    store, job = il0477
    incidents = [i.to_json() for i in load_incidents(store, job)]
    assert len(incidents) == 1, [i["title"] for i in incidents]
    inc = incidents[0]
    assert inc["class"] == "compute_straggler"
    assert inc["ranks"] == list(range(10352, 10360))
    assert inc["nodes"] == [1294]
    assert inc["stage"] == "mlp"
    assert inc["ratio"] == pytest.approx(5.7, abs=0.6)
    assert inc["group"] == {"type": "ep", "ranks": list(range(10336, 10368))}
    assert inc["onset_iteration"] == 30
    assert inc["evidence"]["arrived_last"] is True
    assert inc["evidence"]["group"]["cv"] > 0.8
    (event,) = inc["events"]
    assert (event["name"], event["node"], event["verdict"]) == ("server port down", 1294, "contradicted")
    # and it is what the database holds, once
    stored = store.read(schema.INCIDENT, job)
    assert stored["id"].tolist() == [inc["id"]]
    assert stored["ranks"].iloc[0] == "10352-10359"


def test_l2_points_show_the_ep_group(il0477):
    store, job = il0477
    g = store.read(schema.L2_GROUP, job, where={"group_type": "ep", "stage": "mlp"})
    ep_id = 7 * 45 + 8          # pp=7, dp 256-287
    row = g[g["group_id"] == ep_id].iloc[-1]
    assert row["cv"] > 0.8 and row["anomalous"] == 1
    others = g[(g["group_id"] != ep_id) & (g["time"] == row["time"])]
    assert (others["cv"] < 0.3).all()
    r = store.read(schema.L2_RANK, job, where={"stage": "mlp"})
    assert set(range(10352, 10360)) <= set(r["rank"])
    assert (r[r["rank"].between(10352, 10359)]["ratio"] > 4).all()


def test_cli_once_json_reports_the_same(influx_store):
    # the command line on a smaller job (the same code path; the full-scale run is above)
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=30)
    simulate(scenario, influx_store, start_ms=START, progress=False)
    env = {**os.environ, "RANKSCOPE_INFLUX_API": "v1"}
    out = subprocess.run(
        [sys.executable, "-m", "rankscope.cli", "analyze", "--once", "--json", "--store", influx_store.url,
         "--bucket", influx_store.bucket, "--job", scenario.job],
        capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (inc,) = data["incidents"]
    assert inc["class"] == "compute_straggler" and inc["ranks"] == [1379]
    assert set(inc) >= {"id", "job", "class", "ranks", "nodes", "stage", "ratio", "group", "onset_iteration", "events"}
    assert inc["events"] == []   # the scenario raises no event
    help_text = subprocess.run([sys.executable, "-m", "rankscope.cli", "analyze", "--help"],
                               capture_output=True, text=True, timeout=60).stdout
    assert "--every" in help_text and "--once" in help_text
