"""IL-0477 at full scale (12,960 ranks), checked on the data as stored in the real InfluxDB.

The data is the session's ``il0477_incident`` (the built-in scenario, 40 iterations, simulated
once and read by the analyzer, dashboard and report tests too): these tests read the
iterations around the onset (iteration 30; the event at 31) back from the database.
"""

import numpy as np
import pytest

from rankscope.frames import frame_to_cube
from rankscope.schema import DEFAULT_STAGES
from simulator.scenario import load_scenario
from simulator.truth import Truth

ONSET = 30
#: The iterations read back: 3 before the onset and 3 from it.
WINDOW = np.arange(ONSET - 3, ONSET + 3)
SLOW = np.arange(10352, 10360)
EP_GROUP = np.arange(10336, 10368)


@pytest.fixture(scope="module")
def il0477(il0477_incident):
    """The stored points of :data:`WINDOW`, the events and the truth."""
    data = il0477_incident
    scenario = load_scenario("il-0477").with_overrides(iterations=len(data.truth.times_ms))
    truth, times = data.truth, data.truth.times_ms
    df = data.store.read_stage_latency(data.job, start_ms=times[WINDOW[0]], end_ms=times[WINDOW[-1]])
    events = data.store.read_events(data.job)
    cube = frame_to_cube(df, scenario.topology.world, DEFAULT_STAGES.names)
    return scenario, truth, data.truth_path, df, cube, events


def _time(cube, iteration):
    """The stored timestamp of ``iteration`` (one of :data:`WINDOW`)."""
    return cube.times[cube.iterations.tolist().index(iteration)]


def _before_after(cube):
    it = cube.iterations
    return it < ONSET, it >= ONSET


def test_every_rank_every_iteration_is_stored(il0477, il0477_incident):
    scenario, truth, _, df, cube, _ = il0477
    assert len(df) == len(WINDOW) * 12960
    assert cube.iterations.tolist() == WINDOW.tolist()
    assert not np.isnan(cube.values).any()
    # one timestamp per iteration, shared by all ranks, spaced by the job's iteration time
    assert df.groupby("iteration")["time"].nunique().eq(1).all()
    job_it = np.nanmax(cube.iteration_ms, axis=1)
    assert np.allclose(np.diff(cube.times), job_it[1:], atol=1.5)
    # the first iteration is stamped one (job) iteration time after the start
    data = il0477_incident
    first = data.store.read_stage_latency(data.job, start_ms=truth.times_ms[0], end_ms=truth.times_ms[0])
    assert first["iteration"].unique().tolist() == [0] and len(first) == 12960
    assert truth.times_ms[0] == pytest.approx(data.start_ms + first["iteration_ms"].max(), abs=1)
    assert truth.times_ms[WINDOW[0]:WINDOW[-1] + 1] == cube.times.tolist()


def test_iteration_time_30s_before_and_over_90s_after(il0477):
    *_, cube, _ = il0477
    before, after = _before_after(cube)
    job = np.nanmax(cube.iteration_ms, axis=1)
    assert np.all((job[before] > 27_000) & (job[before] < 33_000)), job
    assert np.all(job[after] > 90_000), job


def test_mlp_of_the_slow_node_is_170_to_280ms_everyone_else_30_to_50(il0477):
    *_, cube, _ = il0477
    before, after = _before_after(cube)
    mlp = cube.stage("mlp")
    others = np.setdiff1d(np.arange(12960), SLOW)
    assert mlp[:, others].min() > 30 and mlp[:, others].max() < 50
    assert mlp[before][:, SLOW].max() < 50
    slow = mlp[after][:, SLOW]
    assert slow.min() > 170 and slow.max() < 280
    group = mlp[after][:, EP_GROUP]
    ratio = slow.mean(axis=1) / np.median(group, axis=1)
    assert np.all((ratio > 5.0) & (ratio < 6.5)), ratio
    cv = group.std(axis=1) / group.mean(axis=1)
    assert np.all(cv > 0.8), cv


def test_healthy_ep_peers_wait_in_dispatch_the_slow_ones_do_not(il0477):
    *_, cube, _ = il0477
    before, after = _before_after(cube)
    dispatch = cube.stage("dispatch")
    peers = np.setdiff1d(EP_GROUP, SLOW)
    assert len(peers) == 24
    for i in np.flatnonzero(after):
        d = dispatch[i]
        assert d[peers].min() > 3 * d[SLOW].max()
    assert dispatch[after][:, peers].mean() > 5 * dispatch[before][:, peers].mean()


def test_reduce_scatter_of_dp_256_287_is_shorter_at_every_pp_stage(il0477):
    scenario, *_, cube, _ = il0477
    topo = scenario.topology
    _, after = _before_after(cube)
    rs = cube.stage("reduce_scatter")
    late = (topo.dp_index >= 256) & (topo.dp_index <= 287)
    for i in np.flatnonzero(after):
        for s in range(topo.pp):
            at_stage = topo.pp_index == s
            assert rs[i, at_stage & late].max() < rs[i, at_stage & ~late].min(), (i, s)


def test_every_pp_stage_iteration_time_rises(il0477):
    scenario, *_, cube, _ = il0477
    topo = scenario.topology
    before, after = _before_after(cube)
    for s in range(topo.pp):
        at_stage = topo.pp_index == s
        b = np.median(cube.iteration_ms[before][:, at_stage])
        a = np.median(cube.iteration_ms[after][:, at_stage])
        assert a > 2.8 * b, (s, a, b)


def test_server_port_down_event_and_truth(il0477):
    scenario, truth, truth_path, _, cube, events = il0477
    assert len(events) == 1
    ev = events.iloc[0]
    assert ev["name"] == "server port down" and ev["node"] == 1294 and ev["rank"] == -1
    assert ev["severity"] == "critical" and ev["value"] == 1
    assert ev["time"] == _time(cube, ONSET + 1)
    back = Truth.read(truth_path)
    assert back == truth
    (f,) = back.faults
    assert f["ranks"] == SLOW.tolist() and f["nodes"] == [1294]
    assert (f["kind"], f["stage"], f["factor"], f["start"], f["end"]) == ("compute_slowdown", "mlp", 5.7, ONSET, None)
    assert f["start_time_ms"] == _time(cube, ONSET)
    assert back.events[0]["time_ms"] == _time(cube, ONSET + 1)
