"""The cluster day's schedule (simulator/fleet.py): sizes, lifecycles, faults, determinism.

Built without the simulator's model where it does not matter (a job's iteration time from
its size), so the default 60-job fleet is drawn in a fraction of a second; one small fleet is
built with measured iteration times and written to the embedded store, to check what the
writer writes (iteration numbers after a rewind, the ``attempt`` field, hosts after a swap).
"""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.config import AnalyzerConfig
from rankscope.store import EmbeddedStore
from simulator.cluster import ClusterSimulator
from simulator.fleet import FleetConfig, build_fleet, iteration_target_s
from simulator.fleet_jobs import PLACEMENTS, FaultPlan
from simulator.fleet_run import FleetTruth, write_fleet
from simulator.fleet_scenarios import (
    ANALYZER_WARMUP,
    NODE_KINDS,
    STALL_MIN_EXCESS,
    lost_iterations,
    segment_scenario,
    segment_simulator,
    stall_factor_floor,
    warmed,
)


def _target(job) -> float:
    return iteration_target_s(job.world)


@pytest.fixture(scope="module")
def fleet():
    return build_fleet(FleetConfig(), iteration_s=_target)


def test_sizes_and_total_ranks(fleet) -> None:
    sizes = [j.world for j in fleet.jobs]
    assert len(sizes) == 60
    assert min(sizes) >= 8 and max(sizes) == 12_960 and sizes.count(12_960) == 1
    assert 90_000 <= sum(sizes) <= 110_000
    assert sum(s <= 64 for s in sizes) >= 5 and sum(s > 4096 for s in sizes) >= 3   # every size bucket
    for job in fleet.jobs:
        topo = job.layout.topology()
        assert topo.world == job.world and topo.world % 8 == 0
        assert 1.0 <= job.iteration_s <= 35.0


def test_every_lifecycle_kind_is_there(fleet) -> None:
    life = fleet.lifecycle()
    assert all(life[k] >= 1 for k in ("start", "restart", "shrink", "swap", "end", "reuse")), life
    for job in fleet.jobs:
        for prev, seg in zip(job.segments, job.segments[1:], strict=False):
            assert 60 <= seg.downtime_s <= 600
            assert seg.first_iteration % job.checkpoint_every == 0   # back to a checkpoint
            assert seg.first_iteration <= prev.end_iteration == seg.high_water
            assert seg.attempt == prev.attempt + 1
            if seg.cause == "shrink":
                assert seg.dp < prev.dp and set(seg.hosts) < set(prev.hosts)
            if seg.cause == "swap":
                assert sum(a != b for a, b in zip(prev.hosts, seg.hosts, strict=True)) == 1
    assert sum(s.rerun > 0 for j in fleet.jobs for s in j.segments) >= 10


def test_a_name_is_reused_long_after_its_job_ended(fleet) -> None:
    later = [j for j in fleet.jobs if j.instance == 1]
    assert len(later) == 1
    first = next(j for j in fleet.jobs if j.name == later[0].name and j.instance == 0)
    assert later[0].start_s - first.end_s >= fleet.config.reuse_gap == 7200.0
    assert later[0].layout != first.layout


def test_faults_are_placed_where_asked(fleet) -> None:
    assert len(fleet.faults) == 60
    assert {p.placement for p in fleet.faults} == set(PLACEMENTS)
    for p in fleet.faults:
        seg = fleet.jobs[p.job].segments[p.segment]
        assert 0 < p.start < p.end <= seg.iterations
        assert max(p.ranks) < fleet.jobs[p.job].layout.topology(seg.dp).world
        if p.placement == "rerun_window":
            assert seg.attempt >= 1 and warmed(seg) < p.start and p.end <= seg.rerun
        if p.placement == "after_restart":
            assert seg.attempt >= 1 and warmed(seg) < p.start <= warmed(seg) + 5
        topo = fleet.jobs[p.job].layout.topology(seg.dp)
        assert len(p.ranks) <= topo.world // 2   # at most half of the job
        assert topo.nodes > 1 or p.kind not in NODE_KINDS   # a job of one node: no node-wide fault
    by_seg: dict = {}
    for p in fleet.faults:   # one at a time in a segment
        by_seg.setdefault((p.job, p.segment), []).append((p.start, p.end))
    for windows in by_seg.values():
        windows.sort()
        assert all(a[1] <= b[0] for a, b in zip(windows, windows[1:], strict=False))
    assert len({p.job for p in fleet.faults}) >= 40   # spread over the jobs


def test_faults_after_a_restart_begin_after_the_analyzers_warm_up() -> None:
    """The iterations the analyzer leaves out after a restart, as the fleet knows them."""
    assert ANALYZER_WARMUP == AnalyzerConfig().restart_warmup


def test_transient_stalls_cost_what_the_analyzer_calls_an_incident(fleet) -> None:
    """A sporadic stall costing less than ``stall_min_excess`` of an iteration is job_health
    noise by the analyzer's rule: the fleet's stalls are sized to cost more."""
    assert STALL_MIN_EXCESS == AnalyzerConfig().stall_min_excess
    stalls = [p for p in fleet.faults if p.kind == "transient_stall"]
    assert stalls
    for p in stalls:
        assert p.factor >= round(stall_factor_floor(fleet.jobs[p.job], p.end - p.start), 2) - 0.01


