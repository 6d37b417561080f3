"""A job's life as the service sees it on the real InfluxDB: a restart from a checkpoint (its
iterations go back and run again), a shrink, a replaced node, its end and a new job under its
name; and the step numbering of :class:`analyzer.read.attempts.Attempts` on its own.

Each job is simulated piece by piece with the collector shapes on (each rank's own clock,
skewed hosts, dropped points, sporadic stalls): a piece is one run of the job (an attempt),
written with its iteration numbers moved to where the job resumed and its time after a pause.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import pandas as pd
import pytest

from analyzer.read.attempts import Attempts
from analyzer.service.analyzer_service import AnalyzerService
from dashboards import provisioning
from dashboards.report import write_report
from dashboards.report_data import load_window
from evaluation.accuracy import COLLECTOR_SHAPES
from rankscope import schema
from rankscope.incident import load_incident
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario
from tests.grafana_macros import TimeRange, dashboard_queries, influx_query, resolve_variables

T0 = 1_770_000_000_000
TOPO = {"tp": 1, "pp": 2, "dp": 8, "ep": 4, "gpus_per_node": 4}   # 16 ranks, 4 hosts


def _scenario(job: str, n: int, faults: list[dict], topo: dict | None = None, seed: int = 5) -> Scenario:
    return Scenario.from_dict({"topology": topo or TOPO, "run": {"job": job, "iterations": n, "seed": seed},
                               "model": dict(COLLECTOR_SHAPES), "fault": faults})


def _piece(store, job: str, first_it: int, n: int, start_ms: int, faults: list[dict] = (),
           attempt: int | None = None, warmup: int = 0, topo: dict | None = None, seed: int = 5,
           hosts: dict[str, str] | None = None) -> int:
    """One run of ``job``: iterations ``first_it`` .. ``first_it + n - 1`` from ``start_ms``;
    ``faults`` in the job's iteration numbers; its first ``warmup`` iterations 1.5-3x slow on
    every rank (unevenly); ``hosts`` renames hosts (a replaced node). Returns its end (ms)."""
    moved = [{**f, "start": f["start"] - first_it, "end": f["end"] - first_it} for f in faults]
    sim = ClusterSimulator(_scenario(job, n, moved, topo, seed), start_ms=start_ms)
    rng = np.random.default_rng(seed)
    end = start_ms
    for _ in range(n):
        res = sim.step()
        f = sim.frame(res)
        if res.iteration < warmup:
            slow = rng.uniform(1.5, 3.0, len(f))
            for col in [*sim.stages.names, "iteration_ms"]:
                if col in f.columns:
                    f[col] = f[col].to_numpy(dtype=float) * slow
        f[schema.ITERATION_FIELD] = f[schema.ITERATION_FIELD].to_numpy() + first_it
        if attempt is not None:
            f[schema.ATTEMPT_FIELD] = attempt
        if hosts:
            f["host"] = f["host"].map(lambda h: hosts.get(h, h))
        store.write_stage_latency(f)
        end = int(f["time"].max())
    return end


def _incidents(store, job: str) -> list[dict]:
    rows = store.read(schema.INCIDENT, job)
    if not len(rows):
        return []
    return rows.sort_values("time").groupby("id").tail(1).to_dict("records")


def _lifecycle(store, job: str) -> pd.DataFrame:
    rows = store.read(schema.JOB_LIFECYCLE, job)
    return rows.sort_values("time").reset_index(drop=True) if len(rows) else rows


def _ranks(inc: dict) -> list[int]:
    return sorted(int(r) for r in re.findall(r"\d+", str(inc["ranks"])))


# ---------------------------------------------------------------- restarts


@pytest.mark.parametrize("with_attempt", [False, True], ids=["rewind", "attempt-field"])
def test_a_fault_inside_the_rerun_window_is_found_and_the_warmup_blames_nobody(influx_store, with_attempt):
    job = "rewind"
    end = _piece(influx_store, job, 0, 60, T0, attempt=0 if with_attempt else None)   # crashes after 59
    fault = {"kind": "compute_slowdown", "ranks": "5", "factor": 2.5, "start": 68, "end": 86}
    _piece(influx_store, job, 30, 70, end + 300_000, [fault], attempt=1 if with_attempt else None,
           warmup=3)                                                                # resumes at 30
    svc = AnalyzerService(influx_store)
    svc.cycle(final=True)
    incs = _incidents(influx_store, job)
    assert [_ranks(i) for i in incs] == [[5]]                 # the fault, and nothing for the warm-up
    # steps: 0-59 the first attempt, 60-129 the second (its iteration 30 is step 60)
    onset = int(incs[0]["onset_iteration"])
    assert 60 + (68 - 30) <= onset <= 60 + (68 - 30) + 3
    life = _lifecycle(influx_store, job)
    (restart,) = life[life["event"] == "restart"].to_dict("records")
    assert (int(restart["iteration"]), int(restart["step"]), int(restart["attempt"])) == (30, 60, 1)
    assert svc.analyzers[job].last_iteration == 129
    rollup = influx_store.read(schema.ROLLUP_JOB, job)
    assert sorted(rollup["iteration"].astype(int).unique().tolist()) == list(range(130))   # nothing overwritten


def test_the_report_and_the_dashboards_show_the_restart(influx_store, tmp_path):
    job = "report"
    end = _piece(influx_store, job, 0, 40, T0)
    fault = {"kind": "compute_slowdown", "ranks": "6", "factor": 2.5, "start": 30, "end": 60}
    _piece(influx_store, job, 20, 40, end + 300_000, [fault])   # steps 40-79, the fault from step 50
    AnalyzerService(influx_store).cycle(final=True)
    (inc,) = _incidents(influx_store, job)
    stored = load_incident(influx_store, job, inc["id"])
    window = load_window(influx_store, stored)
    steps = window.cube.iterations
    assert len(np.unique(steps)) == len(steps) and steps.max() <= 79 and stored.onset_iteration in steps
    page = write_report(influx_store, job, tmp_path, inc["id"]).read_text()
    assert "restart (attempt 1): resumed at iteration 20" in page and "step 40" in page
    # the NOC wall's and the drill-down's annotation, as Grafana fills it in
    tr = TimeRange(T0 - 60_000, end + 3600_000, relative=True)
    run = lambda q: influx_query(influx_store.url, influx_store.bucket, q)  # noqa: E731
    for name in ("noc", "incident"):
        model = provisioning.dashboard_models()[name]
        variables = resolve_variables(model, run, tr, [])
        (q,) = [pq.query for pq in dashboard_queries(model, variables, tr, "10s")
                if pq.where == "annotation 'Restarts and job ends'"]
        res = run(q)
        assert res.rows == 1 and "resumed at iteration 20" in str(res.series), name


def test_a_restarted_service_numbers_the_steps_as_its_predecessor_did(influx_store):
    job = "resume"
    end = _piece(influx_store, job, 0, 40, T0)
    end = _piece(influx_store, job, 20, 30, end + 240_000)          # steps 40-69
    first = AnalyzerService(influx_store)
    first.cycle()
    del first                                                      # the analyzer dies
    fault = {"kind": "compute_slowdown", "ranks": "9", "factor": 2.5, "start": 55, "end": 75}
    _piece(influx_store, job, 50, 30, end + 1_000, [fault])        # goes on, iterations 50-79
    second = AnalyzerService(influx_store)
    second.cycle(final=True)
    life = _lifecycle(influx_store, job)
    assert life["event"].tolist() == ["restart"]                   # not found twice
    incs = _incidents(influx_store, job)
    assert [_ranks(i) for i in incs] == [[9]]
    assert 20 + 55 <= int(incs[0]["onset_iteration"]) <= 20 + 55 + 3    # step = iteration + 20
    assert second.analyzers[job].last_iteration == 20 + 79


# ---------------------------------------------------------------- shrink, swap


def test_a_service_restarted_after_a_shrink_closes_the_incidents_of_ranks_that_left(influx_store):
    job = "shrunk"
    fault = {"kind": "compute_slowdown", "ranks": "12", "factor": 2.5, "start": 20, "end": 400}
    end = _piece(influx_store, job, 0, 40, T0, [fault])
    first = AnalyzerService(influx_store)
    first.cycle()
    assert [(i.ranks, i.is_open) for i in first.incidents()] == [([12], True)]
    del first                                                      # the analyzer dies; the job shrinks
    _piece(influx_store, job, 30, 40, end + 300_000, topo={**TOPO, "dp": 4})
    again = AnalyzerService(influx_store)
    again.cycle(final=True)                                        # no error: rank 12 is not in the job
    (inc,) = _incidents(influx_store, job)
    assert _ranks(inc) == [12] and inc["status"] == "resolved"
    assert "its ranks left the job" in str(inc["evidence"])
    assert again.analyzers[job].topo.world == 8


def test_a_job_that_shrinks_forgets_the_ranks_that_left(influx_store):
    job = "shrink"
    end = _piece(influx_store, job, 0, 40, T0)
    small = {**TOPO, "dp": 4}                                      # 8 ranks from now on
    _piece(influx_store, job, 30, 40, end + 300_000, topo=small)
    svc = AnalyzerService(influx_store)
    svc.cycle(final=True)
    assert _incidents(influx_store, job) == []                     # the 8 that left are not silent
    assert svc.analyzers[job].topo.world == 8


def test_a_verdict_names_the_host_the_rank_is_on_after_a_node_swap(influx_store):
    job = "swap"
    end = _piece(influx_store, job, 0, 40, T0)
    old = "gpu-node-00001"                                         # ranks 4-7
    written = influx_store.read(schema.STAGE_LATENCY, job)
    assert old in set(written.loc[written["rank"].astype(int) == 5, "host"])
    fault = {"kind": "compute_slowdown", "ranks": "5", "factor": 2.5, "start": 50, "end": 80}
    _piece(influx_store, job, 30, 50, end + 300_000, [fault], hosts={old: "spare-17"})
    AnalyzerService(influx_store).cycle(final=True)
    (inc,) = _incidents(influx_store, job)
    assert _ranks(inc) == [5]
    assert "spare-17" in str(inc["hosts"]) and old not in str(inc["hosts"])


# ---------------------------------------------------------------- end, name reuse


def test_a_job_that_ends_closes_its_incidents_and_its_name_starts_afresh(influx_store):
    job = "reuse"
    fault = {"kind": "compute_slowdown", "ranks": "3", "factor": 2.5, "start": 30, "end": 200}
    end = _piece(influx_store, job, 0, 50, T0, [fault])             # ends with the fault on
    bigger = {**TOPO, "dp": 16}                                     # a new job, same name, 2 h on
    _piece(influx_store, job, 0, 40, end + 2 * 3600_000, topo=bigger, seed=9)
    svc = AnalyzerService(influx_store)
    svc.cycle(final=True)
    incs = _incidents(influx_store, job)
    assert [_ranks(i) for i in incs] == [[3]]                       # nothing new from the new job
    assert incs[0]["status"] == "resolved"
    assert "job ended" in str(incs[0]["evidence"])
    life = _lifecycle(influx_store, job)
    assert life["event"].tolist()[:2] == ["ended", "start"]
    start = life[life["event"] == "start"].iloc[0]
    assert int(start["iteration"]) == 0 and int(start["step"]) >= 50   # its steps follow the old job's
    assert svc.analyzers[job].topo.world == 32                      # the new job's layout, not a mix


def test_a_job_that_stops_writing_ends_and_a_restarted_service_does_not_revive_it(influx_store, monkeypatch):
    import analyzer.service.analyzer_service as service

    end_a = _piece(influx_store, "done", 0, 40, T0)
    end_b = _piece(influx_store, "runs", 0, 40, T0, seed=6)
    svc = AnalyzerService(influx_store)
    svc.cycle()
    assert set(svc.analyzers) == {"done", "runs"}
    # an hour on, "runs" still writes; "done" wrote nothing more
    later = max(end_a, end_b) + 3600_000
    _piece(influx_store, "runs", 40, 5, later - 5 * 40_000, seed=6)
    monkeypatch.setattr(service.time, "time", lambda: later / 1000)
    svc.cycle()
    assert "done" not in svc.analyzers and "runs" in svc.analyzers
    assert _lifecycle(influx_store, "done")["event"].tolist() == ["ended"]
    again = AnalyzerService(influx_store)                          # the service restarts
    again.cycle()
    assert "done" not in again.analyzers
    assert _lifecycle(influx_store, "done")["event"].tolist() == ["ended"]


def test_a_job_read_only_in_part_by_a_catch_up_does_not_end(influx_store):
    """A catch-up cut short by the job's deadline leaves the job's reader hours behind the
    others': the job has not stopped writing, and must not end (nor come back as a new job)."""
    from analyzer.config import AnalyzerConfig

    end = _piece(influx_store, "behind", 0, 60, T0)
    later = _piece(influx_store, "ahead", 0, 10, end + 2 * 3600_000, seed=6)
    svc = AnalyzerService(influx_store, AnalyzerConfig(job_deadline_s=1e-6), chunk_iterations=5,
                          clock=lambda: (later + 60_000) / 1000)
    for _ in range(40):
        svc.cycle()
        if "behind" not in svc.analyzers:
            break
        assert _lifecycle(influx_store, "behind").empty, "ended while its reader was behind"
    life = _lifecycle(influx_store, "behind")          # read to its end, one job all along, then ended
    assert life["event"].tolist() == ["ended"] and int(life["iteration"].iloc[0]) == 59


