"""A real 8-process torch.distributed job (gloo, CPU, DDP), instrumented, on the real InfluxDB.

Rank 5 does real extra expert compute in its ``mlp`` forward from iteration 15 on.
The stored points must show it (its ``mlp`` high, the healthy ranks' DDP all-reduce
long: they wait for it), and the analyzer, run on what was stored, must name rank 5
as a compute straggler, on this machine (every point carries its host name).
"""

from __future__ import annotations

import dataclasses
import socket
import uuid
import warnings

import pytest

from evaluation.torch_demo import DEMO_STAGES, DemoConfig, run_demo
from tests.torch_alone import alone

SLOW_RANK, SLOW_FROM, ITERATIONS, WORLD = 5, 15, 40, 8


@pytest.fixture(scope="module")
def demo_run(influx_url):
    """Run the job once for the module; the data stays in its own database."""
    from rankscope.store import InfluxStore

    store = InfluxStore(influx_url, bucket=f"torchrun_{uuid.uuid4().hex[:8]}", api="v1")
    cfg = DemoConfig(job="torch-run", store=influx_url, bucket=store.bucket, world=WORLD,
                     iterations=ITERATIONS, slow_rank=SLOW_RANK, slow_from=SLOW_FROM)
    try:
        with alone():
            result = run_demo(cfg)
        yield cfg, result, store
    finally:
        store.drop_database()
        store.close()


def medians(df, stage, slow: bool):
    part = df[(df["iteration"] >= SLOW_FROM) == slow]
    return part.groupby("rank")[stage].median()


def test_every_rank_wrote_one_point_per_iteration(demo_run):
    cfg, result, store = demo_run
    assert [r.rank for r in result.ranks] == list(range(WORLD))
    for r in result.ranks:
        assert r.writer["written"] == ITERATIONS and r.writer["dropped"] == 0
        assert len(r.step_s) == ITERATIONS
    df = store.read_stage_latency(cfg.job)
    assert len(df) == WORLD * ITERATIONS
    assert (df.groupby("rank")["iteration"].apply(sorted) == [list(range(ITERATIONS))] * WORLD).all()
    assert set(DEMO_STAGES) <= set(df.columns)
    assert df[list(DEMO_STAGES)].notna().all().all()
    assert sorted(set(df["dp"])) == list(range(WORLD))
    # every rank names the machine it ran on: all of them this one, one node of WORLD ranks
    assert (df.groupby("rank")["host"].agg(set) == [{socket.gethostname()}] * WORLD).all()
    assert set(df["node"]) == {0}
    assert "gpu" not in df.columns or df["gpu"].isna().all()  # CPU: no GPU to name
    # stages are parts of the iteration (their sum can exceed it only by DDP's overlap
    # of the all-reduce with the backward of the earlier layers)
    assert (df["mlp"] < df["iteration_ms"]).all()


def test_slow_rank_is_high_in_mlp_and_healthy_ranks_wait_in_the_all_reduce(demo_run):
    """On a quiet machine rank 5's mlp is ~8x its peers' and the healthy ranks' all-reduce
    ~9x rank 5's; the margins below leave room for a machine loaded by other work."""
    cfg, _, store = demo_run
    df = store.read_stage_latency(cfg.job)
    healthy = [r for r in range(WORLD) if r != SLOW_RANK]
    mlp_after, mlp_before = medians(df, "mlp", True), medians(df, "mlp", False)
    # the slow rank: mlp several times its peers' and its own earlier value
    assert mlp_after[SLOW_RANK] > 2 * mlp_after[healthy].max()
    assert mlp_after[SLOW_RANK] > 2 * mlp_before[SLOW_RANK]
    assert mlp_before[SLOW_RANK] < 2 * mlp_before[healthy].median()  # healthy before
    # healthy ranks: the DDP all-reduce grows by the waiting; the slow rank's is short
    rs_after, rs_before = medians(df, "reduce_scatter", True), medians(df, "reduce_scatter", False)
    assert (rs_after[healthy] > 2 * rs_after[SLOW_RANK]).all()
    assert rs_after[healthy].median() > 1.5 * rs_before[healthy].median()
    # the whole job's iteration time stepped up (what L1 watches)
    it_after, it_before = medians(df, "iteration_ms", True), medians(df, "iteration_ms", False)
    assert it_after.median() > 1.5 * it_before.median()


#: How far a healthy rank's mlp spreads between iterations before the fault (median over the healthy
#: ranks of p90 / p10) on a quiet 2-core machine: 4.7-4.8 in runs of this job alone; a burst of load
#: widens it (6.4 in the run where rank 5 went unnamed).
QUIET_SPREAD = 5.5


def _excess_ms(df, rank: int, stage: str, onset: int) -> float:
    """The median time ``rank`` spends in ``stage`` beyond the ranks' median, from ``onset`` on."""
    after = df[df["iteration"] >= onset].pivot(index="iteration", columns="rank", values=stage)
    return float((after[rank] - after.median(axis=1)).median())


