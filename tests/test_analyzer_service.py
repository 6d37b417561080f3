"""The analyzer as a service: restarts, incomplete iterations, failing cycles, the scheduler."""

import logging
import threading

from analyzer.cli import build_scheduler, parse_interval, safe_cycle
from analyzer.cycle import AnalyzerService
from rankscope import schema
from rankscope.store import InfluxStore
from simulator.cluster import ClusterSimulator
from simulator.scenario import load_scenario

START = 1_770_000_000_000


def _write(store, sim, n):
    for _ in range(n):
        res = sim.step()
        store.write_stage_latency(sim.frame(res, time_ms=START + 30_000 * res.iteration))


def test_restart_in_the_middle_of_an_incident_does_not_duplicate_it(influx_store):
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=45)
    sim = ClusterSimulator(scenario)
    _write(influx_store, sim, 28)                     # fault from 20: incident open by 25
    first = AnalyzerService(influx_store)
    first.cycle()
    (inc,) = first.incidents()
    assert inc.status == "open" and inc.ranks == [1379]
    del first                                         # the analyzer dies
    _write(influx_store, sim, 12)
    second = AnalyzerService(influx_store)            # restarts from the database
    second.cycle()
    stored = influx_store.read(schema.INCIDENT, scenario.job)
    assert stored["id"].tolist() == [inc.id]
    assert [i.id for i in second.incidents()] == [inc.id]
    assert second.incidents()[0].status == "open"
    # it goes on from where the data is, not from the start
    assert second.analyzers[scenario.job].last_iteration == 39


def test_incomplete_last_iteration_is_held_back(influx_store):
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=20)
    sim = ClusterSimulator(scenario)
    _write(influx_store, sim, 12)
    res = sim.step()
    half = sim.frame(res, time_ms=START + 30_000 * res.iteration).iloc[:1000]   # a writer mid-iteration
    influx_store.write_stage_latency(half)
    svc = AnalyzerService(influx_store)
    svc.cycle()
    ja = svc.analyzers[scenario.job]
    assert ja.last_iteration == 11                    # iteration 12 waits for its other ranks
    assert svc.incidents() == []                      # and 1,048 missing ranks are not "silent"


def test_failed_cycle_is_logged_and_the_next_one_runs(caplog, influx_store):
    dead = InfluxStore("http://127.0.0.1:9", "x", api="v1", retries=0, timeout_s=1)
    svc = AnalyzerService(dead)
    caplog.set_level(logging.ERROR, logger="rankscope.analyze")
    from apscheduler.events import EVENT_JOB_EXECUTED

    runs: list[bool] = []
    two = threading.Event()

    def ran(event) -> None:
        runs.append(event.retval)
        if len(runs) >= 2:
            two.set()

    sched = build_scheduler(svc, 0.2, blocking=False)
    sched.add_listener(ran, EVENT_JOB_EXECUTED)
    sched.start()
    assert two.wait(120), "the scheduler did not run a second cycle after a failed one"
    sched.shutdown(wait=True)
    assert runs[:2] == [False, False]                 # both failed, and the second still ran
    errors = [r for r in caplog.records if "analyzer cycle failed" in r.getMessage()]
    assert len(errors) >= 2                           # it kept going
    assert "unreachable" in errors[0].getMessage()
    job = sched.get_jobs()
    assert job == []                                  # shut down cleanly
    # and a cycle against a working store succeeds through the same wrapper
    assert safe_cycle(AnalyzerService(influx_store)) is True


def test_interval_parsing():
    assert parse_interval("30s") == 30 and parse_interval("2m") == 120 and parse_interval("1.5") == 1.5
    import argparse

    import pytest
    with pytest.raises(argparse.ArgumentTypeError, match="expected e.g. 30s"):
        parse_interval("soon")
