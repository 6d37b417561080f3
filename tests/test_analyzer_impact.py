"""What an incident costs: GPU-hours lost growing with the iterations, and the what-if."""

import numpy as np
import pytest

from analyzer.job_analyzer import JobAnalyzer
from evaluation.accuracy import result_cube
from rankscope.schema import DEFAULT_STAGES
from simulator.cluster import ClusterSimulator
from simulator.scenario import load_scenario


@pytest.mark.slow
def test_il0477_gpu_hours_match_world_times_excess_and_the_what_if_the_healthy_level():
    sc = load_scenario("il-0477").with_overrides(iterations=45)
    sim = ClusterSimulator(sc)
    ja = JobAnalyzer(sc.job, sc.topology, DEFAULT_STAGES)
    job_s, hours = [], []
    for _ in range(sc.iterations):
        res = sim.step()
        job_s.append(float(np.median(res.iteration_ms)) / 1000)
        for inc in ja.feed(result_cube(res, sim.stages.names)).incidents:
            if inc.id == "cs-30-r10352":
                hours.append(inc.impact.gpu_hours_lost)
    job_s = np.array(job_s)
    healthy = float(np.median(job_s[10:30]))
    measured = sc.topology.world * float(np.sum(job_s[30:] - healthy)) / 3600   # world x excess
    (inc,) = [i for i in ja.incidents() if i.id == "cs-30-r10352"]
    imp = inc.impact
    assert len(hours) >= 10 and all(b > a for a, b in zip(hours, hours[1:], strict=False))  # grows
    assert imp.gpu_hours_lost == pytest.approx(measured, rel=0.05)
    assert imp.iteration_s_before == pytest.approx(healthy, rel=0.02)
    assert imp.slowdown > 2.5
    assert imp.iteration_s_if_restored == pytest.approx(healthy, rel=0.10)
    assert "GPU-hours lost so far" in inc.text


def test_a_transient_stall_costs_only_its_own_iterations():
    sc = load_scenario("transient-stall").with_overrides(iterations=40)
    sim = ClusterSimulator(sc)
    ja = JobAnalyzer(sc.job, sc.topology, DEFAULT_STAGES)
    job_s = []
    for _ in range(sc.iterations):
        res = sim.step()
        job_s.append(float(np.median(res.iteration_ms)) / 1000)
        ja.feed(result_cube(res, sim.stages.names))
    (inc,) = [i for i in ja.incidents() if i.cls == "transient_stall"]
    job_s = np.array(job_s)
    before = float(np.median(job_s[max(0, inc.onset_iteration - 20):inc.onset_iteration]))
    span = job_s[inc.onset_iteration:inc.resolved_iteration]
    expected = sc.topology.world * float(np.sum(span - before)) / 3600
    assert inc.impact.gpu_hours_lost == pytest.approx(max(expected, 0.0), rel=0.05, abs=1e-6)
