"""Soak: an always-on analyzer's memory over 10,000 iterations of a 12,960-rank job.

The IL-0477 topology is simulated in memory and fed iteration by iteration to one
``JobAnalyzer`` (no database), with faults that come and go all along (transient
stalls, a straggler that returns every 1,500 iterations, a rank that goes silent now
and then) and an out-of-band event every 50 iterations, so incidents open, resolve
and age, and events arrive and age. Resident memory (``/proc/self/statm``) is sampled
every 500 iterations and, in each of those stretches, also at the first iteration at
which an incident is open (so that memory is measured while incidents are held, not only
between them); after warm-up it must stay flat.

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
    samples: list[tuple[int, float, int, int, int, str]] = []
    seen: set[str] = set()
    open_sampled = False   # this stretch of SAMPLE_EVERY iterations has had its open-incident sample
    t0 = time.perf_counter()
    for i in range(ITERATIONS):
        res = sim.step()
        if i % 50 == 0:
            ja.add_events([OutOfBandEvent(res.time_ms, "server port down", host=hosts[(i // 50) % len(hosts)])])
        for inc in ja.feed(result_cube(res, sim.stages.names)).incidents:
            seen.add(inc.id)
        held = ja.incidents()
        n_open = sum(inc.is_open for inc in held)
        regular = (i + 1) % SAMPLE_EVERY == 0
        if regular or (n_open and not open_sampled):
            samples.append((i + 1, rss_mib(), len(held), n_open, len(ja._diag.book.events),
                            "every 500" if regular else "incident open"))
            open_sampled = open_sampled or bool(n_open)
        if regular:
            open_sampled = False
    took = time.perf_counter() - t0
    after = [s for s in samples if s[0] >= WARM_UP]
    rss = np.array([s[1] for s in after])
    regular_rss = np.array([s[1] for s in after if s[5] == "every 500"])
    growth = regular_rss[-1] - regular_rss[0]
    with_open = [s for s in samples if s[3]]
    open_rss = max((s[1] for s in with_open), default=float("nan"))
    rows = "\n".join(f"| {n:,} | {why} | {m:.0f} MiB | {k} | {o} | {e} |" for n, m, k, o, e, why in samples)
    return f"""## Soak: memory of an always-on analyzer

`benchmarks/bench_soak.py`: {ITERATIONS:,} iterations of a 12,960-rank job (IL-0477 topology) fed
to one analyzer in memory, with faults that come and go all along (a transient stall every 700
iterations, a straggler node every 1,500, a silent rank every 2,500) and an out-of-band event
every 50 iterations: {len(seen)} incidents over the run. Resident memory of the process
(`/proc/self/statm`, simulator included) every {SAMPLE_EVERY} iterations and, within each of those
stretches, at the first iteration at which an incident is open; the incidents the analyzer holds
in memory at that point (open and recently resolved), how many of them are open, and the events
it holds.

| iteration | sampled | resident memory | incidents held | of which open | events held |
|---|---|---|---|---|---|
{rows}

{len(with_open)} of the {len(samples)} samples were taken with incidents open (at most
{max((s[3] for s in samples), default=0)} open and {max((s[2] for s in samples), default=0)} held at once;
max resident memory among them {open_rss:.0f} MiB).
After warm-up (iteration {WARM_UP:,} on), sampled every {SAMPLE_EVERY}: **{regular_rss[0]:.0f} MiB at the
start, {regular_rss[-1]:.0f} MiB at the end ({growth:+.0f} MiB over {after[-1][0] - after[0][0]:,} iterations;
max {rss.max():.0f} MiB over every sample)**.
Run time {took / 60:.1f} min ({took / ITERATIONS * 1000:.0f} ms per iteration, simulator included).
"""
