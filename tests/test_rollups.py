"""Rollups (analyzer/write/rollups.py), written by the analyzer's cycle and by ``rankscope rollup``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.config import AnalyzerConfig
from analyzer.service.analyzer_service import AnalyzerService
from analyzer.write.rollups import (
    Placement,
    host_rollup,
    incident_host_frame,
    job_rollup,
    rollup_frames,
    window_rollup,
)
from rankscope import schema
from rankscope.cli import main
from rankscope.frames import LatencyCube, frame_to_cube
from rankscope.incident import Impact, Incident, IncidentClass, Status
from rankscope.topology import Topology
from simulator.scenario import Scenario
from simulator.simulate import simulate

START = 1_700_000_000_000
TINY = Topology(tp=1, pp=2, dp=16, ep=4, gpus_per_node=4, host_pattern="gpu-node-{node:05d}")
CULPRIT = 5   # node 1


def _scenario(iterations: int = 24) -> Scenario:
    return Scenario.from_dict({
        "topology": {"tp": 1, "pp": 2, "dp": 16, "ep": 4, "gpus_per_node": 4},
        "run": {"job": "tiny", "iterations": iterations, "seed": 1},
        "fault": [{"kind": "compute_slowdown", "ranks": CULPRIT, "factor": 3.0, "start": 12}],
    }, name="tiny")


def _cube(topo: Topology, t: int = 3, seed: int = 0) -> LatencyCube:
    rng = np.random.default_rng(seed)
    stages = ["attention", "mlp"]
    values = rng.uniform(10, 50, (t, topo.world, len(stages)))
    it_ms = rng.uniform(900, 1100, (t, topo.world))
    return LatencyCube(np.arange(t) + 7, START + np.arange(t) * 1000, stages, values, it_ms)


def _reference(topo: Topology, cube: LatencyCube) -> pd.DataFrame:
    """The same rollup the slow, obvious way (pandas groupby) to compare with."""
    t, r, s = cube.values.shape
    long = pd.DataFrame({"it": np.repeat(np.arange(t), r), "node": np.tile(topo.node_index, t),
                         "pp": np.tile(topo.pp_index, t), "it_ms": cube.iteration_ms.reshape(-1)})
    for i, name in enumerate(cube.stages):
        long[name] = cube.values[:, :, i].reshape(-1)
    return long.groupby(["it", "node", "pp"]).agg(["mean", "max"])


def test_host_rollup_is_the_mean_and_max_over_each_hosts_ranks():
    cube = _cube(TINY)
    cube.values[1, 9, 1] = np.nan            # rank 9 missed mlp in one iteration
    cube.values[2, 12:16, :] = np.nan        # node 3 reported nothing in the last iteration
    cube.iteration_ms[2, 12:16] = np.nan
    df = host_rollup("tiny", Placement.of(TINY), cube)
    ref = _reference(TINY, cube)
    assert len(df) == 3 * TINY.nodes - 1     # no point for a host that reported nothing
    assert not ((df["iteration"] == 9) & (df["node"] == 3)).any()
    merged = df.set_index([df["iteration"] - 7, "node", "pp"])
    for stage in cube.stages:
        want = ref[stage].loc[merged.index]
        assert np.allclose(merged[stage], want["mean"]) and np.allclose(merged[f"{stage}_max"], want["max"])
    assert np.allclose(merged["iteration_ms"], ref["it_ms"].loc[merged.index]["mean"])
    assert set(df["host"]) == {f"gpu-node-{n:05d}" for n in range(TINY.nodes)}
    assert (df["host"] == df["node"].map(lambda n: f"gpu-node-{n:05d}")).all()
    assert df["ranks"].max() == 4 and (df["time"] == START + (df["iteration"] - 7) * 1000).all()


def test_a_node_that_spans_two_pipeline_stages_is_one_point_per_stage():
    topo = Topology(tp=1, pp=2, dp=6, gpus_per_node=4)   # node 1 holds ranks 4-7: pp 0 and pp 1
    df = host_rollup("j", Placement.of(topo), _cube(topo, t=1))
    assert sorted(zip(df["node"], df["pp"], df["ranks"], strict=True)) == [(0, 0, 4), (1, 0, 2), (1, 1, 2),
                                                                           (2, 1, 4)]
    assert set(df["host"]) == {"node 0", "node 1", "node 2"}   # no host names known


def test_job_rollup_is_the_iteration_time_percentiles_and_the_slowest_rank():
    cube = _cube(TINY)
    cube.iteration_ms[1, 21] = 5000.0
    cube.iteration_ms[2, :] = np.nan          # nobody reported: no point
    df = job_rollup("tiny", Placement.of(TINY), cube)
    assert df["iteration"].tolist() == [7, 8]
    assert np.allclose(df["median_ms"], np.median(cube.iteration_ms[:2], axis=1))
    assert np.allclose(df["p99_ms"], np.percentile(cube.iteration_ms[:2], 99, axis=1))
    assert df["max_ms"].iloc[1] == 5000.0 and df["slowest_rank"].iloc[1] == 21
    assert df["slowest_node"].iloc[1] == 5 and df["slowest_host"].iloc[1] == "gpu-node-00005"
    assert df["slowest_rank"].iloc[0] == int(np.argmax(cube.iteration_ms[0]))


def test_a_stage_named_like_a_rollup_field_is_refused():
    cube = _cube(TINY)
    cube.stages = ["ranks", "mlp"]
    with pytest.raises(ValueError, match="collides"):
        host_rollup("tiny", Placement.of(TINY), cube)


def test_incident_host_has_one_point_per_culprit_host():
    inc = Incident(id="cs-3-r4", job="j", cls=IncidentClass.COMPUTE_STRAGGLER, ranks=[4, 5, 8], nodes=[1, 2],
                   stage="mlp", ratio=4.0, group_type="ep", group_ranks=list(range(16)), onset_iteration=3,
                   onset_ms=START, hosts=["gpu-node-00001", "gpu-node-00002"],
                   impact=Impact(30.0, 90.0, 3.0, 12.5, 31.0))
    bare = Incident(id="hs-5-r0", job="j", cls=IncidentClass.HOST_STALL, ranks=[0], nodes=[0], stage=None,
                    ratio=2.0, group_type=None, group_ranks=[], onset_iteration=5, onset_ms=START + 5,
                    status=Status.RESOLVED)
    df = incident_host_frame([inc, bare])
    assert df["host"].tolist() == ["gpu-node-00001", "gpu-node-00002", "node 0"]
    assert df["id"].tolist() == ["cs-3-r4", "cs-3-r4", "hs-5-r0"]
    assert df["status"].tolist() == ["open", "open", "resolved"]
    assert df["gpu_hours_lost"].iloc[0] == 12.5 and df["slowdown"].iloc[0] == 3.0
    assert set(df.columns) - {"time"} <= set(schema.MEASUREMENTS[schema.INCIDENT_HOST].tags) | set(
        schema.MEASUREMENTS[schema.INCIDENT_HOST].fields)


def _counts(store, job: str) -> dict[str, int]:
    return {m: len(store.read(m, job)) for m in (schema.ROLLUP_HOST, schema.ROLLUP_JOB)}


def test_the_analyzer_writes_the_rollups_of_what_it_processed_and_a_rerun_the_same_points(influx_store):
    sc = _scenario()
    simulate(sc, influx_store, start_ms=START, progress=False)
    AnalyzerService(influx_store).cycle(final=True)
    counts = _counts(influx_store, "tiny")
    assert counts == {schema.ROLLUP_HOST: 24 * TINY.nodes, schema.ROLLUP_JOB: 24}
    hosts = influx_store.read(schema.ROLLUP_HOST, "tiny")
    raw = influx_store.read_stage_latency("tiny")
    late = hosts[hosts["iteration"] >= 14]
    worst = late.groupby("host")["mlp"].mean().sort_values()   # one slow rank of four lifts its host's mean
    assert worst.index[-1] == "gpu-node-00001" and worst.iloc[-1] > 1.3 * worst.iloc[-2]   # the culprit's host
    assert not [c for c in hosts.columns if c.endswith("_max")]   # the maxima go to the windows only
    # the per-host points are the raw points averaged: the same numbers the raw query gives
    one = raw[(raw["iteration"] == 20) & (raw["node"] == 1)]
    row = hosts[(hosts["iteration"] == 20) & (hosts["node"] == 1)].iloc[0]
    assert row["mlp"] == pytest.approx(one["mlp"].mean())
    jobs = influx_store.read(schema.ROLLUP_JOB, "tiny")
    j20 = jobs[jobs["iteration"] == 20].iloc[0]
    slowest = raw[(raw["iteration"] == 20) & (raw["rank"] == j20["slowest_rank"])].iloc[0]
    assert slowest["iteration_ms"] == pytest.approx(j20["max_ms"]) == pytest.approx(one["iteration_ms"].max())
    assert j20["slowest_host"] == slowest["host"] and j20["median_ms"] == pytest.approx(
        raw[raw["iteration"] == 20]["iteration_ms"].median())
    (inc,) = influx_store.read(schema.INCIDENT_HOST, "tiny").to_dict("records")
    assert inc["host"] == "gpu-node-00001" and inc["class"] == "compute_straggler" and inc["status"] == "open"
    before = hosts.sort_values(["time", "node"]).reset_index(drop=True)
    AnalyzerService(influx_store).cycle(final=True)      # a restarted analyzer replays its history
    assert _counts(influx_store, "tiny") == counts
    again = influx_store.read(schema.ROLLUP_HOST, "tiny").sort_values(["time", "node"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(before, again)
    assert len(influx_store.read(schema.INCIDENT_HOST, "tiny")) == 1


def _windows(store, job: str, measurement: str = schema.ROLLUP_HOST_WINDOW) -> pd.DataFrame:
    return store.read(measurement, job).sort_values(["time", "node"]).reset_index(drop=True)


def _hours(store, job: str) -> pd.DataFrame:
    return _windows(store, job, schema.ROLLUP_HOST_HOUR)


def _hour_of(host: pd.DataFrame) -> pd.DataFrame:
    """What an hour of ``host`` points is: every mean field over its iterations (the truth the
    hourly tier, made from 5-minute windows, must reproduce)."""
    return window_rollup(host, schema.ROLLUP_HOUR_MS)


def test_window_rollup_is_the_mean_of_the_hosts_iterations_in_each_window():
    cube = _cube(TINY, t=12)
    cube.times[:] = START // 300_000 * 300_000 + np.arange(12) * 60_000     # 5 per window: 5, 5, 2
    host = host_rollup("tiny", Placement.of(TINY), cube)
    win = window_rollup(host)
    assert len(win) == 3 * TINY.nodes and win["iterations"].tolist() == [5] * TINY.nodes * 2 + [2] * TINY.nodes
    node1 = host[host["node"] == 1]
    w = win[win["node"] == 1].reset_index(drop=True)
    assert w["time"].tolist() == sorted(set(node1["time"] // 300_000 * 300_000))
    for k, (lo, hi) in enumerate(((0, 5), (5, 10), (10, 12))):
        part = node1.iloc[lo:hi]
        assert w.loc[k, "mlp"] == pytest.approx(part["mlp"].mean())
        assert w.loc[k, "mlp_max"] == pytest.approx(part["mlp_max"].max())
        assert w.loc[k, "iteration"] == part["iteration"].min() and w.loc[k, "ranks"] == 4
    # the same host points again (a backfill) give the same windows
    pd.testing.assert_frame_equal(window_rollup(host.sample(frac=1, random_state=1)), win)
    assert window_rollup(host.iloc[:0]).empty
    with pytest.raises(ValueError, match="positive"):
        window_rollup(host, 0)


def test_an_hour_of_windows_is_the_mean_over_the_hours_iterations_not_over_its_windows():
    """Windows of unequal length (an hour's first and last are partial, a job stops mid-window):
    the hour weights each window by its iterations, so it is what the iterations themselves say."""
    cube = _cube(TINY, t=40)
    start = START // 3_600_000 * 3_600_000 + 3_600_000 - 7 * 60_000        # 7 minutes before an hour
    cube.times[:] = start + np.sort(np.r_[np.arange(0, 20) * 60_000, 20 * 60_000 + np.arange(20) * 150_000])
    host = host_rollup("tiny", Placement.of(TINY), cube)
    windows = window_rollup(host)
    assert windows["iterations"].nunique() > 1           # 1, 2, 5 iterations a window
    hours = window_rollup(windows, schema.ROLLUP_HOUR_MS)
    want = _hour_of(host)
    n_hours = len(set(cube.times // 3_600_000))
    assert n_hours == 3 and len(hours) == n_hours * TINY.nodes
    assert hours["iterations"].tolist() == want["iterations"].tolist()
    pd.testing.assert_frame_equal(hours, want, check_exact=False, rtol=1e-12)
    unweighted = windows[windows["node"] == 1].groupby(windows["time"] // 3_600_000)["mlp"].mean().to_numpy()
    assert not np.allclose(hours[hours["node"] == 1]["mlp"], unweighted)     # the weighting matters
    # a window with no finite value of a stage does not drag the hour's mean toward zero
    gap = windows.copy()
    gap.loc[gap.index[gap["node"] == 1][0], "mlp"] = np.nan
    with_gap = window_rollup(gap, schema.ROLLUP_HOUR_MS)
    n1 = gap[(gap["node"] == 1) & (gap["time"] < start + 7 * 60_000) & gap["mlp"].notna()]
    assert with_gap.loc[with_gap["node"] == 1, "mlp"].iloc[0] == pytest.approx(
        np.average(n1["mlp"], weights=n1["iterations"]))


def test_the_analyzer_writes_a_window_once_it_closed_by_data_or_by_the_clock(influx_store):
    simulate(_scenario(), influx_store, start_ms=START, progress=False)
    hosts = influx_store.read(schema.ROLLUP_HOST, "tiny")
    assert hosts.empty
    last_ms = influx_store.latest_times(schema.STAGE_LATENCY, "tiny", 1)[-1]
    svc = AnalyzerService(influx_store, clock=lambda: last_ms / 1000)
    svc.cycle()          # a live cycle: only windows that have closed
    hosts = influx_store.read(schema.ROLLUP_HOST, "tiny")
    hosts["window"] = hosts["time"] // 300_000 * 300_000
    per_window = hosts.groupby("window")["iteration"].nunique()
    closed = per_window[per_window.index + 300_000 <= last_ms - 120_000]
    live = _windows(influx_store, "tiny")
    assert len(closed) >= 2 and len(closed) < len(per_window)
    assert sorted(set(live["time"])) == closed.index.tolist()
    assert (live.groupby("time")["iterations"].first() == closed).all()
    # the open hour already holds the windows closed so far, no more
    assert _hours(influx_store, "tiny")["iterations"].sum() == live["iterations"].sum()
    # the job stops writing (it ended, or hangs): the clock closes its last windows
    svc.clock = lambda: (last_ms + 600_000) / 1000
    svc.cycle()
    done = _windows(influx_store, "tiny")
    assert sorted(set(done["time"])) == per_window.index.tolist()
    assert done["iterations"].sum() == 24 * TINY.nodes
    pd.testing.assert_frame_equal(done[done["time"].isin(closed.index)].reset_index(drop=True), live,
                                  check_like=True)
    node1 = hosts[hosts["node"] == 1].groupby("window")["mlp"].mean()
    assert np.allclose(done[done["node"] == 1]["mlp"], node1)
    # the hours those windows fall in: the mean over every iteration of the hour
    hours = _hours(influx_store, "tiny")
    assert hours["iterations"].sum() == 24 * TINY.nodes
    want = _hour_of(hosts.drop(columns="window")).sort_values(["time", "node"]).reset_index(drop=True)
    assert hours["time"].tolist() == want["time"].tolist()
    assert np.allclose(hours["mlp"], want["mlp"])
    # the hours' maxima are their windows' (the iterations' maxima are not stored one by one)
    assert np.allclose(hours["mlp_max"], done.assign(h=done["time"] // 3_600_000).groupby(["h", "node"])["mlp_max"]
                       .max().to_numpy())


def test_a_restarted_analyzer_writes_the_windows_its_predecessor_left(influx_store):
    """The predecessor rolled up every iteration but died before its last windows closed; the
    new analyzer replays only 3 iterations, yet writes every window from the latest stored one."""
    simulate(_scenario(), influx_store, start_ms=START, progress=False)
    last_ms = influx_store.latest_times(schema.STAGE_LATENCY, "tiny", 1)[-1]
    AnalyzerService(influx_store, clock=lambda: (last_ms + 600_000) / 1000).cycle()
    whole = _windows(influx_store, "tiny")
    keep = sorted(set(whole["time"]))[1]
    influx_store.execute(f'DELETE FROM "{schema.ROLLUP_HOST_WINDOW}" WHERE time > {keep}ms')
    assert sorted(set(_windows(influx_store, "tiny")["time"])) == sorted(set(whole["time"]))[:2]
    AnalyzerService(influx_store, AnalyzerConfig(history=3), clock=lambda: (last_ms + 600_000) / 1000).cycle()
    pd.testing.assert_frame_equal(_windows(influx_store, "tiny"), whole, check_like=True)


def test_stored_windows_and_hours_are_those_of_the_stored_points_across_restarts(influx_store):
    """The cycle makes its windows and hours in memory. Across a one-shot final run (it stores
    the open window), a restart whose replay reaches back before it, a final cycle, and a
    restart with a short replay whose hour holds a window its predecessor stored open, every
    window stored is the window of the stored rollup_host points, and every hour stored the
    hour of the stored windows: what reading them back gave."""
    from simulator.cluster import ClusterSimulator

    sim = ClusterSimulator(_scenario(iterations=120))
    start = (START // schema.ROLLUP_HOUR_MS + 1) * schema.ROLLUP_HOUR_MS - 50 * 60_000
    last = {"ms": start}

    def write(n: int) -> None:
        for _ in range(n):
            res = sim.step()
            last["ms"] = start + 40_000 * res.iteration
            influx_store.write_stage_latency(sim.frame(res, time_ms=last["ms"]))

    write(20)
    AnalyzerService(influx_store, clock=lambda: last["ms"] / 1000).cycle(final=True)
    write(30)
    svc = AnalyzerService(influx_store, clock=lambda: last["ms"] / 1000 + 5)
    svc.cycle()
    write(40)
    svc.cycle(final=True)
    write(2)
    AnalyzerService(influx_store, AnalyzerConfig(history=10), clock=lambda: last["ms"] / 1000 + 3).cycle()
    hosts, windows, hours = (influx_store.read(m, "tiny") for m in (
        schema.ROLLUP_HOST, schema.ROLLUP_HOST_WINDOW, schema.ROLLUP_HOST_HOUR))
    assert hours["time"].nunique() == 2 and windows["iterations"].sum() == 90 * TINY.nodes
    order = ["time", "node"]
    want = window_rollup(hosts).sort_values(order).reset_index(drop=True)
    got = windows.sort_values(order).reset_index(drop=True)
    maxima = [c for c in got.columns if c.endswith("_max")]   # of the iterations, in memory: not stored per one
    assert maxima and all((got[c] >= got[c.removesuffix("_max")] - 1e-9).all() for c in maxima)
    pd.testing.assert_frame_equal(got.drop(columns=maxima), want[want["time"].isin(
        windows["time"])].reset_index(drop=True), check_like=True, check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(hours.sort_values(order).reset_index(drop=True),
                                  window_rollup(windows, schema.ROLLUP_HOUR_MS).sort_values(order).reset_index(
                                      drop=True), check_like=True, check_exact=False, rtol=1e-12)


def test_rollup_command_writes_the_hours_of_windows_whose_raw_points_are_gone(influx_store, capsys):
    """An upgrade: the analyzer wrote rollup_host and its 5-minute windows before hours existed,
    and the job's raw points have expired (the raw policy keeps 7 days, the windows 400).
    ``rankscope rollup --hours-only`` writes the hours of the stored windows in its range, and
    finds the job by its windows."""
    hour = schema.ROLLUP_HOUR_MS
    start = (START // hour + 1) * hour - 240_000          # 4 minutes before an hour: two hours
    simulate(_scenario(iterations=16), influx_store, start_ms=start, progress=False)
    times = sorted(influx_store.latest_times(schema.STAGE_LATENCY, "tiny", 100))
    AnalyzerService(influx_store, clock=lambda: (times[-1] + 600_000) / 1000).cycle()
    want = _hours(influx_store, "tiny")
    assert want["iterations"].sum() == 16 * TINY.nodes and want["time"].nunique() == 2
    influx_store.execute(f'DROP MEASUREMENT "{schema.ROLLUP_HOST_HOUR}"')
    influx_store.execute(f'DROP MEASUREMENT "{schema.STAGE_LATENCY}"')
    assert "tiny" not in influx_store.jobs()
    where = ["--store", influx_store.url, "--bucket", influx_store.bucket]
    first_hour_end = (times[0] // hour + 1) * hour
    assert main(["rollup", "--hours-only", "--since", str(times[0]), "--until", str(first_hour_end - 1),
                 "--job", "tiny", *where]) == 0
    assert capsys.readouterr().out == f"tiny: {TINY.nodes} rollup_host_1h point(s) from the stored 5-minute windows\n"
    first = _hours(influx_store, "tiny")
    pd.testing.assert_frame_equal(first, want[want["time"] < first_hour_end].reset_index(drop=True),
                                  check_like=True)
    # a range after the newest window writes nothing
    assert main(["rollup", "--since", str(times[-1] + 3_600_000), *where]) == 0
    assert capsys.readouterr().out == "tiny: no iteration in the range\n"
    assert len(_hours(influx_store, "tiny")) == TINY.nodes
    # the whole range, without --hours-only: no raw point to roll up, the hours still written
    assert main(["rollup", "--since", str(times[0]), *where]) == 0
    assert (f"tiny: no iteration in the range; {2 * TINY.nodes} rollup_host_1h point(s) from the stored"
            in capsys.readouterr().out)
    pd.testing.assert_frame_equal(_hours(influx_store, "tiny"), want, check_like=True)


def test_rollup_command_backfills_what_the_analyzer_never_saw_idempotently(any_store, capsys, tmp_path):
    sc = _scenario(iterations=16)
    simulate(sc, any_store, start_ms=START, progress=False)
    times = sorted(any_store.latest_times(schema.STAGE_LATENCY, "tiny", 100))
    where = ["--store", getattr(any_store, "url", None) or str(any_store.path), "--bucket", any_store.bucket]
    # the first half only, then everything, then everything again
    assert main(["rollup", "--since", str(times[0]), "--until", str(times[7]), "--chunk", "3", *where]) == 0
    assert _counts(any_store, "tiny") == {schema.ROLLUP_HOST: 8 * TINY.nodes, schema.ROLLUP_JOB: 8}
    assert main(["rollup", "--since", str(times[0]), *where]) == 0
    first = any_store.read(schema.ROLLUP_HOST, "tiny").sort_values(["time", "node"]).reset_index(drop=True)
    assert main(["rollup", "--since", str(times[0]), "--chunk", "5", *where]) == 0
    out = capsys.readouterr().out
    assert "tiny: rolled up 16 iteration(s)" in out and f" {TINY.nodes} rollup_host_1h" in out
    again = any_store.read(schema.ROLLUP_HOST, "tiny").sort_values(["time", "node"]).reset_index(drop=True)
    assert len(again) == 16 * TINY.nodes
    pd.testing.assert_frame_equal(first, again)
    # every 5-minute window the range touches, from every rollup_host point in it
    windows = _windows(any_store, "tiny")
    assert windows["iterations"].sum() == 16 * TINY.nodes
    assert _hours(any_store, "tiny")["iterations"].sum() == 16 * TINY.nodes
    pd.testing.assert_frame_equal(windows, window_rollup(again).sort_values(["time", "node"]).reset_index(
        drop=True), check_like=True, check_dtype=False)
    # the same numbers the analyzer's own rollup of the raw points gives
    raw = any_store.read_stage_latency("tiny")
    cube = frame_to_cube(raw, TINY.world, schema.DEFAULT_STAGES.names)
    want = rollup_frames("tiny", TINY, cube)[schema.ROLLUP_JOB]
    got = any_store.read(schema.ROLLUP_JOB, "tiny")
    assert np.allclose(got["p99_ms"], want["p99_ms"]) and (got["slowest_rank"] == want["slowest_rank"]).all()
    assert main(["rollup", "--since", "soon", *where]) == 1
