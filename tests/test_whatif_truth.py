"""The what-if of every fault class against the truth: the same run without the fault.

"With the culprits restored" is the job's iteration time with the culprits' excess removed,
the waits they cause the others included. The simulator runs each scenario twice, with its
fault and without it (same seed, so the same noise): the analyzer's figure for the first run
must be within 10% of the second run's job iteration time over the same iterations. The
arrival straggler is named from collective timings alone (NCCL Inspector logs, imported), its
truth the same collectives without the slow rank. Small jobs, so each case takes a second.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from analyzer.job_analyzer import JobAnalyzer
from analyzer.score.impact import NOW_ITERATIONS
from analyzer.service.run_once import run_once
from collector import nccl_import as ni
from evaluation.accuracy import result_cube
from rankscope.frames import frame_to_cube
from rankscope.incident import Incident, IncidentClass, load_incident
from rankscope.schema import DEFAULT_STAGES
from rankscope.topology import Topology
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario

TOPOLOGY = {"tp": 1, "pp": 4, "dp": 32, "ep": 8, "gpus_per_node": 8}   # 128 ranks, 16 nodes
#: A job-wide drift from iteration 20: every rank's compute 1.3x slower (no culprit: it stays).
DRIFT = {"kind": "compute_slowdown", "ranks": "0-127", "factor": 1.3, "start": 20}

CASES = {
    IncidentClass.COMPUTE_STRAGGLER: {"kind": "compute_slowdown", "ranks": "37", "factor": 2.5, "start": 20},
    IncidentClass.HOST_STALL: {"kind": "host_stall", "node": 5, "stage": "dataloader", "factor": 40.0,
                               "start": 18, "end": 30},
    IncidentClass.LINK_DEGRADATION: {"kind": "link_degradation", "node": 3, "factor": 8.0, "start": 15},
    IncidentClass.PIPELINE_IMBALANCE: {"kind": "stage_imbalance", "pp": 2, "factor": 1.5, "start": 20},
    IncidentClass.TRANSIENT_STALL: {"kind": "transient_stall", "ranks": "60-63", "stage": "attention",
                                    "factor": 25.0, "start": 12, "end": 15},
}


def scenario(faults: list[dict], seed: int = 3, tp: int = 1) -> Scenario:
    return Scenario.from_dict({"topology": {**TOPOLOGY, "tp": tp, "dp": TOPOLOGY["dp"] // tp},
                               "run": {"job": "what-if", "iterations": 40, "seed": seed}, "fault": faults})


def analyzed(sc: Scenario) -> tuple[list[Incident], np.ndarray]:
    """The incidents of a simulated run and its job iteration times (s, median over ranks)."""
    sim = ClusterSimulator(sc)
    ja = JobAnalyzer(sc.job, sc.topology, DEFAULT_STAGES)
    job = []
    for _ in range(sc.iterations):
        res = sim.step()
        job.append(float(np.median(res.iteration_ms)) / 1000)
        ja.feed(result_cube(res, sim.stages.names))
    return ja.incidents(), np.array(job)


def truth_s(job: np.ndarray, inc: Incident) -> float:
    """The job's time in the incident's latest iterations (those its level now is taken over)."""
    end = inc.resolved_iteration if inc.resolved_iteration >= 0 else len(job)
    return float(np.median(job[inc.last_onset:end][-NOW_ITERATIONS:]))


def the_one(incidents: list[Incident], cls: IncidentClass) -> Incident:
    found = [i for i in incidents if i.cls == cls]
    assert len(found) == 1, [(i.cls, i.ranks) for i in incidents]
    return found[0]


@pytest.mark.parametrize("cls", list(CASES), ids=lambda c: c.value)
def test_the_what_if_is_the_run_without_the_fault(cls):
    sc = scenario([CASES[cls]], tp=2 if cls == IncidentClass.PIPELINE_IMBALANCE else 1)
    inc = the_one(analyzed(sc)[0], cls)
    _, healthy = analyzed(dataclasses.replace(sc, faults=[]))
    truth, imp = truth_s(healthy, inc), inc.impact
    assert imp.iteration_s_now > 1.15 * truth            # the fault costs: a wrong what-if shows
    assert imp.iteration_s_if_restored == pytest.approx(truth, rel=0.10)


@pytest.mark.parametrize("cls", [IncidentClass.COMPUTE_STRAGGLER, IncidentClass.LINK_DEGRADATION],
                         ids=lambda c: c.value)
def test_a_job_wide_drift_stays_in_the_what_if(cls):
    """The culprits' fault and a drift of the whole job at once: restoring the culprits leaves the
    drift (the level before the onset would be 20% off)."""
    sc = scenario([{**CASES[cls], "start": 20}, DRIFT])
    inc = the_one(analyzed(sc)[0], cls)
    _, drifted = analyzed(dataclasses.replace(sc, faults=sc.faults[1:]))
    truth, imp = truth_s(drifted, inc), inc.impact
    assert imp.iteration_s_before < 0.85 * truth
    assert imp.iteration_s_if_restored == pytest.approx(truth, rel=0.10)


def test_a_silent_rank_says_it_has_no_what_if():
    inc = the_one(analyzed(scenario([{"kind": "silent_rank", "ranks": "50", "start": 25}]))[0],
                  IncidentClass.SILENT_RANK)
    assert np.isnan(inc.impact.iteration_s_if_restored)
    assert "no what-if: silent ranks report no time" in inc.cost and "culprits restored" not in inc.cost


# ------------------------------------------------------------------ from collective timings alone
#: 16 ranks on 2 nodes (pp=2 x dp=8, rank = dp + 8 pp: node-a holds pp stage 0, node-b stage 1).
PP, DP = 2, 8
WORLD = PP * DP
ARRIVAL_TOPOLOGY = Topology(pp=PP, dp=DP, gpus_per_node=8)
T0_US = 1_764_800_000_000_000


def _comms() -> dict[str, tuple[int, ...]]:
    out = {"0xworld": tuple(range(WORLD))}
    out |= {f"0xdp{p}": tuple(d + DP * p for d in range(DP)) for p in range(PP)}
    return out | {f"0xpp{d}": (d, d + DP) for d in range(DP)}


def collectives(slow: int | None, drift: float = 1.0, onset: int = 20, iterations: int = 40) -> list[dict]:
    """Per rank and collective: a forward and a backward half of ~115 ms compute, each followed
    by the pipeline hop, then the DP reduce-scatter and all-gather and a job-wide all-reduce
    (~0.25 s an iteration). From ``onset`` every rank computes ``drift`` x slower and ``slow``
    3.2x slower again. A collective ends when its last member arrived plus its transfer."""
    rng = np.random.default_rng(0)
    members = _comms()
    sn, clock, recs = dict.fromkeys(members, 0), np.zeros(WORLD), []

    def coll(comm: str, op: str, us: float, ranks: list[int] | None = None) -> None:
        ranks = list(members[comm]) if ranks is None else ranks
        end = clock[ranks].max() + us * (1 + 0.03 * rng.standard_normal())
        for i, r in enumerate(ranks):
            recs.append({"rank": r, "comm": comm, "op": op if op else ("Send", "Recv")[i], "sn": sn[comm],
                         "end_us": end, "ms": (end - clock[r]) / 1000})
            clock[r] = end
        sn[comm] += 1

    for it in range(iterations):
        for hop in (0, 1):
            work = 115_000.0 * (1 + 0.03 * rng.standard_normal(WORLD))
            if it >= onset:
                work *= drift
                if slow is not None:
                    work[slow] *= 3.2
            clock[:] += work
            for d in range(DP):
                coll(f"0xpp{d}", "", 800.0, [d, d + DP][::1 if hop == 0 else -1])
        for op, us in (("ReduceScatter", 12_000.0), ("AllGather", 10_000.0)):
            for p in range(PP):
                coll(f"0xdp{p}", op, us)
        coll("0xworld", "AllReduce", 2_000.0)
    return recs


def inspector_logs(recs: list[dict], folder: Path) -> Path:
    """One log per process, a JSON line per collective, as the Inspector plugin writes them
    (non-verbose: the dump time stands for the end; a bandwidth it could not compute is "nan")."""
    folder.mkdir(parents=True, exist_ok=True)
    members = _comms()

    def host(r: int) -> str:
        return "node-a" if r < DP else "node-b"

    for r in range(WORLD):
        lines = [json.dumps({
            "header": {"id": x["comm"], "rank": members[x["comm"]].index(r), "n_ranks": len(members[x["comm"]]),
                       "nnodes": len({host(q) for q in members[x["comm"]]})},
            "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "",
                         "rec_mechanism": "nccl_profiler_interface", "dump_timestamp_us": T0_US + int(x["end_us"]),
                         "hostname": host(r), "pid": 1000 + r},
            "coll_perf": {"coll": x["op"], "coll_sn": x["sn"], "coll_msg_size_bytes": 1 << 24,
                          "coll_exec_time_us": int(round(x["ms"] * 1000)), "coll_timing_source": "kernel_gpu",
                          "coll_algobw_gbs": 100.0, "coll_busbw_gbs": "nan"}})
            for x in sorted((x for x in recs if x["rank"] == r), key=lambda x: x["end_us"])]
        (folder / f"{host(r)}-pid{1000 + r}.log").write_text("\n".join(lines) + "\n")
    return folder


def imported(recs: list[dict], folder: Path):
    return ni.stage_frame(ni.load([inspector_logs(recs, folder)]), "j", ARRIVAL_TOPOLOGY).frame


def job_seconds(frame) -> np.ndarray:
    return frame.groupby("iteration")["iteration_ms"].median().to_numpy() / 1000


def test_an_arrival_straggler_restored_is_the_job_without_it(tmp_path, embedded_store):
    """The issue's case: 16 ranks, rank 11 on node-b slow, 0.25 s -> 0.75 s an iteration."""
    embedded_store.write_stage_latency(imported(collectives(slow=11), tmp_path / "slow"))
    assert [(i["class"], i["ranks"]) for i in run_once(embedded_store, "j")] == [("arrival_straggler", [11])]
    inc = load_incident(embedded_store, "j")
    truth = truth_s(job_seconds(imported(collectives(slow=None), tmp_path / "healthy")), inc)
    imp = inc.impact
    assert inc.hosts == ["node-b"] and 0.22 < truth < 0.28 and imp.iteration_s_now > 2.5 * truth
    assert imp.iteration_s_if_restored == pytest.approx(truth, rel=0.10)
    assert f"about {imp.iteration_s_if_restored:.3g} s per iteration with the culprits restored" in inc.cost


def test_an_arrival_straggler_during_a_job_wide_drift(tmp_path):
    frame = imported(collectives(slow=11, drift=1.3), tmp_path / "slow")
    ja = JobAnalyzer("j", ARRIVAL_TOPOLOGY, DEFAULT_STAGES)
    ja.feed(frame_to_cube(frame, WORLD, DEFAULT_STAGES.names))
    inc = the_one(ja.incidents(), IncidentClass.ARRIVAL_STRAGGLER)
    truth = truth_s(job_seconds(imported(collectives(slow=None, drift=1.3), tmp_path / "drift")), inc)
    assert inc.ranks == [11] and inc.impact.iteration_s_before < 0.85 * truth
    assert inc.impact.iteration_s_if_restored == pytest.approx(truth, rel=0.10)
