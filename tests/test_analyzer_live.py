"""The analyzer beside live writers (issue 29): cycles that read while points are being stored.

InfluxDB shows a point's fields one by one while it stores it, so a read racing a write gets
rows with some fields yet missing, the ``iteration`` among them (6 cycles of a live run
failed on casting it). Reads overlap by a margin, so rows are read many times: only the rows
that came after their iteration was analyzed are late, each counted once (a job of 204,800
points counted 669,696).
"""

from __future__ import annotations

import threading
import time

import pandas as pd

from analyzer.service.analyzer_service import AnalyzerService
from rankscope import schema
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario, load_scenario
from simulator.simulate import simulate

START = 1_760_000_000_000
IT = schema.ITERATION_FIELD


def _sim(iterations: int) -> ClusterSimulator:
    return ClusterSimulator(Scenario.from_dict({
        "topology": {"tp": 1, "pp": 2, "dp": 16, "ep": 4, "gpus_per_node": 4},   # 32 ranks
        "run": {"job": "live", "iterations": iterations, "seed": 2}}, name="live"))


def test_a_point_read_before_its_iteration_field_is_stored_is_read_again_whole(influx_store):
    """Half of iteration 10's points are visible without their ``iteration`` (what a read racing
    their write returns): the cycle does not fail, it waits for them; once whole, the
    iteration is analyzed with every rank, nothing counted late or short."""
    sim, last = _sim(11), {"ms": 0}
    svc = AnalyzerService(influx_store, clock=lambda: last["ms"] / 1000 + 1)
    for _ in range(11):
        res = sim.step()
        last["ms"] = START + 30_000 * res.iteration
        frame = sim.frame(res, time_ms=last["ms"])
        if res.iteration < 10:
            influx_store.write_stage_latency(frame)
    influx_store.write_stage_latency(frame[frame["rank"] < 16])
    influx_store.write_stage_latency(frame[frame["rank"] >= 16].drop(columns=[IT]))
    assert influx_store.read(schema.STAGE_LATENCY, "live")[IT].isna().sum() == 16
    svc.cycle()                                       # the cast of the missing iteration failed here
    reader = svc.readers["live"]
    assert svc.analyzers["live"].last_iteration == 9
    assert reader.assembler.pending_iterations() == [10] and len(reader.assembler.pending()) == 16
    tags = [c for c in schema.RANK_TAGS if c in frame.columns]
    influx_store.write_stage_latency(frame.loc[frame["rank"] >= 16, ["time", *tags, IT]])   # the rest lands
    svc.cycle()
    assert svc.analyzers["live"].last_iteration == 10
    assert reader.counts.short_iterations == 0 and reader.counts.late_rows == 0
    assert (influx_store.read(schema.JOB_HEALTH, "live")["late_points"] == 0).all()


def test_rows_read_again_are_not_late_and_each_late_point_counts_once(influx_store):
    """Iterations 1 s apart: each cycle reads the last 120 s again, 120 iterations, far more
    than the assembler remembers. Rank 5's point of iteration 50 comes after iteration 50 was
    analyzed (stamped by its rank's clock, then), rank 6's of iteration 20 much later (stamped
    by a clock that had moved on): two late points, counted once each, whatever the re-reads."""
    sim, last = _sim(100), {"ms": 0}
    svc = AnalyzerService(influx_store, clock=lambda: last["ms"] / 1000 + 1)
    held: dict[int, pd.DataFrame] = {}
    for k in range(10):
        for _ in range(10):
            res = sim.step()
            last["ms"] = START + 1_000 * res.iteration
            frame = sim.frame(res, time_ms=last["ms"])
            late = (frame["rank"] == 5) & (res.iteration == 50) | (frame["rank"] == 6) & (res.iteration == 20)
            if late.any():
                held[res.iteration] = frame[late]
            influx_store.write_stage_latency(frame[~late])
        if k == 7:                                    # 50 went on, short, in the last cycle
            influx_store.write_stage_latency(held[50])
        if k == 8:
            influx_store.write_stage_latency(held[20].assign(time=last["ms"] - 10))
        svc.cycle()
    svc.cycle(final=True)
    reader = svc.readers["live"]
    assert svc.analyzers["live"].last_iteration == 99 and reader.counts.short_iterations == 2
    assert reader.counts.late_rows == 2
    health = influx_store.read(schema.JOB_HEALTH, "live")
    assert health["late_points"].iloc[-1] == 2 and health["late_points"].is_monotonic_increasing


def test_cycles_beside_a_live_simulation_never_fail(influx_store):
    """``simulate --live`` (2,048 ranks, each iteration's points written as one batch) while the
    analyzer cycles as fast as it can: no cycle fails, no point is late, every iteration is
    analyzed and the slowed GPU found."""
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=30)
    done, failures = threading.Event(), []

    def write() -> None:
        try:
            simulate(scenario, influx_store, live=True, speed=200.0, progress=False)
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    svc, cycles = AnalyzerService(influx_store), 0
    try:
        while not done.is_set():
            try:
                svc.cycle()
            except RuntimeError as exc:
                failures.append(str(exc))
            cycles += 1
            time.sleep(0.05)
    finally:
        writer.join()
    svc.cycle(final=True)
    assert failures == [] and cycles >= 2
    assert svc.analyzers[scenario.job].last_iteration == 29
    assert svc.readers[scenario.job].counts.late_rows == 0
    assert (influx_store.read(schema.JOB_HEALTH, scenario.job)["late_points"] == 0).all()
    (inc,) = svc.incidents()
    assert inc.ranks == [1379]