def test_an_analyzer_killed_in_a_catch_up_goes_on_from_where_it_stopped(influx_store):
    """A restarted analyzer replays the last iterations its predecessor analyzed and goes on
    from there: a stall in the iterations between is found, not skipped for the newest."""
    from analyzer.config import AnalyzerConfig

    stall = {"kind": "transient_stall", "ranks": "5", "stage": "attention", "factor": 10.0, "start": 70, "end": 72}
    _piece(influx_store, "caught", 0, 120, T0, [stall])
    first = AnalyzerService(influx_store, AnalyzerConfig(job_deadline_s=1e-6), chunk_iterations=5)
    while "caught" not in first.analyzers or first.analyzers["caught"].last_iteration < 40:
        first.cycle()
    del first                                              # killed, 80 iterations to go
    second = AnalyzerService(influx_store)
    report = second.cycle()
    assert report.iterations["caught"] >= 119 - 40        # every iteration after the first's
    assert [(_ranks(i), int(i["onset_iteration"])) for i in _incidents(influx_store, "caught")] == [([5], 70)]


def test_one_job_failing_does_not_hide_what_the_cycle_did_for_the_others(influx_store, monkeypatch, caplog):
    from analyzer.service.schedule import safe_cycle

    _piece(influx_store, "good", 0, 20, T0)
    _piece(influx_store, "bad", 0, 20, T0, seed=6)
    svc = AnalyzerService(influx_store)
    real = svc._cycle_job

    def failing(job, report, final):
        if job == "bad":
            raise ValueError("broken on purpose")
        return real(job, report, final)

    monkeypatch.setattr(svc, "_cycle_job", failing)
    with caplog.at_level(logging.INFO):
        assert safe_cycle(svc) is False
    assert "broken on purpose" in caplog.text
    assert "good: " in caplog.text and " it" in caplog.text          # the other job's count is said


