"""The accuracy suite's smoke configuration: one generated case per fault kind plus healthy runs.

The full suite (hundreds of cases, 12,960-rank runs, L1 calibration) is
``make bench-accuracy``; this keeps the generator, the in-memory run and the
scoring honest in CI, and the analyzer's recall on them.
"""

import numpy as np
import pytest

from evaluation.accuracy import (
    EXPECTED_CLASS,
    Case,
    Outcome,
    Seen,
    false_incidents_per_1000,
    generate_case,
    generate_cases,
    run_case,
    score_case,
    smallest_factor_at_recall,
    summarize,
)
from simulator.scenario import FAULT_KINDS

SMOKE_SEED = 7


def test_generator_is_seeded_and_builds_valid_scenarios():
    a = generate_cases(3, 25)
    b = generate_cases(3, 25)
    assert [c.data for c in a] == [c.data for c in b]
    assert len({str(c.data) for c in a}) == 25
    for c in a:
        sc = c.scenario()  # validates
        assert sc.iterations == c.data["run"]["iterations"]
        for f in sc.faults:
            assert 15 <= f.start < sc.iterations
    kinds = {k for c in a for k in c.kinds}
    assert len(kinds) >= 4
    assert any(c.healthy for c in generate_cases(4, 40))
    assert any(len(c.kinds) == 2 for c in generate_cases(5, 40))


def test_scoring_counts_misses_and_false_incidents():
    case = Case(1, {"topology": {"tp": 1, "pp": 2, "dp": 16, "ep": 4, "gpus_per_node": 8},
                    "run": {"job": "s", "iterations": 30, "seed": 1},
                    "fault": [{"kind": "compute_slowdown", "ranks": "3", "factor": 2.0, "start": 20}]})
    hit = Seen("a", "compute_straggler", [3, 4], "mlp", 20, 22)
    early = Seen("b", "compute_straggler", [3], "mlp", 5, 6)  # before the fault: false
    s = score_case(Outcome(case, 30, 32, [early, hit]))
    (f,) = s.faults
    assert f.detected and f.class_ok and f.delay == 2 and (f.n_hit, f.n_reported, f.n_true) == (1, 2, 1)
    assert [i.id for i in s.false_incidents] == ["b"]
    (k,) = summarize([s])
    assert k.rank_precision == 0.5 and k.rank_recall == 1.0 and k.recall == 1.0
    missed = score_case(Outcome(case, 30, 32, [early]))
    assert not missed.faults[0].detected and summarize([missed])[0].recall == 0.0
    assert false_incidents_per_1000([missed], healthy_only=False) == (1, 30, pytest.approx(1000 / 30))
    assert smallest_factor_at_recall({1.1: 0.5, 1.2: 1.0, 1.3: 0.9, 1.5: 1.0}) == 1.5
    assert smallest_factor_at_recall({1.1: 0.96, 1.2: 1.0}) == 1.1
    assert smallest_factor_at_recall({1.5: 0.2}) is None


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_every_fault_kind_found_with_its_class_and_no_false_incident(kind):
    case = generate_case(SMOKE_SEED, kinds=(kind,), healthy_share=0.0, overlap_share=0.0, iterations=40,
                         noise=1.0)
    assert case.kinds == [kind]
    s = score_case(run_case(case))
    (f,) = s.faults
    assert f.detected, case.data
    assert f.class_ok, case.data
    assert f.n_hit / f.n_true >= 0.95, case.data
    assert 0 <= f.delay <= 10
    assert s.false_incidents == [], case.data
    assert EXPECTED_CLASS[kind]


def test_healthy_runs_raise_nothing():
    cases = [generate_case(SMOKE_SEED + i, healthy_share=1.0, iterations=60, noise=n)
             for i, n in enumerate((1.0, 2.0))]
    scores = [score_case(run_case(c)) for c in cases]
    assert all(c.healthy for c in cases)
    n_false, n_it, rate = false_incidents_per_1000(scores)
    assert n_it == 120 and n_false == 0 and rate == 0.0
    assert np.all([s.faults == [] for s in scores])


def test_with_tp_the_culprit_is_the_slow_gpu_not_its_tp_group():
    case = Case(2, {"topology": {"tp": 2, "pp": 2, "dp": 8, "ep": 4, "gpus_per_node": 8},
                    "run": {"job": "tp", "iterations": 30, "seed": 2},
                    "fault": [{"kind": "compute_slowdown", "ranks": "5", "stage": "mlp", "factor": 2.0, "start": 20}]})
    pair = Seen("a", "compute_straggler", [4, 5], "mlp", 20, 21)
    (compute,) = score_case(Outcome(case, 30, 32, [pair])).faults
    assert (compute.n_true, compute.n_hit, compute.n_reported) == (1, 1, 2)   # its TP mate 4 is no culprit
    found = score_case(run_case(case))
    assert [(f.n_true, f.n_hit, f.n_reported) for f in found.faults] == [(1, 1, 1)] and not found.false_incidents


def test_l1_calibration_counts_false_alarms_and_power():
    from evaluation.l1_calibration import L1Setting, false_alarms, step_power

    rng = np.random.default_rng(0)
    x = 30_000 * np.exp(rng.normal(0, 0.01, (200, 3)))
    x[100, 1] *= 3.0  # one spike in series 1
    s = L1Setting(threshold=6.0, min_change=0.10, persist=2)
    spikes = false_alarms(x, s, "spike")
    assert spikes.alarms == 1 and spikes.armed == 3 * (200 - 8) and spikes.arl == spikes.armed
    assert false_alarms(x, s, "step").alarms == 0
    p = step_power(x, s, 1.5, 150)
    assert p.detected == 3 and p.onset_exact == 3 and p.delay_median == 1.0
    assert step_power(x, s, 1.05, 150).detected == 0  # below min_change


def test_link_and_intermittent_cases_are_scored_as_their_own_sets():
    """The link set names the node (or an ambiguous set with the truth inside); a fault that
    comes and goes is one incident."""
    from evaluation.accuracy import intermittent_case, link_case

    links = [score_case(run_case(link_case(SMOKE_SEED * 100 + i))) for i in range(4)]
    (k,) = summarize(links)
    assert k.kind == "link_degradation" and k.detected == 4 and k.rank_recall == 1.0
    assert k.rank_precision_named == 1.0 or np.isnan(k.rank_precision_named)
    flaps = [score_case(run_case(intermittent_case(SMOKE_SEED * 100 + i))) for i in range(2)]
    (f,) = summarize(flaps)
    assert f.kind == "intermittent_compute" and f.detected == 2 and f.incidents_per_fault == 1.0
    assert all(not s.false_incidents for s in flaps)
