"""Acceptance: the analyzer reaches the IL-0477 verdict on its own, from data stored in the real InfluxDB."""

import json
import os
import subprocess
import sys

import pytest

from analyzer.config import AnalyzerConfig
from rankscope import schema
from rankscope.incident import load_incidents


@pytest.fixture
def il0477(il0477_incident):
    """IL-0477 (40 iterations, 12,960 ranks) simulated into the real InfluxDB and analyzed once.

    The same database the simulator, dashboard and report tests read (``il0477_incident``,
    filled once per session).
    """
    assert il0477_incident.source == "simulator+analyzer"
    return il0477_incident.store, il0477_incident.job


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


def test_cli_once_json_reports_the_same(compute_slowdown_influx):
    # the command line on a smaller job (the same code path; the full-scale run is above)
    influx_store, scenario, _ = compute_slowdown_influx
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


def test_a_database_that_cannot_be_built_fails_loudly_once_for_every_test(monkeypatch):
    """No fallback: when the simulator or the analyzer fails, every test that asks for the
    IL-0477 database fails with that error, from one attempt."""
    from tests import il0477_store

    calls = []

    def broken(url):
        calls.append(url)
        raise ImportError("simulator.simulate is broken")

    monkeypatch.setattr(il0477_store, "fill", broken)
    monkeypatch.setattr(il0477_store, "_FILLED", {})
    monkeypatch.setattr(il0477_store, "_FAILED", {})
    for _ in range(2):
        with pytest.raises((ImportError, RuntimeError), match="simulator.simulate is broken"):
            il0477_store.shared_incident("http://nowhere:1", lambda drop: None)
    assert calls == ["http://nowhere:1"]


def test_the_incident_names_its_kernels_from_the_kernel_windows(il0477):
    """IL-0477's data carries kernel windows (every 5 iterations): L3 confirms the culprits' mlp
    kernel (windows 34 and 39) and the incident names it beside L2's stage, in its text too."""
    store, job = il0477
    (inc,) = load_incidents(store, job)
    kernels = inc.evidence["kernels"]
    assert kernels[0]["kernel"] == "mlp_gemm" and kernels[0]["cause"] == "own"
    assert kernels[0]["ranks"] == "10352-10359" and kernels[0]["ratio"] > 4
    assert "Kernels (L3): mlp_gemm" in inc.text
    found = store.read(schema.L3_KERNEL, job)
    confirmed = found[found["confirmed"] == 1]
    assert set(confirmed["rank"]) == set(range(10352, 10360)) and set(confirmed["host"]) == {"gpu-node-01294"}


def test_the_incident_carries_its_gpus_thermal_evidence(il0477):
    """The demo's path: the simulator's gpu_health for node 1294 (thermal), read back by the analyzer's
    hardware evidence, compared with the job's other GPUs; the verdict sharpens the stored title."""
    store, job = il0477
    (inc,) = [i.to_json() for i in load_incidents(store, job)]
    hw = inc["hardware"]
    assert hw["verdict"] == "hardware_fault" and hw["source"] == "gpu_health" and hw["final"]
    assert hw["phrase"] == "GPU thermal throttling" and hw["peer_gpus"] >= 80
    assert [(g["host"], g["gpu"]) for g in inc["gpus"]] == [("gpu-node-01294", k) for k in range(8)]
    assert [g["ranks"] for g in hw["gpus"]] == [[r] for r in range(10352, 10360)]
    found = {s["signal"] for g in hw["gpus"] for s in g["signals"]}
    assert {"hw_thermal_slowdown", "temperature_c", "sm_clock_mhz"} <= found and "sw_power_cap" not in found
    assert inc["title"].startswith("compute straggler: GPU thermal throttling, ranks 10352-10359 on gpu-node-01294")
    assert hw["summary"].startswith("gpu_health: gpu-node-01294 GPUs 0-7: hw_thermal_slowdown in ")
