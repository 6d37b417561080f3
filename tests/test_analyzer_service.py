"""The analyzer as a service: restarts, incomplete iterations, failing cycles, the scheduler."""

import logging
import threading
import uuid
from collections import Counter

import pytest

from analyzer.service.analyze_cli import parse_interval
from analyzer.service.analyzer_service import AnalyzerService
from analyzer.service.schedule import build_scheduler, safe_cycle
from rankscope import schema
from rankscope.store import InfluxStore
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario, load_scenario

START = 1_770_000_000_000
ROLLUPS = {schema.ROLLUP_HOST, schema.ROLLUP_JOB, schema.ROLLUP_HOST_WINDOW, schema.ROLLUP_HOST_HOUR}


def _write(store, sim, n):
    for _ in range(n):
        res = sim.step()
        store.write_stage_latency(sim.frame(res, time_ms=START + 30_000 * res.iteration))


@pytest.mark.faults
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
    # and its cost goes on too: neither counted twice over the replayed iterations nor restarted
    from analyzer.job_analyzer import JobAnalyzer
    from evaluation.accuracy import result_cube
    from rankscope.schema import DEFAULT_STAGES

    sim2, one = ClusterSimulator(scenario), JobAnalyzer(scenario.job, scenario.topology, DEFAULT_STAGES)
    for _ in range(40):
        res = sim2.step()
        one.feed(result_cube(res, sim2.stages.names))
    (whole,) = one.incidents()
    (restarted,) = second.incidents()
    assert restarted.impact.gpu_hours_lost == pytest.approx(whole.impact.gpu_hours_lost, rel=0.01)


def test_reads_are_bounded_by_rows_and_find_the_same(influx_store, monkeypatch):
    # at 100,000 ranks 20 iterations are 2,000,000 rows, longer than a request may take: a
    # read holds at most max_read_rows rows; here 3 iterations' worth of this job
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=30)
    sim = ClusterSimulator(scenario)
    _write(influx_store, sim, 28)
    world = scenario.topology.world
    sizes = []
    read = influx_store.read_stage_latency

    def counted(*args, **kwargs):
        frame = read(*args, **kwargs)
        sizes.append(frame[schema.ITERATION_FIELD].nunique() if len(frame) else 0)
        return frame

    monkeypatch.setattr(influx_store, "read_stage_latency", counted)
    svc = AnalyzerService(influx_store, max_read_rows=3 * world)
    svc.cycle()
    assert sizes[0] == 1 and max(sizes) == 3 and sum(sizes) == 28     # one, then three at a time
    (inc,) = svc.incidents()
    assert inc.ranks == [1379] and svc.analyzers[scenario.job].last_iteration == 27


def test_incomplete_last_iteration_is_held_back(influx_store):
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=20)
    sim = ClusterSimulator(scenario)
    _write(influx_store, sim, 12)
    res = sim.step()
    half = sim.frame(res, time_ms=START + 30_000 * res.iteration).iloc[:1000]   # a writer mid-iteration
    influx_store.write_stage_latency(half)
    now = {"s": (START + 30_000 * 12 + 5_000) / 1000}   # a live analyzer, 5 s after it was stamped
    svc = AnalyzerService(influx_store, clock=lambda: now["s"])
    svc.cycle()
    ja = svc.analyzers[scenario.job]
    assert ja.last_iteration == 11                    # iteration 12 waits for its other ranks
    assert svc.incidents() == []                      # and 1,048 missing ranks are not "silent"
    # the rest arrives: the iteration goes on whole
    influx_store.write_stage_latency(sim.frame(res, time_ms=START + 30_000 * res.iteration).iloc[1000:])
    svc.cycle()
    assert ja.last_iteration == 12
    assert svc.readers[scenario.job].counts.short_iterations == 0


def test_an_iteration_whose_points_never_all_come_is_analyzed_after_the_wait(influx_store):
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=20)
    sim = ClusterSimulator(scenario)
    _write(influx_store, sim, 12)
    res = sim.step()
    influx_store.write_stage_latency(sim.frame(res, time_ms=START + 30_000 * res.iteration).iloc[:1000])
    now = {"s": (START + 30_000 * 12 + 5_000) / 1000}
    svc = AnalyzerService(influx_store, clock=lambda: now["s"])
    svc.cycle()
    ja = svc.analyzers[scenario.job]
    assert ja.last_iteration == 11
    now["s"] += 11                                    # 16 s after: past the 15 s wait
    svc.cycle()
    assert ja.last_iteration == 12                    # analyzed with the ranks it has
    assert svc.readers[scenario.job].counts.short_iterations == 1
    assert svc.incidents() == []                      # one missing iteration is not silence


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


