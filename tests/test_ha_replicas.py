"""Two replicas of one shard (high availability) on the real InfluxDB: nothing doubled, nothing lost.

Two real ``rankscope analyze --every 1s --shard 1/2`` processes analyze the same database while
a simulated job is written into it, iteration by iteration. One is killed (SIGKILL) midway;
the other carries on. At the end the stored incidents, change points, L2 and health points
are those one undisturbed analysis of the same data stores (``run_once`` on a copy written
beside it): each incident id once, at one time, with the same content; no point doubled;
none missing. A second job, in the other shard, is left alone by both.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.config import AnalyzerConfig
from analyzer.service.run_once import run_once
from analyzer.service.shards import shard_of
from rankscope import schema
from rankscope.store import InfluxStore
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario

ITERATIONS = 48
#: Iterations are stamped with the wall clock as they are written, as collectors do, so the
#: replicas' wait for an incomplete iteration is short (the default, 15 s, would outlast the
#: test), yet longer than a write takes on a busy machine (a point stored later than that after
#: its stamp is late, and its iteration analyzed without it).
WAIT_S = 5.0
CULPRIT = 77
#: The iteration written when one replica is killed: rank 77 slow since 16, node 20 stalls in 26-30.
KILL_AT = 28
#: The replicas' shard, and a job of it and one of the other shard.
SHARD = (1, 2)
JOB = next(f"ha-{i}" for i in range(100) if shard_of(f"ha-{i}", 2) == 1)
OTHER = next(f"ha-other-{i}" for i in range(100) if shard_of(f"ha-other-{i}", 2) == 0)


def _scenario(job: str, ranks_dp: int, iterations: int, faults: list[dict]) -> Scenario:
    return Scenario.from_dict({
        "topology": {"tp": 1, "pp": 2, "dp": ranks_dp, "ep": 8, "gpus_per_node": 8},
        "run": {"job": job, "iterations": iterations, "seed": 11}, "fault": faults}, name=job)


class Log:
    """A process's stderr lines, waited for; the iterations its cycles analyzed, counted."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines, self.seen = proc, queue.Queue(), []
        self.analyzed = 0
        self.incidents: set[str] = set()   # the ids of the incidents its cycles wrote
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)

    def drain(self) -> None:
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            self._take(line)

    def _take(self, line: str) -> None:
        self.seen.append(line)
        m = re.search(rf"cycle: .*\b{re.escape(JOB)}: (\d+) it", line)
        if m:
            self.analyzed += int(m.group(1))
        m = re.search(r"incident (\S+) \[", line)
        if m:
            self.incidents.add(m.group(1))

    def wait_analyzed(self, n: int, timeout_s: float, incident: str | None = None) -> None:
        """Until its cycles analyzed ``n`` iterations (and wrote ``incident``)."""
        deadline = time.monotonic() + timeout_s
        while self.analyzed < n or incident is not None and incident not in self.incidents:
            try:
                self._take(self.lines.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    tail = "".join(x for x in self.seen[-30:] if "apscheduler" not in x)
                    raise AssertionError(f"analyzed {self.analyzed} of {n} iterations in {timeout_s:g} s; "
                                         f"saw: {tail}") from None


def _replica(url: str, bucket: str, config: Path, heartbeat: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    env["RANKSCOPE_INFLUX_API"] = "v1"
    return subprocess.Popen(
        [sys.executable, "-m", "rankscope.cli", "-v", "analyze", "--every", "1s", "--shard", "{}/{}".format(*SHARD),
         "--store", url, "--bucket", bucket, "--config", str(config), "--heartbeat", str(heartbeat), "--quiet"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)


@pytest.fixture
def stores(influx_url):
    made = [InfluxStore(influx_url, bucket=f"test_ha_{uuid.uuid4().hex[:10]}", api="v1") for _ in range(2)]
    try:
        yield made
    finally:
        for store in made:
            try:
                store.drop_database()
            finally:
                store.close()


def _read(store: InfluxStore, measurement: str, job: str = JOB) -> pd.DataFrame:
    df = store.read(measurement, job)
    tags = [t for t in schema.MEASUREMENTS[measurement].tags if t in df.columns]
    return df.sort_values(["time", *tags], kind="stable").reset_index(drop=True)


def _same_points(ha: pd.DataFrame, ref: pd.DataFrame, measurement: str) -> None:
    """The same points (tags and time), each once, with the same fields."""
    tags = [t for t in schema.MEASUREMENTS[measurement].tags if t in ref.columns]
    key = ["time", *tags]
    assert not ha.duplicated(key).any() and not ref.duplicated(key).any(), measurement
    assert len(ref), measurement
    merged = ref.merge(ha, on=key, how="left", suffixes=("", "_ha"), indicator=True)
    missing = merged[merged["_merge"] != "both"]
    assert not len(missing), f"{measurement}: {len(missing)} point(s) missing: {missing[key].head()}"
    for col in ref.columns:
        if col in key or f"{col}_ha" not in merged:
            continue
        a, b = merged[col], merged[f"{col}_ha"]
        if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b):
            assert np.allclose(a.astype(float), b.astype(float), rtol=1e-9, equal_nan=True), (measurement, col)
        else:
            bad = a.astype(str) != b.astype(str)
            assert not bad.any(), f"{measurement}.{col} differs: {a[bad].tolist()} != {b[bad].tolist()}"


def test_two_replicas_of_a_shard_one_killed_store_what_one_run_stores(influx_url, stores, tmp_path):
    ha, ref = stores
    config = tmp_path / "analyzer.toml"
    config.write_text(f"[analyzer]\niteration_wait_s = {WAIT_S}\n")
    sim = ClusterSimulator(_scenario(JOB, 128, ITERATIONS, [
        {"kind": "compute_slowdown", "ranks": CULPRIT, "factor": 3.0, "start": 16},
        {"kind": "host_stall", "node": 20, "stage": "dataloader", "factor": 40.0, "start": 26, "end": 31}]))
    other = ClusterSimulator(_scenario(OTHER, 8, 6, []))
    for _ in range(6):
        res = other.step()
        ha.write_stage_latency(other.frame(res, time_ms=int(time.time() * 1000) - 60_000 + res.iteration))
    beats = [tmp_path / f"heartbeat-{i}" for i in range(2)]
    replicas = [_replica(influx_url, ha.bucket, config, beat) for beat in beats]
    logs = [Log(p) for p in replicas]
    try:
        for i in range(ITERATIONS):
            res = sim.step()
            frame = sim.frame(res, time_ms=int(time.time() * 1000))
            ha.write_stage_latency(frame)
            ref.write_stage_latency(frame)
            if i == KILL_AT:   # the victim has analyzed and written, the incident among it
                logs[0].wait_analyzed(8, timeout_s=30, incident=f"cs-16-r{CULPRIT}")
                replicas[0].send_signal(signal.SIGKILL)
                killed_at, killed_s = logs[1].analyzed, time.time()
            time.sleep(0.1)
        logs[1].wait_analyzed(ITERATIONS, timeout_s=40)
    finally:
        for p in replicas:
            if p.poll() is None:
                p.terminate()
            p.wait(30)
    assert replicas[0].returncode == -signal.SIGKILL
    assert logs[1].analyzed == ITERATIONS > killed_at   # the survivor carried on, every iteration once
    assert f"cs-16-r{CULPRIT}" in logs[0].incidents <= logs[1].incidents   # both wrote it, by one id
    assert beats[1].stat().st_mtime > killed_s > beats[0].stat().st_mtime   # what a liveness probe sees
    incidents = run_once(ref, JOB, config=AnalyzerConfig(iteration_wait_s=WAIT_S))
    found = {(i["class"], i["status"], min(i["ranks"])) for i in incidents}
    assert found == {("compute_straggler", "open", CULPRIT), ("host_stall", "resolved", 160)}, found
    health = _read(ha, schema.JOB_HEALTH)   # first: a late point would explain any difference below
    assert health["late_points"].max() == 0 and health["completeness"].min() == 1.0, health.tail()
    stored = _read(ha, schema.INCIDENT)
    assert (stored.groupby("id")["time"].nunique() == 1).all()   # each incident id at one time
    for measurement in (schema.INCIDENT, schema.INCIDENT_HOST, schema.L1_CHANGEPOINT, schema.ROLLUP_JOB,
                        schema.ROLLUP_HOST):
        _same_points(_read(ha, measurement), _read(ref, measurement), measurement)
        assert len(_read(ha, measurement)) == len(_read(ref, measurement)), measurement   # nothing extra
    for measurement in (schema.L2_GROUP, schema.L2_RANK, schema.JOB_HEALTH):
        final = _read(ref, measurement)   # one run's points: at its last cycle's window end
        _same_points(_read(ha, measurement), final, measurement)
    for measurement in (schema.JOB_HEALTH, schema.INCIDENT, schema.L2_GROUP):
        assert not len(ha.read(measurement, OTHER)), f"{OTHER} is not in shard 1/2"
