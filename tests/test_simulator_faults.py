"""Each fault kind travels the way the model promises, checked on data stored in the real InfluxDB.

Job: TP=1, PP=4, DP=64, EP=16 (256 ranks, 32 nodes). EP group = 16 consecutive dp
indices of one pipeline stage; rank = pp * 64 + dp.
"""

import numpy as np
import pytest

from rankscope.frames import frame_to_cube
from rankscope.schema import DEFAULT_STAGES
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario
from simulator.simulate import simulate

T0 = 1_760_000_000_000
TOPO = {"tp": 1, "pp": 4, "dp": 64, "ep": 16, "gpus_per_node": 8}


def run(store, faults, iterations=8, seed=1, job="t"):
    sc = Scenario.from_dict({"topology": TOPO, "run": {"job": job, "iterations": iterations, "seed": seed},
                             "fault": faults})
    truth = simulate(sc, store, start_ms=T0, progress=False)
    df = store.read_stage_latency(job)
    return sc, truth, df, frame_to_cube(df, sc.topology.world, DEFAULT_STAGES.names)


def ep_peers(sc, culprits):
    topo = sc.topology
    gid = topo.group_ids("ep")
    return np.setdiff1d(np.flatnonzero(np.isin(gid, gid[culprits])), culprits)


def chunk_of(sc, ranks):
    topo = sc.topology
    return np.isin(topo.dp_index // topo.ep, np.unique(topo.dp_index[ranks] // topo.ep))


def test_compute_slowdown_peers_wait_culprit_is_short(influx_store):
    sc, truth, _, cube = run(influx_store, [{"kind": "compute_slowdown", "ranks": 77, "factor": 3.0, "start": 4}])
    topo = sc.topology
    c = np.array([77])
    peers = ep_peers(sc, c)
    assert len(peers) == 15
    v = cube.stage
    b, a = cube.iterations < 4, cube.iterations >= 4
    for stage in ("attention", "mlp", "optimizer"):  # no stage given: all compute is slow
        assert v(stage)[a][:, 77].min() > 2.5 * np.median(v(stage)[a])
    for stage in ("dispatch", "combine"):
        assert v(stage)[a][:, peers].min(axis=1).min() > 3 * v(stage)[a][:, 77].max()
        assert v(stage)[a][:, peers].mean() > 3 * v(stage)[b][:, peers].mean()
    # the culprit's whole chunk arrives late at the DP sync: short reduce_scatter at every stage
    late = chunk_of(sc, c)
    rs = v("reduce_scatter")
    for i in np.flatnonzero(a):
        for s in range(topo.pp):
            st = topo.pp_index == s
            assert rs[i, st & late].max() < rs[i, st & ~late].min()
    # its slow optimizer step makes the rest of its DP group (pp=1) wait in all_gather
    dp1 = np.setdiff1d(np.flatnonzero(topo.pp_index == 1), c)
    assert v("all_gather")[a][:, dp1].min() > v("all_gather")[a][:, 77].max()
    job = np.nanmax(cube.iteration_ms, axis=1)
    assert job[a].min() > 1.5 * job[b].max()
    assert truth.faults[0]["ranks"] == [77] and truth.faults[0]["nodes"] == [9]


def test_link_degradation_raises_the_groups_pure_transfer_time(influx_store):
    sc, _, _, cube = run(influx_store, [{"kind": "link_degradation", "node": 9, "factor": 8.0, "start": 4}])
    topo = sc.topology
    c = np.arange(72, 80)  # pp=1, dp 8-15: half of EP group pp=1/dp 0-15
    peers = ep_peers(sc, c)
    assert len(peers) == 8
    v = cube.stage
    b, a = cube.iterations < 4, cube.iterations >= 4
    # nobody computes slower
    assert v("mlp")[:, c].max() < 50 and v("attention")[a][:, c].mean() < 1.1 * v("attention")[b][:, c].mean()
    group = np.r_[c, peers]
    others = np.setdiff1d(np.flatnonzero(topo.pp_index == 1), group)
    for stage in ("dispatch", "combine"):
        # the group's minimum (its pure transfer time) rises, for the culprits too: not short like a straggler
        assert v(stage)[a][:, group].min() > 3 * v(stage)[b][:, group].max()
        assert v(stage)[a][:, group].min() > 3 * v(stage)[a][:, others].max()
    # the DP ring of stage 1 runs at the speed of its slowest link: its floor rises, other stages' does not
    ag = v("all_gather")
    st1 = topo.pp_index == 1
    assert ag[a][:, st1].min() > 3 * ag[b][:, st1].max()
    assert ag[a][:, ~st1].min() < 1.5 * ag[b][:, ~st1].max()
    # the culprits' pipeline hops are slow too (their neighbours then wait in p2p bubbles as well)
    hop = v("pp_send") + v("pp_recv")
    assert hop[a][:, c].min() > 3 * hop[b][:, c].max()
    job = np.nanmax(cube.iteration_ms, axis=1)
    assert job[a].min() > 1.5 * job[b].max()


def test_stage_imbalance_bubbles_upstream_send_downstream_recv(influx_store):
    sc, truth, _, cube = run(influx_store, [{"kind": "stage_imbalance", "pp": 2, "factor": 1.6, "start": 4}])
    topo = sc.topology
    v = cube.stage
    b, a = cube.iterations < 4, cube.iterations >= 4
    pp = topo.pp_index
    for stage in ("attention", "mlp"):
        assert v(stage)[a][:, pp == 2].mean() > 1.5 * v(stage)[a][:, pp != 2].mean()
    send, recv = v("pp_send"), v("pp_recv")
    for s in (0, 1):  # upstream: back-pressure from the slow stage
        assert send[a][:, pp == s].min() > 4 * send[b][:, pp == s].max()
    assert recv[a][:, pp == 3].min() > 2 * recv[b][:, pp == 3].max()  # downstream: starved
    # the slow stage itself is the one that never waits on its neighbours
    p2p = send + recv
    for s in (0, 1, 3):
        assert p2p[a][:, pp == 2].max() < p2p[a][:, pp == s].min()
    assert truth.faults[0]["ranks"] == list(range(128, 192))


def test_transient_stall_is_over_after_its_end(influx_store):
    sc, _, _, cube = run(influx_store, [{"kind": "transient_stall", "ranks": "150-151", "factor": 20.0,
                                         "start": 3, "end": 5}], iterations=8)
    v = cube.stage
    it = cube.iterations
    during = (it >= 3) & (it < 5)
    before, after = it < 3, it >= 5
    c = np.array([150, 151])
    peers = ep_peers(sc, c)
    assert v("attention")[during][:, c].min() > 10 * np.median(v("attention"))
    assert v("attention")[after][:, c].max() < 20
    job = np.nanmax(cube.iteration_ms, axis=1)
    assert job[during].min() > 3 * job[before].max()
    assert job[after].max() < 1.05 * job[before].max()
    for stage in ("dispatch", "combine"):
        assert v(stage)[during][:, peers].min() > 5 * v(stage)[during][:, c].max()
        assert v(stage)[after][:, peers].mean() < 1.5 * v(stage)[before][:, peers].mean()


def test_host_stall_delays_its_chunk_peers_wait_in_dispatch(influx_store):
    sc, _, _, cube = run(influx_store, [{"kind": "host_stall", "node": 20, "factor": 40.0, "start": 3, "end": 6}])
    topo = sc.topology
    v = cube.stage
    it = cube.iterations
    during, before = (it >= 3) & (it < 6), it < 3
    c = np.arange(160, 168)  # pp=2, dp 32-39
    peers = ep_peers(sc, c)
    load = v("dataloader")
    assert load[during][:, c].min() > 20 * np.median(load)
    others = np.setdiff1d(np.arange(topo.world), c)
    assert load[:, others].max() < 4 * np.median(load)
    assert v("dispatch")[during][:, peers].min() > 2 * v("dispatch")[before][:, peers].max()
    assert v("dispatch")[during][:, peers].min() > 1.5 * v("dispatch")[during][:, c].max()
    assert np.abs(v("mlp")[during][:, c] / 40 - 1).max() < 0.2  # compute is untouched
    late = chunk_of(sc, c)
    rs = v("reduce_scatter")
    for i in np.flatnonzero(during):
        for s in range(topo.pp):
            st = topo.pp_index == s
            assert rs[i, st & late].max() < rs[i, st & ~late].min()


def test_silent_rank_stops_reporting_and_changes_nobody_else(influx_store):
    sc, truth, df, cube = run(influx_store, [{"kind": "silent_rank", "ranks": 100, "start": 3}])
    counts = df.groupby("iteration")["rank"].nunique()
    assert counts.loc[[0, 1, 2]].tolist() == [256] * 3
    assert counts.loc[list(range(3, 8))].tolist() == [255] * 5
    assert not ((df["rank"] == 100) & (df["iteration"] >= 3)).any()
    assert np.isnan(cube.values[3:, 100]).all() and not np.isnan(cube.values[:3, 100]).any()
    # the others see exactly what a fault-free run with the same seed produces (a crash-like silence)
    healthy = ClusterSimulator(Scenario.from_dict({"topology": TOPO, "run": {"iterations": 8, "seed": 1}}))
    others = np.setdiff1d(np.arange(256), [100])
    for i in range(8):
        res = healthy.step()
        assert np.allclose(cube.values[i][others], res.values[others], atol=6e-4)
    assert truth.faults[0]["kind"] == "silent_rank" and truth.faults[0]["end"] is None


@pytest.mark.parametrize("kind,extra", [("compute_slowdown", {"stage": "mlp"}), ("host_stall", {})])
def test_overlapping_faults_compound(kind, extra):
    """Two faults on the same ranks multiply; the model accepts overlaps."""
    one = {"kind": kind, "ranks": 77, "factor": 2.0, "start": 0, **extra}
    sc1 = Scenario.from_dict({"topology": TOPO, "run": {"iterations": 1}, "fault": [one]})
    sc2 = Scenario.from_dict({"topology": TOPO, "run": {"iterations": 1}, "fault": [one, one]})
    stage = extra.get("stage", "dataloader")
    k = DEFAULT_STAGES.index(stage)
    v1 = ClusterSimulator(sc1).step().values[77, k]
    v2 = ClusterSimulator(sc2).step().values[77, k]
    assert v2 == pytest.approx(2 * v1)