@pytest.mark.faults
def test_a_hanging_database_is_reported_once_in_rankscopes_words(caplog, influx_server):
    """influxd stopped (SIGSTOP: it neither answers nor refuses): the first cycle waits on it,
    the next ones are skipped, and the log says so once, not at every interval."""
    import os
    import signal

    from apscheduler.events import EVENT_JOB_EXECUTED, EVENT_JOB_MAX_INSTANCES

    store = InfluxStore(influx_server.url, "hang", api="v1", retries=0, timeout_s=3)
    svc = AnalyzerService(store)
    caplog.set_level(logging.INFO)
    skipped, recovered = threading.Event(), threading.Event()
    count = {"skipped": 0}
    resumed = {"at": None}

    def on_skip(_event) -> None:
        count["skipped"] += 1
        if count["skipped"] >= 3:
            skipped.set()

    def on_run(event) -> None:
        if resumed["at"] is not None and event.retval is True:
            recovered.set()

    os.kill(influx_server.proc.pid, signal.SIGSTOP)
    try:
        sched = build_scheduler(svc, 0.2, blocking=False)
        sched.add_listener(on_skip, EVENT_JOB_MAX_INSTANCES)
        sched.add_listener(on_run, EVENT_JOB_EXECUTED)
        sched.start()
        assert skipped.wait(60), "no cycle was skipped while the database hung"
    finally:
        os.kill(influx_server.proc.pid, signal.SIGCONT)
        resumed["at"] = True
    assert recovered.wait(60), "no cycle succeeded after the database came back"
    sched.shutdown(wait=True)
    messages = [r.getMessage() for r in caplog.records]
    waiting = [m for m in messages if "waiting on the database" in m]
    assert len(waiting) == 1 and "3 s" in waiting[0]           # once, with the request timeout
    assert not [m for m in messages if "maximum number of running instances" in m]
    assert [m for m in messages if "analyzer cycle ended after" in m]


def test_thresholds_reload_between_cycles_and_a_bad_file_changes_nothing(caplog, influx_store, tmp_path):
    """A changed --config takes effect at the next cycle, logged with what changed; an invalid
    file is refused and the thresholds in force stay; no state is lost, nothing duplicated."""
    from analyzer.service.config_watch import ConfigWatcher
    from analyzer.service.schedule import CycleGuard

    config = tmp_path / "analyzer.toml"
    config.write_text("[analyzer]\nabs_ratio = 5.0\nmin_change = 3.0\nspike_ratio = 5.0\n")
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=60)   # 1379 at 2.5x from 20
    sim = ClusterSimulator(scenario)
    watcher = ConfigWatcher(config)
    svc = AnalyzerService(influx_store, watcher.config)
    guard = CycleGuard(svc, 30.0, watcher)
    caplog.set_level(logging.INFO, logger="rankscope.analyze")

    _write(influx_store, sim, 26)
    assert guard.run() and svc.incidents() == []          # 2.5x is below these thresholds
    config.write_text("[analyzer]\nabs_ratio = 'high'\n")
    _write(influx_store, sim, 4)
    assert guard.run() and svc.incidents() == []          # refused: the old thresholds stay
    assert any("reload refused" in r.getMessage() and "abs_ratio" in r.getMessage() for r in caplog.records)
    assert svc.cfg.abs_ratio == 5.0
    config.write_text("[analyzer]\n")                     # back to the defaults
    _write(influx_store, sim, 8)
    assert guard.run()
    (inc,) = svc.incidents()
    assert inc.ranks == [1379] and inc.cls == "compute_straggler" and inc.onset_iteration >= 30
    changed = [r.getMessage() for r in caplog.records if "reloaded" in r.getMessage()]
    assert changed and "abs_ratio 5.0 -> 1.5" in changed[-1] and "min_change 3.0 -> 0.15" in changed[-1]
    assert svc.analyzers[scenario.job].last_iteration == 37   # state kept: no replay from the start
    _write(influx_store, sim, 3)
    assert guard.run()
    stored = influx_store.read(schema.INCIDENT, scenario.job)
    assert stored["id"].unique().tolist() == [inc.id]         # one incident, not a second one


