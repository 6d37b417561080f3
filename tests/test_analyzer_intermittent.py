"""A fault that comes and goes is one incident, reopened, with its episodes counted."""

from analyzer.config import AnalyzerConfig
from analyzer.job_analyzer import JobAnalyzer
from evaluation.accuracy import result_cube
from rankscope.incident import IncidentClass
from rankscope.schema import DEFAULT_STAGES
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario

FLAPPING = {"topology": {"pp": 4, "dp": 64, "ep": 8, "gpus_per_node": 8},
            "run": {"job": "flap", "iterations": 80, "seed": 4},
            # node 5's attention x4 in three bursts of 4 iterations, 4 iterations apart
            "fault": [{"kind": "compute_slowdown", "node": 5, "factor": 4.0, "stage": "attention",
                       "start": 20, "end": 24, "every": 8, "repeats": 3}]}


def _run(data, config=None):
    sc = Scenario.from_dict(data)
    sim = ClusterSimulator(sc)
    ja = JobAnalyzer(sc.job, sc.topology, DEFAULT_STAGES, config)
    history = []
    ja.latest = {}
    for _ in range(sc.iterations):
        res = sim.step()
        for inc in ja.feed(result_cube(res, sim.stages.names)).incidents:
            history.append((res.iteration, inc.id, inc.status.value, inc.episodes))
            ja.latest[inc.id] = inc
    return ja, history


def _burst_cost(ja_single) -> float:
    (inc,) = ja_single.latest.values()
    return inc.impact.gpu_hours_lost


def test_three_bursts_are_one_intermittent_incident():
    single, _ = _run({**FLAPPING, "fault": [{**FLAPPING["fault"][0], "repeats": 1}]})
    ja, history = _run(FLAPPING)
    assert {h[1] for h in history} == {"cs-20-r40"}                  # one incident, one id
    (inc,) = [i for i in ja.incidents() if i.id == "cs-20-r40"]
    assert inc.cls == IncidentClass.COMPUTE_STRAGGLER and inc.ranks == list(range(40, 48))
    assert (inc.episodes, inc.first_onset, inc.last_onset) == (3, 20, 36)
    assert inc.title.startswith("intermittent (3 episodes)")
    assert inc.evidence["summary"].startswith("Intermittent: episode 3")
    # it resolved in between (the first episode), reopened, and now waits for the window
    statuses = [s for _, _, s, _ in history]
    changes = [s for k, s in enumerate(statuses) if k == 0 or s != statuses[k - 1]]
    assert changes == ["open", "resolved", "open", "resolved"]
    assert inc.status.value == "resolved" and inc.resolved_iteration == 40
    # its cost counts each burst once: about three times one burst's, not the first twice
    one_burst = _burst_cost(single)
    assert inc.impact.iteration_s_now > inc.impact.iteration_s_before          # the latest episode
    assert 2.4 * one_burst < inc.impact.gpu_hours_lost < 3.6 * one_burst
    resolved_at = max(it for it, _, s, _ in history if s == "resolved")
    assert resolved_at - 40 + 1 >= AnalyzerConfig().reopen_within      # quiet for the whole window


def test_a_return_after_the_window_is_a_new_incident():
    data = {**FLAPPING, "fault": [{**FLAPPING["fault"][0], "every": 40, "repeats": 2}]}
    ja, history = _run(data, AnalyzerConfig(reopen_within=10))
    assert len({h[1] for h in history}) == 2                            # 20..24 and 60..64
    assert all(episodes == 1 for *_, episodes in history)
