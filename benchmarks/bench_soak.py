"""Soak: an always-on analyzer's memory over 10,000 iterations of a 12,960-rank job.

The IL-0477 topology is simulated in memory and fed iteration by iteration to one
``JobAnalyzer`` (no database), with faults that come and go all along (transient
stalls, a straggler that returns every 1,500 iterations, a rank that goes silent now
and then) and an out-of-band event every 50 iterations, so incidents open, resolve
and age, and events arrive and age. Resident memory (``/proc/self/statm``) is sampled
every 500 iterations; after warm-up it must stay flat.

``RANKSCOPE_BENCH_SOAK_ITERATIONS`` (default 10,000) sets the run length.
"""

from __future__ import annotations

import os
import time

import numpy as np

from analyzer.diagnosis.event_verdicts import OutOfBandEvent
from analyzer.job_analyzer import JobAnalyzer
from evaluation.accuracy import result_cube
from rankscope.schema import DEFAULT_STAGES
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario

ITERATIONS = int(os.environ.get("RANKSCOPE_BENCH_SOAK_ITERATIONS", "10000"))
SAMPLE_EVERY = 500
WARM_UP = 1000


def scenario(iterations: int) -> Scenario:
    """IL-0477's job with faults that recur over the whole run."""
    return Scenario.from_dict({
        "topology": {"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8},
        "run": {"job": "soak", "iterations": iterations, "seed": 11},
        "fault": [
            {"kind": "transient_stall", "ranks": "4000-4003", "stage": "attention", "factor": 20.0,
             "start": 300, "end": 302, "every": 700, "repeats": max(1, iterations // 700)},
            {"kind": "compute_slowdown", "node": 1294, "stage": "mlp", "factor": 4.0,
             "start": 1000, "end": 1030, "every": 1500, "repeats": max(1, iterations // 1500)},
            {"kind": "silent_rank", "ranks": 777, "start": 2000, "end": 2010, "every": 2500,
             "repeats": max(1, iterations // 2500)},
        ]})


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run(ctx) -> str:
    sc = scenario(ITERATIONS)
    sim = ClusterSimulator(sc, start_ms=1_700_000_000_000)
    ja = JobAnalyzer(sc.job, sc.topology, DEFAULT_STAGES)
    hosts = sc.topology.hosts or ()
    samples: list[tuple[int, float, int, int]] = []
    seen: set[str] = set()
    t0 = time.perf_counter()
    for i in range(ITERATIONS):
        res = sim.step()
        if i % 50 == 0:
            ja.add_events([OutOfBandEvent(res.time_ms, "server port down", host=hosts[(i // 50) % len(hosts)])])
        for inc in ja.feed(result_cube(res, sim.stages.names)).incidents:
            seen.add(inc.id)
        if (i + 1) % SAMPLE_EVERY == 0:
            samples.append((i + 1, rss_mib(), len(ja.incidents()), len(ja._diag.book.events)))
    took = time.perf_counter() - t0
    after = [s for s in samples if s[0] >= WARM_UP]
    rss = np.array([s[1] for s in after])
    growth = rss[-1] - rss[0]
    rows = "\n".join(f"| {n:,} | {m:.0f} MiB | {k} | {e} |" for n, m, k, e in samples)
    return f"""## Soak: memory of an always-on analyzer

`benchmarks/bench_soak.py`: {ITERATIONS:,} iterations of a 12,960-rank job (IL-0477 topology) fed
to one analyzer in memory, with faults that come and go all along (a transient stall every 700
iterations, a straggler node every 1,500, a silent rank every 2,500) and an out-of-band event
every 50 iterations: {len(seen)} incidents over the run. Resident memory of the process
(`/proc/self/statm`, simulator included) every {SAMPLE_EVERY} iterations; incidents and events
the analyzer holds in memory at that point.

| iteration | resident memory | incidents held | events held |
|---|---|---|---|
{rows}

After warm-up (iteration {WARM_UP:,} on): **{rss[0]:.0f} MiB at the start, {rss[-1]:.0f} MiB at the
end ({growth:+.0f} MiB over {after[-1][0] - after[0][0]:,} iterations; max {rss.max():.0f} MiB)**.
Run time {took / 60:.1f} min ({took / ITERATIONS * 1000:.0f} ms per iteration, simulator included).
"""