def test_a_job_named_before_its_first_point_is_analyzed_once_points_come(influx_store):
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=12)
    svc = AnalyzerService(influx_store, jobs=[scenario.job])
    svc.cycle()
    svc.cycle()                                       # nothing yet, twice: no failure
    sim = ClusterSimulator(scenario)
    _write(influx_store, sim, 12)
    svc.cycle(final=True)
    assert svc.analyzers[scenario.job].last_iteration == 11


class _Counting:
    """A store that counts the calls made to it, and the reads of the rollups among them."""

    def __init__(self, store):
        self.store, self.calls, self.raw_rows = store, Counter(), 0

    def __getattr__(self, name):
        attr = getattr(self.store, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            if name in ("read", "next_times", "latest_times") and args and args[0] in ROLLUPS:
                self.calls["rollup reads"] += 1
            got = attr(*args, **kwargs)
            if name == "read_stage_latency":
                self.raw_rows += len(got)
            return got
        return counted

    def take(self) -> Counter:
        out, self.calls = self.calls, Counter()
        return out


def test_a_chunk_costs_a_probe_and_a_read_and_no_rollup_is_read_back(influx_store):
    """Per chunk of iterations the cycle asks the store for the next times and reads the
    points; the events are read once a cycle, the rollups written once, and the 5-minute
    windows and hours are made in memory: nothing the analyzer wrote is read back. A restarted
    analyzer reads its rollups once: the 5-minute windows its predecessor stored, from the hour
    of the first window it writes (a few hours of windows at most), so that it need not read
    the raw points of that hour again for them; of raw points it reads only the ``history``
    iterations it replays (the job here began 34 iterations before them, in that hour) and
    those its predecessor did not analyze."""
    sc = Scenario.from_dict({"topology": {"tp": 1, "pp": 2, "dp": 16, "ep": 4, "gpus_per_node": 4},
                             "run": {"job": "calls", "iterations": 80, "seed": 1}}, name="calls")
    other = InfluxStore(influx_store.url, f"test_{uuid.uuid4().hex[:10]}", api="v1")
    sim, last = ClusterSimulator(sc), {"ms": START}

    def write(n: int, stores) -> None:
        for _ in range(n):
            res = sim.step()
            last["ms"] = START + 30_000 * res.iteration
            for st in stores:
                st.write_stage_latency(sim.frame(res, time_ms=last["ms"]))

    def calls(store, chunk: int) -> Counter:
        counting = _Counting(store)
        AnalyzerService(counting, chunk_iterations=chunk, clock=lambda: last["ms"] / 1000).cycle()
        return counting.take()

    try:
        write(60, (influx_store, other))                  # 30 minutes: windows and an hour close
        coarse, fine = calls(influx_store, 20), calls(other, 5)
    finally:
        other.drop_database()
        other.close()
    chunks = fine["read_stage_latency"] - coarse["read_stage_latency"]
    assert chunks >= 8 and fine["next_times"] - coarse["next_times"] == chunks
    assert sum(fine.values()) - sum(coarse.values()) == 2 * chunks     # nothing else grows with the chunks
    assert coarse["read_events"] == fine["read_events"] == 1 and coarse["rollup reads"] == fine["rollup reads"] == 0
    assert len(influx_store.read(schema.ROLLUP_HOST_WINDOW, "calls")) and len(influx_store.read(schema.ROLLUP_HOST_HOUR,
                                                                                                 "calls"))
    counting = _Counting(influx_store)
    live = AnalyzerService(counting, clock=lambda: last["ms"] / 1000 + 5)
    live.cycle()
    counting.take()
    for _ in range(12):                                   # one new iteration a cycle, windows closing
        write(1, (influx_store,))
        live.cycle()
        got = counting.take()
        assert got["read_stage_latency"] == got["next_times"] == got["read_events"] == 1
        assert got["rollup reads"] == 0 and got["latest_times"] == 0
    write(2, (influx_store,))
    counting.raw_rows = 0
    restarted = AnalyzerService(counting, clock=lambda: last["ms"] / 1000 + 5)
    restarted.cycle()
    assert counting.take()["rollup reads"] == 1
    # the replay (the last iterations analyzed, the first one partial) and the 2 new ones
    assert counting.raw_rows <= (restarted.cfg.history + 1 + 2) * restarted.analyzers["calls"].topo.world
