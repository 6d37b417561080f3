"""The model's invariants, determinism, stage handling, the write paths, the CLI and live mode."""

import json
import time

import numpy as np
import pytest

from rankscope import cli
from rankscope.frames import frame_to_cube
from rankscope.schema import DEFAULT_STAGES, SchemaError, Stage, StageSet
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario, load_scenario
from simulator.simulate import default_truth_path, simulate
from simulator.truth import Truth

T0 = 1_760_000_000_000
SMALL = {"tp": 1, "pp": 4, "dp": 64, "ep": 16, "gpus_per_node": 8}


def small(faults=(), iterations=5, seed=1, topo=SMALL, job="t", events=()):
    return Scenario.from_dict({"topology": topo, "run": {"job": job, "iterations": iterations, "seed": seed},
                               "fault": list(faults), "event": list(events)})


def steps(sc, n=None):
    sim = ClusterSimulator(sc)
    return sim, [sim.step() for _ in range(n or sc.iterations)]


@pytest.mark.parametrize("topo", [SMALL, {"tp": 2, "pp": 3, "dp": 32, "ep": 8, "gpus_per_node": 4},
                                  {"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8}])
def test_stage_times_add_up_to_the_iteration_time(topo):
    sc = small([{"kind": "compute_slowdown", "ranks": 5, "factor": 4.0, "start": 1},
                {"kind": "link_degradation", "node": 2, "factor": 3.0, "start": 2}], topo=topo, iterations=3)
    sim, results = steps(sc)
    for res in results:
        assert res.values.shape == (sc.topology.world, len(sim.stages))
        assert (res.values >= 0).all()
        assert np.allclose(res.values @ sim.occurrence_counts, res.iteration_ms, rtol=1e-9)
        # ranks of one DP group finish the iteration together
        it = res.iteration_ms[sc.topology.members("dp")]
        assert np.allclose(it, it[:, :1])
    lm = sim.params.layers_per_stage * sim.params.microbatches
    assert sim.occurrences["mlp"] == lm and sim.occurrences["pp_send"] == sim.params.microbatches


@pytest.mark.parametrize(("topo", "absent"), [
    ({"tp": 1, "pp": 1, "dp": 64, "ep": 16, "gpus_per_node": 8}, ["pp_send", "pp_recv"]),
    ({"tp": 1, "pp": 2, "dp": 16, "ep": 16, "gpus_per_node": 8}, ["expert_reduce"]),    # one copy of each expert
    ({"tp": 2, "pp": 2, "dp": 16, "ep": 1, "gpus_per_node": 8}, ["expert_reduce"]),     # no expert parallelism
    ({"tp": 1, "pp": 1, "dp": 8, "ep": 8, "gpus_per_node": 8}, ["pp_send", "pp_recv", "expert_reduce"]),
])
def test_stages_a_topology_lacks_are_not_timed_and_the_rest_still_add_up(topo, absent):
    sc = small([{"kind": "link_degradation", "node": 0, "factor": 3.0, "start": 1}], topo=topo, iterations=3)
    sim, results = steps(sc)
    assert sim.absent_stages == absent
    cols = [sim.stages.index(n) for n in absent]
    for res in results:
        assert np.isnan(res.values[:, cols]).all()
        rest = np.delete(res.values, cols, axis=1)
        assert (rest >= 0).all() and np.isfinite(rest).all()
        assert np.allclose(np.nan_to_num(res.values) @ sim.occurrence_counts, res.iteration_ms, rtol=1e-9)
    frame = sim.frame(results[-1])
    assert not set(absent) & set(frame.columns) and "mlp" in frame.columns
    assert sim.occurrences["reduce_scatter"] == 1


def test_deterministic_by_seed_and_independent_of_run_length():
    sc = small(iterations=4)
    _, a = steps(sc)
    _, b = steps(sc.with_overrides(iterations=9), 4)
    _, c = steps(sc.with_overrides(seed=2))
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.values, y.values) and x.time_ms == y.time_ms
    assert not np.allclose(a[0].values, c[0].values)


def test_timestamps_follow_the_job_iteration_time():
    sc = small(iterations=4)
    sim = ClusterSimulator(sc, start_ms=T0)
    res = [sim.step() for _ in range(4)]
    ends = T0 + np.cumsum([r.job_iteration_ms for r in res])
    assert [r.time_ms for r in res] == [int(round(e)) for e in ends]
    assert sim.run_length_ms() == pytest.approx(ends[-1] - T0)


def test_persistent_gpu_speed_is_a_few_percent_and_stays():
    sc = small(iterations=30, topo={"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8})
    sim = ClusterSimulator(sc)
    k = DEFAULT_STAGES.index("mlp")
    mlp = np.stack([sim.step().values[:, k] for _ in range(30)])
    per_rank = mlp.mean(axis=0) / np.median(mlp)
    assert 0.005 < per_rank.std() < 0.04 and per_rank.max() < 1.08 and per_rank.min() > 0.92
    # a GPU slow in the first half is still slow in the second: persistent, not noise
    first, second = mlp[:15].mean(axis=0), mlp[15:].mean(axis=0)
    assert np.corrcoef(first, second)[0, 1] > 0.6
    assert mlp.min() > 30 and mlp.max() < 50


def test_healthy_il0477_takes_about_30s():
    sim, res = steps(load_scenario("healthy").with_overrides(iterations=3))
    job = [r.job_iteration_ms for r in res]
    assert all(28_000 < j < 32_000 for j in job), job
    k = DEFAULT_STAGES.index("mlp")
    mlp_total = res[0].values[:, k] * sim.occurrences["mlp"]
    assert 11_000 < np.median(mlp_total) < 15_000


def test_tp_members_wait_for_the_slowest_in_their_all_reduces():
    topo = {"tp": 4, "pp": 2, "dp": 8, "ep": 4, "gpus_per_node": 8}
    sc = small([{"kind": "compute_slowdown", "ranks": 9, "stage": "mlp", "factor": 3.0}], topo=topo, iterations=1)
    sim, (res,) = steps(sc)
    assert sim.stages.names[:3] == ["attention", "mlp", "tp_comm"] and "tp_comm" not in DEFAULT_STAGES
    k, t, d = (sim.stages.index(n) for n in ("mlp", "tp_comm", "dispatch"))
    mates = [r for r in sc.topology.group_ranks("tp", 9) if r != 9]
    # its own MLP is slow, its TP mates' is not: they wait for it in the all-reduces instead
    assert res.values[9, k] > 100 and (res.values[mates, k] < 50).all()
    assert (res.values[mates, t] > 70).all() and res.values[9, t] < 5
    # the whole TP group arrives late at the EP all-to-all: from outside, all four look late
    ep_mates = np.setdiff1d(sc.topology.group_ranks("ep", 9), sc.topology.group_ranks("tp", 9))
    assert res.values[[9, *mates], d].max() < res.values[ep_mates, d].min()


def test_single_stage_pipeline_has_no_p2p_fields():
    sc = small(topo={"tp": 1, "pp": 1, "dp": 32, "ep": 8, "gpus_per_node": 8}, iterations=1)
    sim, (res,) = steps(sc)
    assert sim.absent_stages == ["pp_send", "pp_recv"]
    frame = sim.frame(res)
    assert "pp_send" not in frame.columns and "mlp" in frame.columns and len(frame) == 32


def test_other_stage_sets_are_refused_clearly():
    sc = small(iterations=1)
    extra = StageSet((*DEFAULT_STAGES.stages, Stage("tp_allreduce", "comm", "tp")))
    with pytest.raises(SchemaError, match="not modelled: tp_allreduce"):
        ClusterSimulator(sc, stages=extra)
    fewer = StageSet(DEFAULT_STAGES.stages[:-1])
    with pytest.raises(SchemaError, match="missing or changed: dataloader"):
        ClusterSimulator(sc, stages=fewer)
    # the same stages in another order are fine: columns follow the given order
    reordered = StageSet(tuple(reversed(DEFAULT_STAGES.stages)))
    a = ClusterSimulator(sc).step()
    b = ClusterSimulator(sc, stages=reordered).step()
    assert np.array_equal(a.values[:, ::-1], b.values)


def test_frame_has_the_reporting_ranks_and_all_tags():
    sc = small([{"kind": "silent_rank", "ranks": "3-4"}], iterations=1)
    sim, (res,) = steps(sc)
    frame = sim.frame(res, time_ms=123)
    assert len(frame) == 254 and not frame["rank"].isin([3, 4]).any()
    assert (frame["time"] == 123).all() and (frame["iteration"] == 0).all()
    assert {"job", "rank", "pp", "dp", "tp", "ep_group", "node", "iteration_ms", *DEFAULT_STAGES.names} <= set(frame)


def test_influx_and_embedded_stores_hold_the_same_run(influx_store, embedded_store):
    sc = small([{"kind": "host_stall", "node": 3, "factor": 10.0, "start": 1}],
               events=[{"name": "disk slow", "node": 3, "at": 1}], iterations=3)
    cubes, events = [], []
    for store in (influx_store, embedded_store):
        simulate(sc, store, start_ms=T0, progress=False)
        df = store.read_stage_latency("t")
        cubes.append(frame_to_cube(df, 256, DEFAULT_STAGES.names))
        events.append(store.read_events("t"))
    a, b = cubes
    assert np.array_equal(a.values, b.values) and np.array_equal(a.iteration_ms, b.iteration_ms)
    assert np.array_equal(a.times, b.times)
    # stored values are the model's, rounded to 1 us
    _, res = steps(sc)
    assert np.abs(a.values - np.stack([r.values for r in res])).max() <= 5e-4 + 1e-9
    for ev in events:
        assert ev["name"].tolist() == ["disk slow"] and ev["node"].tolist() == [3]
        assert ev["rank"].tolist() == [-1] and ev["time"].tolist() == [a.times[1]]


def test_backfill_ends_near_now_and_live_paces_in_real_time(embedded_store):
    sc = small(iterations=3)
    before = time.time() * 1000
    truth = simulate(sc, embedded_store, progress=False)
    assert before - 1000 < truth.times_ms[-1] < time.time() * 1000 + 1000
    assert truth.times_ms[0] < truth.times_ms[-1] - 40_000  # spaced by ~27 s iterations
    live = sc.with_overrides(job="live")
    t0 = time.monotonic()
    truth = simulate(live, embedded_store, live=True, speed=200.0, progress=False)
    took = time.monotonic() - t0
    sim_s = ClusterSimulator(live).run_length_ms() / 1000
    assert took >= 0.9 * sim_s / 200
    now = time.time() * 1000
    assert all(now - 5000 < t <= now for t in truth.times_ms)
    gaps = np.diff(truth.times_ms)
    assert np.all(gaps > 0.5 * 27_000 / 200)
    with pytest.raises(ValueError, match="speed"):
        simulate(sc, embedded_store, live=True, speed=0)


def test_default_truth_path(embedded_store, tmp_path, monkeypatch):
    assert default_truth_path(embedded_store, "j") == embedded_store.path.parent / "j.truth.json"
    monkeypatch.chdir(tmp_path)

    class Remote:
        pass
    assert default_truth_path(Remote(), "j") == tmp_path / "j.truth.json"


def test_cli_simulate_writes_points_and_truth(influx_store, tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text("""
[topology]
pp = 2
dp = 16
ep = 8
gpus_per_node = 8
[run]
job = "cli-job"
iterations = 4
[[fault]]
kind = "compute_slowdown"
ranks = "20-21"
stage = "attention"
factor = 3.0
start = 2
[[event]]
name = "ecc warning"
rank = 20
at = 2
""")
    truth_path = tmp_path / "out" / "truth.json"
    rc = cli.main(["simulate", str(path), "--store", influx_store.url, "--bucket", influx_store.bucket,
                   "--truth", str(truth_path), "--start-ms", str(T0), "--iterations", "3"])
    assert rc == 0
    out = capsys.readouterr()
    assert "wrote 3 iterations of job cli-job" in out.out and "iterations" in out.err
    df = influx_store.read_stage_latency("cli-job")
    assert len(df) == 3 * 32 and sorted(df["iteration"].unique()) == [0, 1, 2]
    truth = Truth.from_json(truth_path.read_text())
    assert truth.iterations == 3 and truth.faults[0]["ranks"] == [20, 21] and truth.faults[0]["nodes"] == [2]
    ev = influx_store.read_events("cli-job")
    assert ev["rank"].tolist() == [20] and ev["node"].tolist() == [2]


def test_cli_errors_and_listing(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[topology]\npp = 2\ndp = 16\nep = 8\n[[fault]]\nkind = 'compute_slowdown'\nranks = 99\nfactor = 2\n")
    assert cli.main(["simulate", str(bad), "--store", str(tmp_path / "s.db")]) == 1
    err = capsys.readouterr().err
    assert "line 7" in err and "fault[0].ranks" in err and "rank 99 is outside" in err
    assert cli.main(["simulate", "healthy", "--speed", "3", "--store", str(tmp_path / "s.db")]) == 1
    assert "--speed only applies with --live" in capsys.readouterr().err
    assert cli.main(["scenarios", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert by_name["il-0477"]["ranks"] == 12960 and by_name["il-0477"]["faults"] == ["compute_slowdown@30"]
    assert cli.main(["scenarios"]) == 0
    assert "silent-rank" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--help"])
    assert "ground truth" in capsys.readouterr().out
