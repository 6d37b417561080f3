"""A culprit inside an inner group is named, not its group; a slow node is one incident.

Three timing models that are not the analyzer's: a lockstep tensor-parallel job
(tests/lockstep_job.py: region timers that hold the TP all-reduce, every member reads as its
group's slowest), NCCL Inspector logs of a two-host job (tests/nccl_two_hosts.py, through
``rankscope import-nccl`` and ``analyze``), and the simulator with tp > 1 (its ``tp_comm`` stage).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from analyzer.diagnosis.node_culprits import complete_nodes, far_slower, rises, rose_with
from analyzer.job_analyzer import JobAnalyzer
from evaluation.accuracy import Case, run_case, score_case
from rankscope.frames import LatencyCube
from rankscope.topology import Topology
from tests.lockstep_job import STAGES, LockstepJob, cube
from tests.nccl_two_hosts import TwoHostJob, inspector_files


def _run(job: LockstepJob) -> tuple[list, dict[str, int]]:
    ja = JobAnalyzer("j", job.topology, STAGES)
    c, first = cube(job), {}
    for i in range(job.iterations):
        sub = LatencyCube(c.iterations[i:i + 1], c.times[i:i + 1], c.stages, c.values[i:i + 1],
                          c.iteration_ms[i:i + 1])
        for inc in ja.feed(sub).incidents:
            first.setdefault(inc.id, i)
    return ja.incidents(), first


@pytest.mark.parametrize("tp,dp,slow,factor", [(2, 8, 5, 2.0), (4, 8, 5, 1.5), (8, 4, 13, 2.0), (4, 16, 33, 3.0)])
def test_the_slow_member_of_a_lockstep_tp_group_is_named_alone(tp, dp, slow, factor):
    job = LockstepJob(tp=tp, dp=dp, slow=(slow,), factor=factor, seed=tp)
    incidents, first = _run(job)
    assert [(i.cls.value, i.ranks) for i in incidents] == [("compute_straggler", [slow])]
    inc = incidents[0]
    assert job.onset <= first[inc.id] <= job.onset + 3          # found within 3 iterations
    group = job.topology.members("tp")[job.topology.group_ids("tp")[slow]]
    waited = set(group.tolist()) - {slow}
    assert waited <= set(inc.waiting_ranks)                       # its TP mates only waited
    assert "waited for" in inc.evidence["summary"]
    truth = np.median(np.median(cube(job, faulty=False).iteration_ms[job.onset:], axis=1)) / 1000
    assert inc.impact.iteration_s_if_restored == pytest.approx(truth, rel=0.02)   # the what-if


def test_a_whole_slow_node_of_tp_groups_is_named_whole():
    job = LockstepJob(tp=8, dp=4, slow=tuple(range(8, 16)), factor=2.0, seed=4)
    incidents, _ = _run(job)
    assert [(i.cls.value, i.ranks) for i in incidents] == [("compute_straggler", list(range(8, 16)))]


@pytest.mark.parametrize("gpus,slow", [(4, 3), (8, 11)])
def test_nccl_logs_of_two_hosts_name_the_slow_gpu_not_its_host(tmp_path, gpus, slow):
    job = TwoHostJob(gpus=gpus, slow_rank=slow, factor=1.5, seed=1)
    inspector_files(job, tmp_path / "logs")
    cli = [sys.executable, "-m", "rankscope.cli"]
    db = str(tmp_path / "s.db")
    subprocess.run([*cli, "import-nccl", str(tmp_path / "logs"), "--job", "two", "--store", db],
                   check=True, capture_output=True)
    out = subprocess.run([*cli, "analyze", "--once", "--json", "--quiet", "--store", db],
                         check=True, capture_output=True, text=True)
    incs = json.loads(out.stdout)["incidents"]
    # collectives only: the GPU that arrives last at them, an arrival straggler
    assert [(i["class"], i["ranks"]) for i in incs] == [("arrival_straggler", [slow])], incs
    assert job.slow_from - 1 <= incs[0]["onset_iteration"] <= job.slow_from + 1
    assert incs[0]["hosts"] == [job.hosts[slow // gpus]]


def _sim_case(topology: dict, fault: dict, seed: int, iterations: int = 45) -> Case:
    return Case(seed, {"topology": topology, "run": {"job": f"ig-{seed}", "iterations": iterations, "seed": seed},
                       "fault": [fault]})


@pytest.mark.parametrize("rank,factor", [(37, 2.0), (90, 1.5)])
def test_the_simulator_with_tp_names_the_gpu_and_its_what_if(rank, factor):
    case = _sim_case({"tp": 2, "pp": 2, "dp": 32, "ep": 4, "gpus_per_node": 8},
                     {"kind": "compute_slowdown", "ranks": f"{rank}-{rank}", "factor": factor, "start": 20}, rank)
    score = score_case(run_case(case))
    (f,) = score.faults
    assert f.detected and f.class_ok and f.n_hit == f.n_true == f.n_reported == 1
    assert f.delay <= 4 and abs(f.what_if_error) < 0.03 and not score.false_incidents


@pytest.mark.parametrize("factor", [1.5, 3.0])
def test_a_slow_node_is_one_incident_naming_all_its_gpus(factor):
    case = _sim_case({"tp": 1, "pp": 2, "dp": 16, "ep": 8, "gpus_per_node": 8},
                     {"kind": "compute_slowdown", "node": 3, "factor": factor, "start": 20}, int(10 * factor))
    out = run_case(case)
    assert [(i.cls, i.ranks) for i in out.incidents] == [("compute_straggler", list(range(24, 32)))]


def test_node_completion_adds_risen_ranks_and_the_join_needs_a_like_rise():
    topo = Topology(dp=8, gpus_per_node=4)
    before, now = np.full((3, 8, 1), 10.0), np.full((3, 8, 1), 10.0)
    now[:, 4:] = 13.0
    now[:, 0] = 10.5                      # node 0: one rank barely risen, not a culprit's node
    assert complete_nodes(np.array([4, 5, 7]), now, before, 0, topo).tolist() == [4, 5, 6, 7]
    assert complete_nodes(np.array([4]), now, before, 0, topo).tolist() == [4]   # one rank: no node fault
    values = np.concatenate([before, now])
    its, at3 = np.arange(6), np.array([3, 3])
    values[3:, 6] = 80.0                  # rank 6 x8: rank 7 (x1.3) is not slow by its fault
    assert rose_with(np.array([5, 7]), at3, 0, np.array([6]), 0, 3, values, its).tolist() == [False, False]
    values[3:, 5] = 70.0
    assert rose_with(np.array([5, 7]), at3, 0, np.array([6]), 0, 3, values, its).tolist() == [True, False]
    # the other way round: an x8 rank is no GPU of the x1.3 fault of a rank it shares a node with
    assert rose_with(np.array([6]), at3[:1], 0, np.array([7]), 0, 3, values, its).tolist() == [False]


def test_a_rank_that_turned_slow_later_is_measured_from_its_own_onset():
    """Rank 2 x1.4 from iteration 5 (an incident); rank 3 x10 from iteration 15: since iteration 5
    its median is its healthy level's (x1.0-ish, like rank 2's x1.4), from its own onset x10."""
    values = np.full((20, 4, 1), 10.0)
    values[5:, 2] = 14.0
    values[15:, 3] = 100.0
    its = np.arange(20)
    assert rose_with(np.array([3]), np.array([15]), 0, np.array([2]), 0, 5, values, its).tolist() == [False]
    rise, theirs = rises(np.array([3]), np.array([15]), 0, np.array([2]), 0, 5, values, its)
    assert rise.tolist() == [10.0] and theirs == pytest.approx(1.4)
    assert far_slower(rise, theirs).tolist() == [True] and far_slower(rise, float("nan")).tolist() == [False]
    values[15:, 3] = 15.0                 # x1.5 from its onset: alike, the same node's fault
    assert rose_with(np.array([3]), np.array([15]), 0, np.array([2]), 0, 5, values, its).tolist() == [True]