# ---------------------------------------------------------------- Attempts alone


def _rows(t, r, it, **more) -> pd.DataFrame:
    return pd.DataFrame({"time": t, "rank": r, "iteration": it, **more})


def test_a_late_point_of_a_lagging_rank_is_no_restart():
    att = Attempts()
    att.steps(_rows([0, 1_000, 2_000, 3_000], [0] * 4, [0, 1, 2, 3]))
    out = att.steps(_rows([3_500], [0], [3]))                      # a duplicate, stamped later
    assert att.take_new() == [] and out["iteration"].tolist() == [3]


def test_ranks_restarting_seconds_apart_are_one_restart():
    att = Attempts()
    t = np.arange(30) * 1_000
    att.steps(_rows(np.r_[t, t], np.r_[[0] * 30, [1] * 30], np.r_[np.arange(30), np.arange(30)]))
    out = att.steps(_rows([200_000, 212_000, 201_000, 213_000], [0, 1, 0, 1], [10, 10, 11, 11]))
    (seg,) = att.take_new()
    assert (seg.kind, seg.first_iteration, seg.first_step) == ("restart", 10, 30)
    assert sorted(out["iteration"].tolist()) == [30, 30, 31, 31]


def test_a_restored_tracker_numbers_the_steps_as_before():
    rows = _rows([0, 1_000, 2_000, 200_000, 201_000], [0] * 5, [0, 1, 2, 1, 2])
    first = Attempts()
    before = first.steps(rows)["iteration"].tolist()
    life = pd.DataFrame([s.row("j") for s in first.take_new()])
    again = Attempts()
    again.restore(life)
    assert again.steps(rows.iloc[3:])["iteration"].tolist() == before[3:] == [3, 4]


