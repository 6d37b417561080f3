"""A silent rank is found as soon as the job's own record of dropped points allows: 3-4
iterations missed on a clean record, ``silent_after`` (5) on a lossy one, never by drops alone."""

from __future__ import annotations

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.silence import FALSE_SILENCE_RATE, SILENT_MIN, SilenceRule
from evaluation.accuracy import COLLECTOR_SHAPES, Case, run_case, run_case_written, score_case
from rankscope.schema import DEFAULT_STAGES
from rankscope.topology import Topology


def _fed(world: int, iterations: int, drop: float, seed: int = 0) -> SilenceRule:
    rule = SilenceRule("j", Topology(dp=world, gpus_per_node=8), DEFAULT_STAGES, AnalyzerConfig())
    rng = np.random.default_rng(seed)
    for _ in range(iterations):
        present = rng.random(world) >= drop
        rule.seen |= True
        rule.missing = np.where(present, 0, rule.missing + 1)
        rule.expected += 1
        rule.received += present
        rule.dropped += int(((rule.missing > 0) & (rule.missing < 5)).sum())
    return rule


def test_the_needed_run_follows_the_record():
    assert _fed(512, 1, 0.0).needed() == 5                      # a young record: the setting
    clean = _fed(512, 400, 0.0)
    assert clean.needed() == SILENT_MIN
    assert 512 * (3 / clean.expected.sum()) ** SILENT_MIN <= FALSE_SILENCE_RATE
    assert _fed(12_960, 400, 0.01).needed() == 5                 # 1% dropped: 4 in a row is too common


def _case(world_dp: int, shapes: dict | None, fault: bool, seed: int) -> Case:
    data = {"topology": {"tp": 1, "pp": 2, "dp": world_dp, "ep": 4, "gpus_per_node": 8},
            "run": {"job": f"silence-{seed}", "iterations": 60, "seed": seed},
            "fault": [{"kind": "silent_rank", "ranks": "77-77", "start": 30}] if fault else []}
    if shapes:
        data["model"] = dict(shapes)
    return Case(seed, data)


def test_a_silent_rank_on_a_clean_record_is_found_within_3_iterations():
    (f,) = score_case(run_case(_case(64, None, True, 3))).faults
    assert f.detected and f.class_ok and f.n_hit == f.n_reported == 1 and f.delay <= 3


def test_with_one_point_in_a_hundred_dropped_it_waits_and_drops_alone_page_nobody():
    score = score_case(run_case_written(_case(64, COLLECTOR_SHAPES, True, 4)))
    (f,) = score.faults
    assert f.detected and f.class_ok and f.n_hit == 1 and f.delay <= 5
    healthy = run_case_written(_case(64, COLLECTOR_SHAPES, False, 5))
    assert not [i for i in healthy.incidents if i.cls == "silent_rank"]
