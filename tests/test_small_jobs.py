"""Small jobs (8 to a few hundred GPUs) with the collector shapes on: their sporadic stalls are
noise at every size, and a stall that costs the job or keeps coming back is still an incident.

A sporadic one-iteration 1.5-3x stall costs an 8-rank job 20-40% of that iteration (a 12,960-rank
job nothing: it waits for some rank's stall every iteration anyway): job_health data, not an
incident. Each job runs through the points as written (each rank's own clock, skewed hosts,
dropped points) into the embedded store and one analyzer cycle, as the service reads them.
"""

import numpy as np
import pytest

from analyzer.diagnosis.stall_cost import JobLevels
from analyzer.diagnosis.stall_repeats import wide_or_long
from evaluation.accuracy import shaped_store_run
from rankscope import schema

#: (tp, pp, dp, ep, gpus_per_node), seed: healthy jobs whose sporadic stalls each paged before
#: the cost and the chance tests meant the same at every size (0.016-0.26 stalls an iteration).
HEALTHY = {8: ((1, 1, 8, 8, 8), 3), 32: ((1, 4, 8, 4, 8), 1), 128: ((2, 2, 32, 8, 8), 2)}
SMALL = {"tp": 1, "pp": 2, "dp": 16, "ep": 4, "gpus_per_node": 8}   # 32 ranks, 4 nodes


def _topo(t: tuple[int, ...]) -> dict[str, int]:
    return dict(zip(("tp", "pp", "dp", "ep", "gpus_per_node"), t, strict=True))


def _stall(rank: int, factor: float, start: int, **more) -> dict:
    return {"kind": "transient_stall", "ranks": str(rank), "stage": "attention", "factor": factor,
            "start": start, "end": start + 1, **more}


@pytest.mark.parametrize("size", sorted(HEALTHY))
def test_a_healthy_small_job_stalls_sporadically_and_pages_nobody(embedded_store, size):
    topo, seed = HEALTHY[size]
    sc, incidents = shaped_store_run(embedded_store, _topo(topo), [], iterations=120, seed=seed, job=f"h{size}")
    assert sc.topology.world == size
    assert incidents == []
    health = embedded_store.read(schema.JOB_HEALTH, f"h{size}").iloc[-1]
    assert health["sporadic_stalls"] >= 1                       # it did stall: counted as noise
    assert "noise, no incident" in health["sporadic_text"]


def test_a_one_off_cheap_stall_is_noise_a_costly_one_an_incident(embedded_store):
    faults = [_stall(5, 2.5, 30), _stall(21, 8.0, 50)]
    _, incidents = shaped_store_run(embedded_store, SMALL, faults, iterations=60, seed=4, job="once")
    assert [(i["class"], i["ranks"], i["onset_iteration"]) for i in incidents] == [("transient_stall", [21], 50)]
    assert incidents[0]["status"] == "resolved"


def test_a_cheap_stall_that_keeps_coming_back_is_an_incident(embedded_store):
    # 2.5x on one GPU every 6 iterations: each costs the job about a quarter of an iteration
    faults = [_stall(5, 2.5, 24, every=6, repeats=5)]
    _, incidents = shaped_store_run(embedded_store, SMALL, faults, iterations=60, seed=4, job="again")
    assert {(i["class"], tuple(i["ranks"])) for i in incidents} == {("transient_stall", (5,))}
    assert min(i["onset_iteration"] for i in incidents) in (42, 48)   # the 4th or 5th stall


def test_a_stall_s_cost_is_a_share_of_the_job_s_own_iteration_charged_once():
    lv = JobLevels(40)
    rng = np.random.default_rng(1)
    for it in range(20):
        lv.push(it, 1000.0 * (1 + 0.02 * rng.standard_normal()))
    lv.push(20, 1600.0)                      # a stall: 0.6 of an iteration
    lv.push(21, 1010.0)
    assert lv.cost(20, 21, 8, world=8)[0] == pytest.approx(0.6, abs=0.05)
    lv.charge(21)
    assert lv.cost(20, 22, 8, world=8) == (0.0, 0.0)   # the same iteration, charged already


def test_the_chance_tests_ask_the_same_of_every_size():
    # two neighbours stalling together: news in a job that never stalls, chance at 12,960 ranks
    assert wide_or_long(2, 1, 0.0, 16, 8, 0.01)
    assert not wide_or_long(2, 1, 0.002, 16, 12_960, 0.01)
    assert wide_or_long(5, 1, 0.002, 16, 12_960, 0.01)
    # one GPU out for iterations in a row: 3 in a row is news at 8 ranks, not at 12,960
    assert not wide_or_long(1, 2, 0.002, 16, 8, 0.01)
    assert wide_or_long(1, 3, 0.002, 16, 8, 0.01)
    assert not wide_or_long(1, 3, 0.002, 16, 12_960, 0.01)


def test_a_stall_of_half_the_job_at_once_is_found(embedded_store):
    # one node of a 2-node job stalls 14x for 2 iterations: half of every group is out, so the
    # stage's sigma across ranks is the gap between the halves; its recent past is not
    topo = {"tp": 1, "pp": 1, "dp": 16, "ep": 8, "gpus_per_node": 8}    # 16 ranks, 2 nodes
    fault = {**_stall(0, 14.0, 40), "ranks": "8-15", "end": 42}
    _, incidents = shaped_store_run(embedded_store, topo, [fault], iterations=60, seed=4, job="half")
    assert [(i["class"], i["ranks"], i["onset_iteration"]) for i in incidents] == [
        ("transient_stall", list(range(8, 16)), 40)]


@pytest.mark.parametrize(("factor", "tp"), [(14.0, 1), (3.0, 1), (3.0, 2)])
def test_a_stall_of_a_whole_pp_stage_is_found_and_leaves_no_imbalance_behind(embedded_store, factor, tp):
    # pp=2 on 2 nodes: the stall is a whole PP stage, its DP group out at once, so no rank stands
    # out in it; the other stage shows it. The stages are compared with their midpoint, so the
    # other stage dips as far: had it learned the dip, it would have seemed slower than it was
    # from the stall's end on (an imbalance on the healthy stage, never closed)
    # (with tp=2 the stage is 2 DP groups: one stall, not two)
    topo = {"tp": tp, "pp": 2, "dp": 8 // tp, "ep": 4 // tp, "gpus_per_node": 8}
    fault = {**_stall(0, factor, 40), "ranks": "8-15", "end": 42}
    _, incidents = shaped_store_run(embedded_store, topo, [fault], iterations=60, seed=4, job="ppstall")
    assert [(i["class"], i["ranks"], i["onset_iteration"], i["status"]) for i in incidents] == [
        ("transient_stall", list(range(8, 16)), 40, "resolved")]
    assert incidents[0]["ratio"] == pytest.approx(factor, rel=0.15)
    assert "pipeline stage pp=1" in incidents[0]["evidence"]["summary"]
