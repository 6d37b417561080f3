"""L3's verdicts at their edges: which stalls a launch gap explains, when a collective is a link,
and a kernel only a few ranks of a large group ran."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.diagnosis.host_gaps import explain_stalls
from analyzer.score.kernel_distance import kernel_distances
from analyzer.score.kernel_scores import kernel_findings
from collector.kernel_channel import KernelChannel
from rankscope.incident import Incident, IncidentClass
from rankscope.kernel_names import kernel_id
from rankscope.topology import Topology


def _stall(onset: int = 40, ranks=range(8, 16), excess_ms: float = 2000.0) -> Incident:
    inc = Incident(id=f"ts-{onset}", job="j", cls=IncidentClass.TRANSIENT_STALL, ranks=list(ranks), nodes=[1],
                   onset_iteration=onset, onset_ms=0, stage="attention", ratio=20.0, group_type="dp",
                   group_ranks=list(range(32)))
    inc.evidence = {"summary": "stall", "culprit_ms": 100.0 + excess_ms, "group_median_ms": 100.0}
    return inc


def _gaps(ranks, step: int, gap_ms: float, steps: int = 2) -> pd.DataFrame:
    return pd.DataFrame({"rank": list(ranks), "step": step, "steps": steps, "w1_us": gap_ms * 1000.0})


def test_a_launch_gap_explains_only_a_stall_it_covers_in_size_ranks_and_steps():
    assert [i.id for i in explain_stalls([_stall()], _gaps(range(8, 16), 41, 1500.0))] == ["ts-40"]
    assert explain_stalls([_stall()], _gaps(range(8, 16), 41, 60.0)) == []        # far shorter than the stall
    assert explain_stalls([_stall()], _gaps(range(8, 16), 39, 1500.0)) == []      # the window 38-39: before it
    assert explain_stalls([_stall()], _gaps([8], 41, 1500.0)) == []               # one rank of eight
    assert explain_stalls([_stall()], _gaps(range(16, 24), 41, 1500.0)) == []     # other ranks
    # after a restart the window's step, not the framework's iteration, is what matches
    assert explain_stalls([_stall(onset=140)], _gaps(range(8, 16), 41, 1500.0)) == []
    inc = _stall(onset=140)
    assert explain_stalls([inc], _gaps(range(8, 16), 141, 1500.0)) == [inc] and inc.host_side
    assert explain_stalls([inc], _gaps(range(8, 16), 141, 1500.0)) == []          # once: the text does not grow
    assert inc.evidence["summary"].count("ran no kernel") == 1


def _window(topo: Topology, slow: dict[int, float], missing=(), kind_group=None) -> pd.DataFrame:
    rng = np.random.default_rng(5)
    rows = []
    for r in range(topo.world):
        if r in missing:
            continue
        us = 300.0 * slow.get(r, 1.0)
        ev = [("nccl:dispatch", float(d)) for d in rng.lognormal(np.log(us), 0.02, 40)]
        rows.append(KernelChannel({"job": "j", "rank": r}).window(9, 1_000, ev)[0])
    return pd.DataFrame(rows)


def test_a_collective_is_a_link_only_with_its_whole_group_seen_and_slow_evenly():
    topo = Topology(tp=1, pp=1, dp=32, ep=8, gpus_per_node=8)
    names = {kernel_id("nccl:dispatch"): ("nccl:dispatch", "comm", "ep")}
    link = kernel_findings(_window(topo, dict.fromkeys(range(8, 16), 3.0)), names, topo)
    assert set(link["rank"]) == set(range(8, 16)) and set(link["cause"]) == {"link"}
    # a straggler of the group waits least: the others are slow unevenly, they waited
    uneven = {**dict.fromkeys(range(8, 15), 3.0), 15: 1.2}
    assert set(kernel_findings(_window(topo, uneven), names, topo)["cause"]) == {"wait"}
    # six of the eight have no data of it (late points, or out of their top kernels): not a link
    few = kernel_findings(_window(topo, {8: 3.0, 9: 3.0}, missing=range(10, 16)), names, topo)
    assert set(few["rank"]) == {8, 9} and set(few["cause"]) == {"wait"}


def test_a_kernel_only_a_few_ranks_of_a_large_group_ran_keeps_its_own_reference():
    r, ranks_that_ran = 1440, [3, 700, 1100, 1400]
    count, p50, p99 = (np.full((r, 1), np.nan) for _ in range(3))
    count[ranks_that_ran], p50[ranks_that_ran] = 100.0, 100.0
    p50[1100] = 300.0
    p99[ranks_that_ran] = p50[ranks_that_ran] * 1.1
    d = kernel_distances(count, p50, p99, np.arange(r).reshape(1, r), np.zeros(r, dtype=int))
    assert np.flatnonzero(d.outlier).tolist() == [1100]