def test_a_stall_at_its_floor_costs_its_job_enough() -> None:
    """Simulated, a stall at its smallest factor costs its job over ``stall_min_excess``
    (small and larger jobs, pipelines, two and three iterations)."""
    small = build_fleet(FleetConfig(jobs=4, ranks=700, max_ranks=512, hours=0.5, seed=5))
    for job in small.jobs:
        for n in (2, 3):
            plan = FaultPlan(job.index, 0, "transient_stall", "attention", stall_factor_floor(job, n), (3,), 20,
                             20 + n, "normal")
            sim = segment_simulator(job, 0, [plan], small.config.seed)
            times = [sim.step().time_ms for _ in range(24)]
            assert lost_iterations(times, 20, 20 + n) >= 1.2 * STALL_MIN_EXCESS, (job.world, n)


def test_a_gpus_speed_belongs_to_its_host() -> None:
    """A host keeps its GPUs' speed biases over a job's attempts (a shrink keeps the hosts it
    keeps, a swap brings one new host with its own); the attempt's seed does not redraw them."""
    small = build_fleet(FleetConfig(jobs=4, ranks=160, max_ranks=64, hours=0.5, seed=3))
    seen: dict[tuple[str, int], float] = {}
    swapped = 0
    for job in small.jobs:
        for k, seg in enumerate(job.segments):
            sim = segment_simulator(job, k, small.faults, small.config.seed)
            own = ClusterSimulator(segment_scenario(job, k, small.faults)).gpu_speed
            topo = sim.topology
            assert not np.allclose(sim.gpu_speed, own)
            assert np.all(np.abs(np.log(sim.gpu_speed)) <= 3 * sim.params.gpu_speed_sigma + 1e-12)
            for r in range(topo.world):
                key = (seg.hosts[topo.node_index[r]], int(topo.local_index[r]))
                assert seen.setdefault(key, float(sim.gpu_speed[r])) == float(sim.gpu_speed[r])
            if seg.cause == "swap":
                new = set(seg.hosts) - set(job.segments[k - 1].hosts)
                assert len(new) == 1
                swapped += 1
    assert swapped and len(set(seen.values())) == len(seen)   # every GPU its own draw


def test_the_same_seed_draws_the_same_fleet(fleet) -> None:
    again = build_fleet(FleetConfig(), iteration_s=_target)
    assert [(j.name, j.layout, j.segments) for j in again.jobs] == [(j.name, j.layout, j.segments) for j in fleet.jobs]
    assert again.faults == fleet.faults
    other = build_fleet(FleetConfig(seed=7), iteration_s=_target)
    assert [j.world for j in other.jobs] != [j.world for j in fleet.jobs]


def test_config_from_the_environment() -> None:
    cfg = FleetConfig.from_env({"RANKSCOPE_FLEET_JOBS": "6", "RANKSCOPE_FLEET_HOURS": "0.5",
                                "RANKSCOPE_FLEET_RANKS": "2000", "RANKSCOPE_FLEET_MAX_RANKS": " "})
    assert (cfg.jobs, cfg.hours, cfg.ranks, cfg.max_ranks) == (6, 0.5, 2000, 12_960)
    assert cfg.reuse_gap == 0.6 * 1800


def test_a_small_day_as_written(tmp_path) -> None:
    """A small day in the embedded store: each attempt's rows carry its own iteration numbers
    (back to the checkpoint after a restart) and hosts, later stamps, the ``attempt`` field on
    the jobs that write it; the truth's faults lie in their attempts; the truth reads back."""
    fleet = build_fleet(FleetConfig(jobs=4, ranks=160, max_ranks=64, hours=0.5, seed=3))
    assert {s.cause for j in fleet.jobs for s in j.segments} == {"start", "restart", "shrink", "swap"}
    with EmbeddedStore(tmp_path / "s.db") as store:
        truth = write_fleet(fleet, store, start_ms=1_770_000_000_000, progress=False)
        frames = {name: store.read_stage_latency(name) for name in {j.name for j in truth.jobs}}
    assert truth.points == sum(len(f) for f in frames.values()) and len(truth.faults) == 4
    for job, run in zip(fleet.jobs, truth.jobs, strict=True):
        df = frames[job.name]
        assert np.all(np.diff(run.times()) > 0)
        for seg, sr in zip(job.segments, run.segments, strict=True):
            rows = df[(df["time"] >= sr.start_ms) & (df["time"] <= sr.end_ms + 2_000)]
            assert rows["iteration"].min() == seg.first_iteration
            assert rows["iteration"].max() == seg.end_iteration - 1
            assert set(rows["host"]) == set(seg.hosts) and rows["rank"].max() == sr.world - 1
            if job.attempt_field:
                assert (rows["attempt"] == seg.attempt).all()
            else:
                assert "attempt" not in rows or rows["attempt"].isna().all()
    for f in truth.faults:
        run = next(r for r in truth.jobs if (r.name, r.instance) == (f.job, f.instance))
        sr = run.segments[f.attempt]
        assert sr.times_ms[0] <= f.onset_ms <= f.end_ms <= sr.times_ms[-1] and f.hosts
        if f.kind == "transient_stall":
            assert f.lost >= STALL_MIN_EXCESS
    back = FleetTruth.read(truth.write(tmp_path / "truth.json"))
    assert back.faults == truth.faults and back.jobs == truth.jobs
