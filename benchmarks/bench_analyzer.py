"""Analyzer: cycle cost at 12,960 and 100,000 ranks (database read measured apart)."""

from __future__ import annotations

import time
import uuid

from analyzer.engine import JobAnalyzer
from rankscope.frames import frame_to_cube
from rankscope.schema import DEFAULT_STAGES
from rankscope.store import InfluxStore
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario

SIZES = {
    "12,960 (IL-0477: tp=1 pp=9 dp=1440 ep=32)": {"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8},
    "100,000 (tp=8 pp=10 dp=1250 ep=25)": {"tp": 8, "pp": 10, "dp": 1250, "ep": 25, "gpus_per_node": 8},
}


def _cubes(topo_dict: dict, n: int):
    sc = Scenario.from_dict({"topology": topo_dict, "run": {"job": "bench", "iterations": n, "seed": 1}})
    sim = ClusterSimulator(sc)
    frames = [sim.frame(sim.step()) for _ in range(n)]
    world = sc.topology.world
    return sc, [frame_to_cube(f, world, DEFAULT_STAGES.names) for f in frames], frames


def run(ctx) -> str:
    rows = []
    per_world = {}
    for label, topo in SIZES.items():
        sc, cubes, frames = _cubes(topo, 45)
        # steady state: warm up on 20 iterations, then one new iteration + the L2 points per cycle
        ja = JobAnalyzer("bench", sc.topology, DEFAULT_STAGES)
        for c in cubes[:20]:
            ja.feed(c)
        it = iter(cubes[20:])

        def cycle(ja=ja, it=it):
            ja.feed(next(it))
            ja.l2_frames()

        steady = ctx.median_s(cycle, repeat=min(ctx.repeat, 10), warmup=1)

        # a whole 20-iteration window in one cycle (a cycle after a 20-iteration gap)
        def window(sc=sc, cubes=cubes):
            fresh = JobAnalyzer("bench", sc.topology, DEFAULT_STAGES)
            t0 = time.perf_counter()
            for c in cubes[:20]:
                fresh.feed(c)
            fresh.l2_frames()
            return time.perf_counter() - t0

        win = min(window() for _ in range(2))
        per_world[label] = (sc.topology.world, steady, win)
        rows.append(f"| {label} | {steady * 1000:.0f} ms | {win:.2f} s | {win / 20 * 1000:.0f} ms |")

    (w1, s1, v1), (w2, s2, v2) = per_world.values()
    read = _read_time(ctx)
    return f"""## Analyzer

One analyzer cycle (L1 + L2 + diagnosis + the L2 points to write), in memory, without the
database. *Steady state*: the cycle that processes the one new iteration (a 30-90 s iteration
and a 30 s cycle), plus the `l2_group`/`l2_rank` frames over the last 5 iterations. *20-iteration
window*: a fresh analyzer processing a whole 20-iteration window in one cycle (the worst case:
after a gap, or at start-up).

| ranks | steady-state cycle (median) | 20-iteration window | per iteration |
|---|---|---|---|
{chr(10).join(rows)}

Scaling from {w1:,} to {w2:,} ranks ({w2 / w1:.1f}x the ranks): steady-state cycle {s2 / s1:.1f}x,
20-iteration window {v2 / v1:.1f}x (linear would be {w2 / w1:.1f}x). Target: a cycle over 12,960
ranks x 10 stages x 20 iterations in <= 0.5 s without the read.

Database read, reported apart: {read}
"""


def _read_time(ctx) -> str:
    if not ctx.influx_url:
        return "(no InfluxDB)"
    sc, _, frames = _cubes(SIZES["12,960 (IL-0477: tp=1 pp=9 dp=1440 ep=32)"], 20)
    store = InfluxStore(ctx.influx_url, f"bench_{uuid.uuid4().hex[:8]}", api="v1")
    try:
        for i, f in enumerate(frames):
            f["time"] = 1_700_000_000_000 + 30_000 * i
            store.write_stage_latency(f)
        t = ctx.median_s(lambda: store.read_stage_latency("bench"), repeat=3, warmup=1)
        return (f"the 20-iteration window of 12,960 ranks ({20 * 12960:,} points) from InfluxDB 1.6.7 "
                f"over `/query` as CSV: median {t:.2f} s.")
    finally:
        store.drop_database()
        store.close()
