"""Pipeline-bubble amplification (ARGUS's case): one PP stage computes more while every rank of it is
alike, so no rank stands out in its DP group; the bubbles of the other stages grow. The incident
names the stage and shows the asymmetric bubbles as evidence."""

from __future__ import annotations

import numpy as np

from analyzer.service.run_once import run_once
from simulator.scenario import Scenario
from simulator.simulate import simulate


def test_a_pp_stage_with_more_work_shows_in_asymmetric_bubbles(influx_store):
    sc = Scenario.from_dict({"topology": {"tp": 1, "pp": 4, "dp": 16, "ep": 4, "gpus_per_node": 8},
                             "run": {"job": "bubbles", "iterations": 40, "seed": 5},
                             "fault": [{"kind": "stage_imbalance", "pp": 2, "factor": 1.9, "start": 20}]})
    simulate(sc, influx_store, start_ms=1_770_000_000_000, progress=False)
    incidents = run_once(influx_store, job="bubbles")
    assert [i["class"] for i in incidents] == ["pipeline_imbalance"], [(i["class"], i["ranks"]) for i in incidents]
    inc = incidents[0]
    assert inc["evidence"]["pp"] == [2]
    bubbles = inc["evidence"]["bubble_ms"]
    assert len(bubbles) == 4 and int(np.argmin(bubbles)) == 2
    others = [b for p, b in enumerate(bubbles) if p != 2]
    assert min(others) > 1.5 * bubbles[2], bubbles      # the other stages wait for it
    assert "Bubbles (pp_recv + pp_send, median ms) by stage: pp=0" in inc["evidence"]["summary"]
