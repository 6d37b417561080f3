"""What the analyzer must and must not see, at 12,960 ranks (simulated in memory, fed straight in)."""

import numpy as np

from analyzer.job_analyzer import JobAnalyzer
from rankscope.frames import frame_to_cube
from rankscope.schema import DEFAULT_STAGES
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario

IL_TOPOLOGY = {"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8}


def _run(scenario: Scenario):
    sim = ClusterSimulator(scenario)
    ja = JobAnalyzer(scenario.job, scenario.topology, DEFAULT_STAGES)
    steps, found = [], {}
    for _ in range(scenario.iterations):
        res = sim.step()
        out = ja.feed(frame_to_cube(sim.frame(res), scenario.topology.world, DEFAULT_STAGES.names))
        steps += [c for c in out.changepoints if c.kind == "step"]
        for inc in out.incidents:
            found.setdefault(inc.id, (res.iteration, inc))
    return ja, steps, found


def test_healthy_300_iterations_no_incident_no_step():
    sc = Scenario.from_dict({"topology": IL_TOPOLOGY, "run": {"job": "healthy", "iterations": 300, "seed": 11}})
    ja, steps, found = _run(sc)
    assert ja.last_iteration == 299
    assert steps == []
    assert found == {}


def test_single_gpu_slowed_by_1_3x_found_within_ten_iterations():
    rank = 7777
    sc = Scenario.from_dict({
        "topology": IL_TOPOLOGY, "run": {"job": "one-gpu", "iterations": 45, "seed": 3},
        "fault": [{"kind": "compute_slowdown", "ranks": str(rank), "stage": "mlp", "factor": 1.3, "start": 25}],
    })
    _, _, found = _run(sc)
    assert len(found) == 1
    seen_at, inc = next(iter(found.values()))
    assert inc.cls == "compute_straggler" and inc.ranks == [rank] and inc.stage == "mlp"
    assert seen_at - 25 <= 10
    assert abs(inc.ratio - 1.3) < 0.1


def test_always_slow_gpu_is_not_a_new_straggler_but_a_new_slowdown_is():
    # rank 100 is 8% slow from the start (a weak GPU): not news. rank 5000 becomes 25% slower.
    sc = Scenario.from_dict({
        "topology": {"tp": 1, "pp": 4, "dp": 512, "ep": 16, "gpus_per_node": 8},
        "run": {"job": "weak", "iterations": 40, "seed": 5},
        "fault": [{"kind": "compute_slowdown", "ranks": "100", "stage": "mlp", "factor": 1.08, "start": 0},
                  {"kind": "compute_slowdown", "ranks": "1500", "stage": "mlp", "factor": 1.25, "start": 20}],
    })
    _, _, found = _run(sc)
    assert [(inc.cls, inc.ranks) for _, inc in found.values()] == [("compute_straggler", [1500])]
    assert np.isfinite(next(iter(found.values()))[1].ratio)
