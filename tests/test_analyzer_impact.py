"""What an incident costs: GPU-hours lost growing with the iterations, and the what-if."""

import numpy as np
import pytest

from analyzer.job_analyzer import JobAnalyzer
from analyzer.score.what_if import Footing, footing, restored_s
from evaluation.accuracy import result_cube
from rankscope.incident import Impact, Incident, IncidentClass
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


def test_the_what_if_moves_the_level_before_by_the_non_culprits_own_work():
    values = np.full((4, 6, len(DEFAULT_STAGES)), 10.0)
    values[:, 2] *= 5.0                                              # the culprit's own time: not counted
    then = footing(values, [2], DEFAULT_STAGES)
    assert then.own_ms == 40.0 and then.comm_ms == 70.0              # 4 compute/host, 7 comm stages
    drifted = footing(values * 1.2, [2], DEFAULT_STAGES)
    assert restored_s(30.0, 90.0, then, drifted) == pytest.approx(36.0)      # their own work 1.2x
    assert restored_s(30.0, 33.0, then, Footing(own_ms=80.0)) == 33.0        # never above now
    assert restored_s(30.0, 90.0, Footing(), Footing()) == 30.0              # nothing known: the level before
    # collectives alone: the job's time now less the rise of the non-culprits' collectives (ms)
    assert restored_s(0.25, 0.75, Footing(comm_ms=20.0), Footing(comm_ms=510.0)) == pytest.approx(0.26)


def test_the_cost_reads_sub_second_iterations_and_large_jobs_alike():
    def cost(before: float, now: float, restored: float, hours: float) -> str:
        inc = Incident(id="as-20-r11", job="j", cls=IncidentClass.ARRIVAL_STRAGGLER, ranks=[11], nodes=[1],
                       stage="reduce_scatter", ratio=3.0, group_type="dp", group_ranks=[], onset_iteration=20,
                       onset_ms=0, impact=Impact(before, now, now / before, hours, restored))
        return inc.cost

    assert cost(0.25, 0.75, 0.251, 0.044) == ("Cost: 0.044 GPU-hours lost so far (iteration 0.25 s -> 0.75 s, "
                                              "x3.00); about 0.251 s per iteration with the culprits restored.")
    assert cost(30.3, 95.2, 30.31, 7055.4) == ("Cost: 7,055 GPU-hours lost so far (iteration 30.3 s -> 95.2 s, "
                                               "x3.14); about 30.3 s per iteration with the culprits restored.")
