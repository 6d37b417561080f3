"""Data as real collectors write it: each rank stamps its own clock, host clocks drift by
seconds, the writer drops points, ranks stall sporadically, GPUs differ and MoE routing
loads experts unevenly. A healthy job gives no incident; a one-node straggler is exactly its
8 ranks; a silent rank is still found; a large one-iteration stall on 8 ranks is still an
incident; the job's health counts the dropped points and the stalls. At full scale (12,960
ranks), one run per backend: the healthy job on the embedded store, the faults on the real
InfluxDB. The same checks at 4,608 ranks on both stores are in the accuracy suite
(``evaluation.accuracy.SHAPED_STORE_RUNS``, ``make bench-accuracy``).
"""

import uuid

import numpy as np
import pandas as pd
import pytest

from analyzer.read.iteration_assembler import IterationAssembler
from evaluation.accuracy import shaped_health_holds, shaped_store_run
from rankscope import schema
from rankscope.store import EmbeddedStore, InfluxStore

TOPO_12960 = {"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8}
#: IL-0477's straggler, a 40x one-iteration stall on node 100 and a rank that goes silent.
FAULTS_12960 = [
    {"kind": "compute_slowdown", "node": 1294, "stage": "mlp", "factor": 5.7, "start": 30},
    {"kind": "transient_stall", "node": 100, "stage": "attention", "factor": 40.0, "start": 20, "end": 21},
    {"kind": "silent_rank", "ranks": 3000, "start": 30},
]


@pytest.fixture(scope="module")
def healthy_12960_embedded(tmp_path_factory):
    """(incidents, job_health) of a healthy 12,960-rank job with the shapes, on the embedded store."""
    store = EmbeddedStore(tmp_path_factory.mktemp("shapes") / "store.db")
    try:
        _, incidents = shaped_store_run(store, TOPO_12960, [], iterations=45)
        yield incidents, store.read(schema.JOB_HEALTH, "shaped")
    finally:
        store.close()


@pytest.fixture(scope="module")
def faults_12960_influx(influx_url):
    """(incidents, job_health) of the 12,960-rank job with :data:`FAULTS_12960` and the shapes,
    on the real InfluxDB."""
    store = InfluxStore(influx_url, bucket=f"test_shapes_{uuid.uuid4().hex[:10]}", api="v1")
    try:
        _, incidents = shaped_store_run(store, TOPO_12960, FAULTS_12960, iterations=45)
        yield incidents, store.read(schema.JOB_HEALTH, "shaped")
    finally:
        try:
            store.drop_database()
        finally:
            store.close()


def test_the_points_carry_the_shapes(embedded_store):
    sc, _ = shaped_store_run(embedded_store, {"tp": 1, "pp": 2, "dp": 64, "ep": 8, "gpus_per_node": 8}, [],
                             iterations=20)
    df = embedded_store.read_stage_latency("shaped")
    per_it = df.groupby(schema.ITERATION_FIELD)
    assert per_it["time"].nunique().min() > 20          # each rank its own clock
    spread = per_it["time"].agg(lambda t: t.max() - t.min())
    assert spread.max() > 500                            # hosts apart by up to 2 s
    assert len(df) < 20 * sc.topology.world               # points dropped
    assert len(df) > 0.95 * 20 * sc.topology.world


def test_12960_ranks_healthy_embedded_no_incident(healthy_12960_embedded):
    incidents, _ = healthy_12960_embedded
    assert incidents == []


@pytest.mark.parametrize("run", ["healthy_12960_embedded", "faults_12960_influx"])
def test_the_job_health_counts_the_dropped_points_and_the_stalls_as_noise(request, run):
    _, health = request.getfixturevalue(run)
    last = health.iloc[-1]
    assert 0.985 < last["completeness"] < 0.995          # 1% dropped, counted, no incident
    assert last["sporadic_stalls"] > 50                  # the stalls were seen, as noise
    assert "noise, no incident" in last["sporadic_text"]
    assert shaped_health_holds(health)                   # what the accuracy suite checks


def test_12960_ranks_straggler_a_big_one_iteration_stall_and_a_silent_rank_on_the_real_influxdb(
        faults_12960_influx):
    """IL-0477's shape under every collector shape at once, plus a 40x one-iteration stall and a
    rank that goes silent: exactly three incidents, each exactly its ranks."""
    incidents, _ = faults_12960_influx
    got = sorted((i["class"], i["ranks"]) for i in incidents)
    assert got == [("compute_straggler", list(range(10352, 10360))),        # exactly node 1294's 8 ranks
                   ("silent_rank", [3000]),
                   ("transient_stall", list(range(800, 808)))]


def test_assembler_waits_for_skewed_hosts_and_counts_late_points():
    asm = IterationAssembler(wait_ms=5_000)
    a = pd.DataFrame({"time": [1000, 1010, 2900], "rank": [0, 1, 2], schema.ITERATION_FIELD: [1, 1, 1]})
    asm.add(a.iloc[:2])
    assert not len(asm.ready(expected=3))                # rank 2's host is 2 s ahead: not yet read
    asm.add(a.iloc[2:])
    assert asm.ready(expected=3)[schema.ITERATION_FIELD].tolist() == [1, 1, 1]
    asm.add(a)                                           # read again (reads overlap): not late
    assert asm.counts.late_rows == 0 and asm.pending_iterations() == []
    late = pd.DataFrame({"time": [1005], "rank": [3], schema.ITERATION_FIELD: [1]})   # too late
    asm.add(late)
    asm.add(late)
    assert asm.counts.late_rows == 1 and asm.pending_iterations() == []
    # an incomplete iteration goes on once the data is past it by the wait, in order
    b = pd.DataFrame({"time": [40_000, 40_010, 70_000], "rank": [0, 1, 0], schema.ITERATION_FIELD: [2, 2, 3]})
    asm.add(b)
    assert asm.ready(expected=3)[schema.ITERATION_FIELD].tolist() == [2, 2]
    assert asm.counts.short_iterations == 1
    assert asm.ready(expected=3, now_ms=71_000).empty     # iteration 3: 1 s old, still waited for
    assert asm.ready(expected=3, now_ms=76_000)[schema.ITERATION_FIELD].tolist() == [3]
    assert np.array_equal(asm.pending_iterations(), [])


def test_the_first_read_holding_only_hosts_behind_does_not_lock_the_others_out():
    # a live reader's first read: only the hosts whose clocks run behind have stamped
    # iteration 0 by its time; the job's size is not known yet
    asm = IterationAssembler(wait_ms=15_000)
    it0 = pd.DataFrame({"time": [1000] * 4 + [1900] * 4, "rank": range(8), schema.ITERATION_FIELD: [0] * 8})
    asm.add(it0.iloc[:4])
    assert not len(asm.ready(expected=None, now_ms=1500))     # waits, not "complete with 4"
    asm.add(it0.iloc[4:])
    it1 = pd.DataFrame({"time": [31_000] * 4 + [31_900] * 4, "rank": range(8), schema.ITERATION_FIELD: [1] * 8})
    asm.add(it1.iloc[:4])
    first = asm.ready(expected=None, now_ms=31_500)            # the data moved 30 s past it
    assert first[schema.ITERATION_FIELD].tolist() == [0] * 8
    # the caller's count of ranks may lag: every rank the assembler ever saw is expected
    assert not len(asm.ready(expected=4, now_ms=31_500))       # iteration 1 lacks ranks 4-7
    asm.add(it1.iloc[4:])
    assert len(asm.ready(expected=4, now_ms=32_000)) == 8 and asm.counts.late_rows == 0


def test_a_dropped_point_that_set_a_floor_does_not_raise_it():
    # the rank that sends least in its pipeline sets the p2p floor; its point dropped, the
    # floor is not the others' (1% of points dropped made many groups "rise" every iteration)
    from analyzer.score.transfer_floors import TransferFloorScorer
    from rankscope.schema import DEFAULT_STAGES
    from rankscope.topology import Topology

    topo = Topology(tp=1, pp=4, dp=4, ep=1, gpus_per_node=4)
    send = DEFAULT_STAGES.index("pp_send")
    f = TransferFloorScorer(topo, DEFAULT_STAGES)
    v = np.full((topo.world, len(DEFAULT_STAGES)), 5.0)
    v[topo.pp_index == 3, send] = 0.5                          # the last stage sends least
    for _ in range(8):
        f.update(v)
    dropped = v.copy()
    dropped[topo.pp_index == 3] = np.nan                       # the last stage's points dropped
    scores = f.update(dropped)
    assert not scores.risen[scores.stage.index("pp_send")].any()
