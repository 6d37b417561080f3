"""Recovery measured on simulated jobs through the real InfluxDB: a node swap, a drain followed
by the job's restart on a new machine, a fault that ends by itself, a job that ends first; each
incident's timeline, time to detect, time to recover and ``recovery`` as the analyzer stores them.

The jobs are simulated iteration by iteration (:class:`ClusterSimulator`), so a test can stop
half-way, run the analyzer's cycle, act as the actor would (a ``done`` drain in the store) and
go on: what the service sees of a live job.
"""

from __future__ import annotations

import numpy as np

import analyzer.service.analyzer_service as service
from actions.records import ActionRecord, write_records
from analyzer.config import AnalyzerConfig
from analyzer.service.analyzer_service import AnalyzerService
from rankscope import schema
from rankscope.incident import Incident
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario

T0 = 1_770_000_000_000
TOPO = {"tp": 1, "pp": 2, "dp": 8, "ep": 4, "gpus_per_node": 4}   # 16 ranks on gpu-node-00000..3
WARM = AnalyzerConfig().restart_warmup   # a restart's first iterations: not read (caches, compilation)
FAULT = {"kind": "compute_slowdown", "ranks": "5", "factor": 2.5, "start": 20}


def _sim(job: str, n: int, faults: list[dict], swaps: list[dict] = (), start_ms: int = T0) -> ClusterSimulator:
    sc = Scenario.from_dict({"topology": TOPO, "run": {"job": job, "iterations": n, "seed": 7},
                             "fault": faults, "swap": list(swaps)})
    return ClusterSimulator(sc, start_ms=start_ms)


def _write(store, sim: ClusterSimulator, upto: int) -> list[int]:
    """Iterations up to ``upto`` (excluded) into the store; the time (ms) of each."""
    times = []
    while sim.iteration < upto:
        frame = sim.frame(sim.step())
        store.write_stage_latency(frame)
        times.append(int(frame["time"].median()))
    return times


def _incident(store, job: str) -> Incident:
    rows = store.read(schema.INCIDENT, job)
    rows = rows.sort_values(["time", "updated_ms"]).drop_duplicates("id", keep="last")
    (row,) = [r for r in rows.to_dict("records") if "5" in str(r["ranks"]).split(",")]
    return Incident.from_row(row)


def _clock_at(ms: int):
    return lambda: ms / 1000.0


def _assert_timeline(inc: Incident, times: list[int], onset_it: int) -> None:
    tl = inc.timeline
    assert set(tl) == {"onset", "detected", "confirmed", "action", "recovered"}
    assert abs(tl["onset"] - times[onset_it]) <= 2_000                  # the onset iteration's time
    assert tl["onset"] < tl["detected"] <= tl["confirmed"]
    assert inc.time_to_detect_s == (tl["detected"] - tl["onset"]) / 1000.0 > 0


def test_a_node_swap_is_the_recovery_and_its_time_is_the_first_iteration_on_the_new_machine(influx_store):
    sim = _sim("swapped", 70, [FAULT], [{"node": 1, "at": 45, "host": "spare-1"}])
    times = _write(influx_store, sim, 70)
    AnalyzerService(influx_store).cycle(final=True)
    inc = _incident(influx_store, "swapped")
    _assert_timeline(inc, times, 20)
    assert inc.timeline["action"] is None
    assert inc.recovery["how"] == "node_swap" and inc.recovery["within_what_if"] is True
    # the first iteration on the spare the analyzer reads (a restart's warm-up is skipped), not
    # the moment the analyzer became sure (resolve_after iterations later)
    assert abs(inc.timeline["recovered"] - times[45 + WARM]) < 2_000
    assert np.isclose(inc.time_to_recover_s, (inc.timeline["recovered"] - inc.timeline["onset"]) / 1000.0)
    healthy = np.median(np.diff(times[:20])) / 1000.0
    assert abs(inc.recovery["iteration_s_after"] - healthy) / healthy < 0.1
    assert inc.awaiting_recovery_s == -1.0


def test_a_drain_then_the_restart_on_a_new_machine_is_the_drains_recovery(influx_store):
    job = "drained"
    sim = _sim(job, 80, [FAULT], [{"node": 1, "at": 55, "host": "spare-1"}])
    times = _write(influx_store, sim, 45)
    svc = AnalyzerService(influx_store, clock=_clock_at(times[-1] + 1_000))
    svc.cycle()
    inc = _incident(influx_store, job)
    assert inc.is_open and inc.timeline["confirmed"] is not None and inc.timeline["recovered"] is None
    drained_at = times[40]
    write_records(influx_store, [ActionRecord(job, inc.id, "gpu-node-00001", "drain", "done", "drained", drained_at,
                                              host="gpu-node-00001", mode="enforce")])
    now = times[-1] + 600_000                                      # ten minutes on, no iteration since
    svc.clock = _clock_at(now)
    svc.cycle()
    waiting = _incident(influx_store, job)
    assert waiting.timeline["action"] == drained_at
    assert waiting.awaiting_recovery_s == (now - drained_at) / 1000.0   # the wall clock: the job may hang
    rest = _write(influx_store, sim, 80)
    svc.clock = _clock_at(rest[-1] + 1_000)
    svc.cycle(final=True)
    inc = _incident(influx_store, job)
    _assert_timeline(inc, times + rest, 20)
    assert inc.timeline["action"] == drained_at < inc.timeline["recovered"]
    assert inc.recovery["how"] == "drain" and inc.recovery["within_what_if"] is True
    assert abs(inc.timeline["recovered"] - rest[55 + WARM - 45]) < 2_000
    assert inc.awaiting_recovery_s == -1.0


def test_a_fault_that_ends_by_itself_recovers_as_fault_ended(influx_store):
    sim = _sim("transient", 70, [{**FAULT, "end": 45}])
    times = _write(influx_store, sim, 70)
    AnalyzerService(influx_store).cycle(final=True)
    inc = _incident(influx_store, "transient")
    _assert_timeline(inc, times, 20)
    assert inc.recovery["how"] == "fault_ended" and inc.recovery["within_what_if"] is True
    assert abs(inc.timeline["recovered"] - times[45]) < 2_000
    assert 0 < inc.time_to_detect_s < inc.time_to_recover_s


def test_a_job_that_ends_slow_never_recovered(influx_store, monkeypatch):
    sim = _sim("ended", 50, [FAULT])
    times = _write(influx_store, sim, 50)
    svc = AnalyzerService(influx_store)
    svc.cycle()
    assert _incident(influx_store, "ended").is_open
    later = times[-1] + 3_600_000                                   # an hour on, it wrote nothing; another did
    _write(influx_store, _sim("other", 5, [], start_ms=later - 300_000), 5)
    monkeypatch.setattr(service.time, "time", _clock_at(later))
    svc.clock = _clock_at(later)
    svc.cycle()
    inc = _incident(influx_store, "ended")
    assert not inc.is_open
    assert inc.recovery == {"how": "job_ended", "iteration_s_after": None, "within_what_if": False}
    assert inc.timeline["recovered"] is None and np.isnan(inc.time_to_recover_s)
    assert inc.time_to_detect_s > 0