def _judged_the_machine(incidents: list[dict], df) -> str:
    """Why this run says more of the machine than of the code, or "" where it does not (then it
    must name rank 5). 8 processes on 2 cores beside another test worker: a burst of load can starve
    a healthy rank before the fault (a straggler, rightly named, that hides rank 5's cost), or in mlp
    as the fault begins (confirmed beside rank 5, it is named with it, at a fraction of its cost), or widen
    mlp's spread across ranks until rank 5's 20x reads as 2.5 of the stage's sigmas (an accuracy
    limit of noisy stages, in the closing notes). Only then does the job run once more."""
    if any(i["ranks"] == [SLOW_RANK] and i["stage"] == "mlp" for i in incidents):
        return ""
    if any(i["class"] == "compute_straggler" and SLOW_RANK not in i["ranks"] and i["onset_iteration"] < SLOW_FROM
           for i in incidents):
        return "a healthy rank was starved before the fault"
    with_others = [i for i in incidents if i["stage"] == "mlp" and SLOW_RANK in i["ranks"] and len(i["ranks"]) > 1]
    if with_others and all(_excess_ms(df, r, "mlp", i["onset_iteration"]) < 0.25 * _excess_ms(df, SLOW_RANK, "mlp", i["onset_iteration"])
                           for i in with_others for r in i["ranks"] if r != SLOW_RANK):
        return "a healthy rank was starved in mlp as the fault began (confirmed with rank 5, at a fraction of its cost)"
    elsewhere = [i for i in incidents if SLOW_RANK in i["ranks"] and i["stage"] != "mlp" and i["onset_iteration"] >= SLOW_FROM]
    if elsewhere and not any(SLOW_RANK in i["ranks"] and i["stage"] == "mlp" for i in incidents):
        # an accuracy limit (closing notes): rank 5's mlp joined, as the same machine's fault, the
        # incident a starved rank had opened in another stage in the same iteration
        return f"rank 5 was named in {elsewhere[0]['stage']}, beside a rank starved there as the fault began"
    before = df[(df["iteration"] < SLOW_FROM) & (df["rank"] != SLOW_RANK)]
    q = before.groupby("rank")["mlp"].quantile([0.1, 0.9]).unstack()
    spread = float((q[0.9] / q[0.1]).median())
    return f"the healthy ranks' mlp spread {spread:.1f}x before the fault" if spread > QUIET_SPREAD else ""


def test_analyzer_names_the_slow_rank_as_compute_straggler(demo_run, influx_url):
    from analyzer.service.run_once import run_once
    from rankscope.store import InfluxStore

    cfg, _, store = demo_run
    # no topology given: the analyzer infers it, and the placement from the host tags
    incidents = run_once(store, job=cfg.job)
    why = _judged_the_machine(incidents, store.read_stage_latency(cfg.job))
    if why:   # once more, on a new database, and said
        warnings.warn(f"test_torch_run ran the job again: {why} (8 processes on 2 cores)", stacklevel=1)
        store = InfluxStore(influx_url, bucket=f"torchrun_{uuid.uuid4().hex[:8]}", api="v1")
        cfg = dataclasses.replace(cfg, bucket=store.bucket)
        try:
            with alone():
                run_demo(cfg)
            incidents = run_once(store, job=cfg.job)
            df = store.read_stage_latency(cfg.job)
        finally:
            store.drop_database()
            store.close()
    else:
        df = store.read_stage_latency(cfg.job)
    stragglers = [i for i in incidents if i["class"] == "compute_straggler"]
    named = [i for i in stragglers if i["ranks"] == [SLOW_RANK] and i["stage"] == "mlp"]
    assert named, f"no compute_straggler naming rank {SLOW_RANK} in mlp among " \
                  f"{[(i['class'], i['ranks'], i['stage'], i['onset_iteration']) for i in incidents]}"
    first = min(named, key=lambda i: i["onset_iteration"])
    assert first["job"] == cfg.job
    assert first["nodes"] == [0] and first["hosts"] == [socket.gethostname()]  # what to drain
    assert SLOW_FROM <= first["onset_iteration"] < ITERATIONS  # not before the fault began
    # rank 5 is THE straggler: a healthy rank the OS scheduler preempts for a few
    # iterations (8 processes on 2 cores) may be flagged in a ~1 ms stage, but the time
    # it loses is small against rank 5's

    lost = _excess_ms(df, SLOW_RANK, "mlp", first["onset_iteration"])
    assert lost > 50
    for other in (i for i in stragglers if i not in named):
        for r in other["ranks"]:
            assert _excess_ms(df, r, other["stage"], other["onset_iteration"]) < 0.25 * lost, other


def test_torch_demo_command(tmp_path, capsys):
    from rankscope.cli import main as cli_main
    from rankscope.store import EmbeddedStore

    db = tmp_path / "store.db"
    assert cli_main(["torch-demo", "--store", str(db), "--world", "2", "--gpus-per-node", "2",
                     "--iterations", "4", "--slow-rank", "-1", "--job", "cli-demo"]) == 0
    out = capsys.readouterr()
    assert "rank 1: median step" in out.out and "written 4, dropped 0" in out.out
    assert "2 processes x 4 iterations" in out.err
    with EmbeddedStore(db) as store:
        df = store.read_stage_latency("cli-demo")
    assert len(df) == 8 and set(DEMO_STAGES) <= set(df.columns)
    assert set(df["host"]) == {socket.gethostname()}
    assert cli_main(["torch-demo", "--store", str(db), "--world", "2", "--slow-rank", "7"]) == 1
    assert "slow rank 7 is outside 0..1" in capsys.readouterr().err
