"""The analyzer's outputs through outages (issue 29, item 3): InfluxDB killed (SIGKILL) and
restarted, or hung (SIGSTOP: requests time out), in the middle of a cycle's reads and of its
writes; the analyzer itself killed mid-cycle and restarted. Every run is compared with an
undisturbed run of the same cycles over the same points: the stored change points, rollups,
windows, hours, L2 points, job health and incidents are the same, nothing lost or doubled.

The job: 512 ranks, 100 iterations 30 s apart (50 minutes over two hours), three faults (a
GPU slow from 20 to 60, a host's data loader stalled at 45-52, a link degraded from 70: two
L1 steps, three incidents). Ten live cycles of ten new iterations each (chunks of five), the
clock 5 s past the newest, then a final one; a failed cycle is run again, as the scheduler
would, before new points come. Each run takes about ten seconds.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import pandas as pd
import pytest

from analyzer.service.analyzer_service import AnalyzerService
from rankscope import schema
from rankscope.store import InfluxStore
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario
from tests.influx_server import InfluxServer

pytestmark = pytest.mark.faults

JOB = "storm"
HOUR = schema.ROLLUP_HOUR_MS
START = (1_780_000_000_000 // HOUR + 1) * HOUR - 20 * 60_000   # 20 minutes before an hour
BATCH, CYCLES = 10, 10
OUTPUTS = (schema.L1_CHANGEPOINT, schema.ROLLUP_HOST, schema.ROLLUP_JOB, schema.ROLLUP_HOST_WINDOW,
           schema.ROLLUP_HOST_HOUR, schema.L2_GROUP, schema.L2_RANK, schema.JOB_HEALTH, schema.INCIDENT,
           schema.INCIDENT_HOST)
ROLLUPS = (schema.ROLLUP_HOST, schema.ROLLUP_JOB, schema.ROLLUP_HOST_WINDOW, schema.ROLLUP_HOST_HOUR)
SCENARIO = Scenario.from_dict({
    "topology": {"tp": 1, "pp": 4, "dp": 128, "ep": 16, "gpus_per_node": 8},
    "run": {"job": JOB, "iterations": BATCH * CYCLES, "seed": 7},
    "fault": [{"kind": "compute_slowdown", "ranks": 37, "factor": 2.5, "start": 20, "end": 60},
              {"kind": "host_stall", "node": 21, "stage": "dataloader", "factor": 40.0, "start": 45, "end": 52},
              {"kind": "link_degradation", "node": 9, "factor": 8.0, "start": 70}]}, name=JOB)


class Outage:
    """What befalls the private influxd, and its end."""

    def __init__(self, server: InfluxServer):
        self.server = server
        self.events: list[str] = []

    def kill(self) -> None:
        """SIGKILL: it dies at once, with what it had not yet stored."""
        self.server.proc.kill()
        self.server.proc.wait()
        self.events.append("killed")

    def stop(self) -> None:
        """SIGSTOP: it neither answers nor refuses; requests time out."""
        os.kill(self.server.proc.pid, signal.SIGSTOP)
        self.events.append("stopped")

    def end(self) -> None:
        """Restart a killed influxd on its own data, or let a stopped one go on."""
        if self.server.proc is not None and self.server.proc.poll() is not None:
            self.server.proc = None
            self.server.log.close()
            self.server.start()
        elif self.server.proc is not None:
            os.kill(self.server.proc.pid, signal.SIGCONT)


class Died(BaseException):
    """The analyzer's process ends here (nothing of it runs on: not an Exception it could catch)."""


class Faulty:
    """The store, with something befalling it at chosen calls: ``(method, measurement or None,
    n)`` -> what happens just before the n-th such call goes through."""

    def __init__(self, store: InfluxStore, faults: dict[tuple[str, str | None, int], Callable[[], None]]):
        self.store, self.faults, self.calls = store, dict(faults), Counter()

    def __getattr__(self, name: str):
        attr = getattr(self.store, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args, **kwargs):
            key = (name, args[0] if args and isinstance(args[0], str) and args[0] != JOB else None)
            self.calls[key] += 1
            act = self.faults.pop((*key, self.calls[key]), None)
            if act is not None:
                act()
            return attr(*args, **kwargs)
        return call


@pytest.fixture(scope="module")
def frames() -> list[pd.DataFrame]:
    sim = ClusterSimulator(SCENARIO)
    out = []
    for _ in range(BATCH * CYCLES):
        res = sim.step()
        out.append(sim.frame(res, time_ms=START + 30_000 * res.iteration))
    return out


def _store(server: InfluxServer, timeout_s: float = 10.0) -> InfluxStore:
    """A database of its own; no retries: a fault fails the cycle it hits."""
    return InfluxStore(server.url, f"faults_{uuid.uuid4().hex[:8]}", api="v1", retries=0, timeout_s=timeout_s)


def run(server: InfluxServer, frames: list[pd.DataFrame], store: InfluxStore, faults=None,
        end: Callable[[], None] | None = None, restart: bool = False) -> int:
    """The cycles over ``frames``, written ten at a time; a cycle that failed runs again (after
    ``end`` of the outage), on a new analyzer when ``restart`` (the old one died). Returns how
    many cycles failed (at least one per fault; a slow answer on a loaded machine may add one)."""
    seen = Faulty(store, faults or {})
    last = {"ms": 0}

    def analyzer() -> AnalyzerService:
        return AnalyzerService(seen, jobs=[JOB], chunk_iterations=5, clock=lambda: last["ms"] / 1000 + 5)

    svc, failed = analyzer(), 0
    for k in range(CYCLES + 1):
        for frame in frames[BATCH * k:BATCH * (k + 1)]:
            store.write_stage_latency(frame)
        last["ms"] = int(frames[min(BATCH * (k + 1), len(frames)) - 1]["time"].max()) + (600_000 if k == CYCLES else 0)
        for _attempt in range(8):
            try:
                svc.cycle(final=k == CYCLES)
                break
            except (RuntimeError, Died):
                failed += 1
                if end is not None:
                    end()
                if restart:
                    svc = analyzer()
        else:
            raise AssertionError(f"cycle {k} kept failing")
    assert not seen.faults, f"faults never reached: {sorted(seen.faults)}"
    return failed


