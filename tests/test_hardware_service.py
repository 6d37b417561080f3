"""Hardware evidence in the analyzer's cycle and on its command line: a small job whose one node
throttles hot (the simulator's ``telemetry = "thermal"``, written as ``gpu_health``) analyzed by the
real service, with a Prometheus that is down beside the store's own telemetry; ``analyze --once
--prometheus``, ``RANKSCOPE_PROMETHEUS_URL`` and ``[hardware]`` checked; ``rankscope demo`` printing
the evidence and the sharpened title."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.read.dcgm_prometheus import DcgmPrometheus
from analyzer.read.gpu_health_store import GpuHealthStore
from analyzer.service.hardware_evidence import HardwareEvidence
from analyzer.service.run_once import run_once
from rankscope.store import EmbeddedStore
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from tests.influx_server import free_port

SCENARIO = """\
description = "one node of a small job throttles hot from iteration 30"
[topology]
tp = 1
pp = 2
dp = 64
ep = 8
gpus_per_node = 8
[run]
job = "hot-node"
iterations = 60
seed = 7
[[fault]]
kind = "compute_slowdown"
ranks = "16-23"
stage = "mlp"
factor = 5.0
start = 30
telemetry = "thermal"
"""
RANKSCOPE = Path(sys.executable).with_name("rankscope")
HOST = "gpu-node-00002"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> tuple[Path, Path]:
    """(the scenario file, an embedded store holding its run, not yet analyzed)."""
    root = tmp_path_factory.mktemp("hot-node")
    toml = root / "hot-node.toml"
    toml.write_text(SCENARIO)
    store = EmbeddedStore(root / "sim.db")
    try:
        simulate(load_scenario(str(toml)), store, start_ms=1_750_000_000_000, progress=False)
    finally:
        store.close()
    return toml, root / "sim.db"


def fresh(simulated, tmp_path: Path) -> Path:
    db = tmp_path / "store.db"
    shutil.copy(simulated[1], db)
    return db


def rankscope(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    return subprocess.run([str(RANKSCOPE), *args], capture_output=True, text=True, timeout=300,
                          env={**base, **(env or {})}, cwd=cwd)


def test_a_down_prometheus_beside_the_store_never_fails_the_cycle(simulated, tmp_path, caplog):
    store = EmbeddedStore(fresh(simulated, tmp_path))
    try:
        down = DcgmPrometheus(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
        with caplog.at_level(logging.WARNING, logger="analyzer.service.hardware_evidence"):
            (inc,) = run_once(store, evidence=[HardwareEvidence([GpuHealthStore(store), down])])
    finally:
        store.close()
    hw = inc["hardware"]
    assert hw["verdict"] == "hardware_fault" and hw["source"] == "gpu_health" and hw["phrase"] == "GPU thermal throttling"
    assert hw["sources"] == {"gpu_health": "hardware_fault", "prometheus": "unavailable"}
    assert not hw["final"]   # Prometheus is asked again next cycle
    assert inc["title"].startswith(f"compute straggler: GPU thermal throttling, ranks 16-23 on {HOST}")
    lines = [r.getMessage() for r in caplog.records if "hardware evidence" in r.getMessage()]
    assert len(lines) == 1 and "cannot reach it" in lines[0]


def test_analyze_once_with_prometheus_and_a_secret_that_stays_out_of_the_output(simulated, tmp_path):
    db = fresh(simulated, tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    out = rankscope("analyze", "--once", "--json", "--store", str(db), "--prometheus", url,
                    env={"RANKSCOPE_PROMETHEUS_TOKEN": "s3cret-token"})
    assert out.returncode == 0, out.stderr[-2000:]
    (inc,) = json.loads(out.stdout)["incidents"]
    assert inc["hardware"]["sources"] == {"gpu_health": "hardware_fault", "prometheus": "unavailable"}
    assert "s3cret-token" not in out.stdout + out.stderr
    assert f"Prometheus {url}/api/v1/query_range: cannot reach it" in out.stderr


def test_bad_settings_are_refused_naming_what_is_wrong(simulated, tmp_path):
    db = fresh(simulated, tmp_path)
    out = rankscope("analyze", "--once", "--store", str(db), env={"RANKSCOPE_PROMETHEUS_URL": "prometheus:9090"})
    assert out.returncode != 0 and "prometheus URL 'prometheus:9090' is not http:// or https://" in out.stderr
    cfg = tmp_path / "rankscope.toml"
    cfg.write_text('[hardware]\nprometheus_ur = "http://p:9090"\nwindow_s = -5\n')
    out = rankscope("analyze", "--once", "--store", str(db), "--config", str(cfg))
    assert out.returncode != 0
    assert "[hardware] prometheus_ur: unknown key (did you mean prometheus_url?)" in out.stderr
    assert "[hardware] window_s = -5: not a finite number in [30, 86400]" in out.stderr


def test_the_demo_prints_the_hardware_evidence_and_the_sharpened_title(simulated, tmp_path):
    out = rankscope("demo", "--scenario", str(simulated[0]), "--report", str(tmp_path / "report"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"Hardware (hardware_fault): gpu_health: {HOST} GPUs 0-7: hw_thermal_slowdown in " in out.stdout
    assert f"Title: compute straggler: GPU thermal throttling, ranks 16-23 on {HOST} in mlp" in out.stdout