def test_a_jump_of_a_few_ranks_is_refused_and_said(caplog):
    att = Attempts(job="j")
    att.steps(_rows(np.repeat([0, 1_000], 4), np.tile(range(4), 2), np.repeat([0, 1], 4)))
    with caplog.at_level(logging.ERROR):
        out = att.steps(_rows([2_000] * 4, range(4), [2, 2, 2, 5_000_000]))
    assert out["iteration"].tolist() == [2, 2, 2] and att.refused == 1
    assert "jumped to iteration 5000000" in caplog.text


def test_a_jump_of_most_ranks_is_a_new_segment():
    att = Attempts(job="j")
    att.steps(_rows(np.repeat([0, 1_000], 4), np.tile(range(4), 2), np.repeat([0, 1], 4)))
    out = att.steps(_rows([2_000] * 4, range(4), [5_000_000] * 4))
    (seg,) = att.take_new()
    assert seg.kind == "jump" and out["iteration"].tolist() == [2] * 4


def test_two_jobs_writing_one_rank_from_two_hosts_are_refused_and_said(caplog):
    att = Attempts(job="j")
    att.steps(_rows([0, 1_000], [0, 0], [0, 1], host=["a", "a"]))
    with caplog.at_level(logging.ERROR):
        out = att.steps(_rows([2_000, 2_100], [0, 0], [2, 2], host=["a", "b"]))
    assert out["host"].tolist() == ["a"]
    assert "two jobs under one name" in caplog.text