def stored(store: InfluxStore, measurement: str) -> pd.DataFrame:
    df = store.read(measurement, JOB)
    keys = ["time", *[t for t in schema.MEASUREMENTS[measurement].tags if t in df.columns]]
    return df.sort_values(keys, kind="stable").reset_index(drop=True)[sorted(df.columns)]


def assert_same(got: InfluxStore, want: InfluxStore, measurements=OUTPUTS) -> None:
    for m in measurements:
        a, b = stored(got, m), stored(want, m)
        assert len(a) == len(b), f"{m}: {len(a)} points stored, {len(b)} undisturbed"
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-9, obj=m)


@pytest.fixture(scope="module")
def undisturbed(influx_server, frames) -> Iterator[InfluxStore]:
    store = _store(influx_server)
    try:
        assert run(influx_server, frames, store) == 0
        cps = store.read(schema.L1_CHANGEPOINT, JOB)
        assert sorted(cps["iteration"]) == [20, 70]
        assert sorted(store.read(schema.INCIDENT, JOB)["id"].unique()) == ["cs-20-r37", "hs-45-r168", "ld-70-r72"]
        assert store.read(schema.ROLLUP_HOST_WINDOW, JOB)["time"].nunique() == 10
        assert store.read(schema.ROLLUP_HOST_HOUR, JOB)["time"].nunique() == 2
        assert (store.read(schema.JOB_HEALTH, JOB)["late_points"] == 0).all()
        yield store
    finally:
        store.drop_database()
        store.close()


def test_influxdb_killed_and_restarted_mid_cycle_loses_nothing(influx_server, frames, undisturbed):
    """SIGKILL five times: in a cycle's second read (a chunk was analyzed), in its read of the
    events (a chunk was handed on, not yet analyzed), at its change point, at its 5-minute
    windows, at its l2_group point (all else stored). Then restarted."""
    out, store = Outage(influx_server), _store(influx_server)
    try:
        faults = {("read_stage_latency", None, 6): out.kill,
                  ("read_events", None, 4): out.kill,
                  ("write_measurement", schema.L1_CHANGEPOINT, 1): out.kill,
                  ("write_measurement", schema.ROLLUP_HOST_WINDOW, 4): out.kill,
                  ("write_measurement", schema.L2_GROUP, 7): out.kill}
        assert run(influx_server, frames, store, faults, end=out.end) >= 5
        assert out.events == ["killed"] * 5
        assert_same(store, undisturbed)
    finally:
        out.end()
        store.drop_database()
        store.close()


def test_influxdb_hung_mid_cycle_loses_nothing(influx_server, frames, undisturbed):
    """SIGSTOP three times (requests time out; a write may be applied after SIGCONT): in a
    cycle's read, at its change point, at its hourly rollup."""
    out, store = Outage(influx_server), _store(influx_server, timeout_s=2)
    try:
        faults = {("read_stage_latency", None, 9): out.stop,
                  ("write_measurement", schema.L1_CHANGEPOINT, 2): out.stop,
                  ("write_measurement", schema.ROLLUP_HOST_HOUR, 3): out.stop}
        assert run(influx_server, frames, store, faults, end=out.end) >= 3
        assert out.events == ["stopped"] * 3
        assert_same(store, undisturbed)
    finally:
        out.end()
        store.drop_database()
        store.close()


def _die() -> None:
    raise Died


def test_analyzer_killed_mid_cycle_and_restarted_loses_and_doubles_nothing(influx_server, frames, undisturbed):
    """The analyzer dies four times: in a cycle's second read, as its successor reads the stored
    windows, after its rollups and windows were stored but before its analysis was, and
    between two of its rollup writes. A new one
    starts from the database each time (its history replayed, the stored windows read once):
    the rollups, windows and hours are those of the undisturbed run, the incidents the same
    three, each stored under one id, with the same status and cost (within 1%: the cost of
    the replayed iterations is not counted again, but the warm-up differs), and the change
    point stored before the deaths is still stored, once. (A restarted analyzer's L1 detectors
    know only the replayed iterations: a step that began before them is not marked recovered,
    and its recovery shows as a step of its own: docs/reliability.md.)"""
    store = _store(influx_server)
    try:
        faults = {("read_stage_latency", None, 6): _die,
                  ("read", schema.ROLLUP_HOST_WINDOW, 1): _die,
                  ("write_measurement", schema.L1_CHANGEPOINT, 1): _die,
                  ("write_measurement", schema.ROLLUP_JOB, 7): _die}
        assert run(influx_server, frames, store, faults, restart=True) >= 4
        assert_same(store, undisturbed, ROLLUPS)
        got, want = (stored(s, schema.INCIDENT).drop_duplicates("id", keep="last") for s in (store, undisturbed))
        assert got["id"].tolist() == want["id"].tolist()
        assert got["status"].tolist() == want["status"].tolist()
        assert got["gpu_hours_lost"].to_numpy() == pytest.approx(want["gpu_hours_lost"].to_numpy(), rel=0.01)
        assert len(stored(store, schema.INCIDENT_HOST)) == len(stored(undisturbed, schema.INCIDENT_HOST))
        assert stored(store, schema.L1_CHANGEPOINT)["iteration"].tolist().count(20) == 1
    finally:
        store.drop_database()
        store.close()
