"""Data as real collectors write it, and real traces nobody here wrote.

1. Accuracy with the collector shapes on (evaluation.accuracy.COLLECTOR_SHAPES), through the
   points as written and the cycle's assembly of whole iterations: healthy runs and one case
   per fault kind at 12,960 ranks, and a set of random small cases.
2. The read cost per iteration of the cycle (probe times + contiguous time ranges), per-rank
   stamps on, at 12,960 and 100,000 ranks, on the real InfluxDB and the embedded store.
3. The three StragglerAnalysis traces (vendored slices, tests/data/stragglers): the verdicts.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path

from analyzer.service.analyzer_service import AnalyzerService
from analyzer.service.run_once import run_once
from benchmarks.bench_accuracy import _fmt, _kind_table
from evaluation.accuracy import (
    BASE_SIGMAS,
    COLLECTOR_SHAPES,
    Case,
    false_incidents_per_1000,
    generate_case,
    generate_cases,
    run_case_written,
    score_case,
    with_shapes,
)
from rankscope.store import EmbeddedStore, InfluxStore
from simulator.scenario import FAULT_KINDS, Scenario
from simulator.simulate import simulate

SEED = 2027
HEALTHY_BIG = ((1.0, 150), (2.0, 150))
BIG_ITERATIONS = 45
SMALL = 30
#: Healthy jobs by size, shapes on: (tp, pp, dp, ep, gpus_per_node) layouts of each size, each
#: run for HEALTHY_SMALL_ITERATIONS iterations at noise x1 and x2.
SMALL_LAYOUTS = {
    8: ((1, 1, 8, 8, 8), (1, 2, 4, 4, 4), (2, 2, 2, 1, 4)),
    16: ((1, 2, 8, 4, 8), (1, 1, 16, 8, 8), (2, 2, 4, 4, 4)),
    32: ((1, 4, 8, 4, 8), (1, 2, 16, 8, 8), (2, 2, 8, 4, 8)),
    64: ((1, 2, 32, 8, 8), (1, 4, 16, 8, 8), (2, 4, 8, 4, 8)),
    128: ((1, 2, 64, 8, 8), (1, 4, 32, 8, 8), (1, 1, 128, 16, 8)),
    256: ((2, 4, 32, 8, 8), (1, 8, 32, 4, 8), (2, 2, 64, 16, 4)),
    512: ((1, 4, 128, 16, 8), (2, 8, 32, 4, 8), (1, 8, 64, 8, 8)),
}
HEALTHY_SMALL_ITERATIONS = 150
READ_ITERATIONS = 12
T0 = 1_770_000_000_000
DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "stragglers"


def _suite(cases):
    return [score_case(run_case_written(with_shapes(c))) for c in cases]


def _healthy_case(seed: int, layout: tuple[int, ...], noise: float) -> Case:
    tp, pp, dp, ep, gpn = layout
    data = {"topology": {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "gpus_per_node": gpn},
            "run": {"job": f"small-{seed}", "iterations": HEALTHY_SMALL_ITERATIONS, "seed": seed}}
    if noise != 1.0:
        data["model"] = {k: round(v * noise, 4) for k, v in BASE_SIGMAS.items()}
    return Case(seed, data, noise)


def _healthy_by_size() -> tuple[list[str], list[str]]:
    """The table of false incidents per 1,000 healthy iterations by size (noise x1, x2), and
    the false incidents found (seed, layout, class, ranks)."""
    rows = ["| ranks | layouts (tp, pp, dp) | iterations | false, noise x1 | per 1,000 | false, noise x2 | "
            "per 1,000 |", "|---|---|---|---|---|---|---|"]
    found: list[str] = []
    for size, layouts in SMALL_LAYOUTS.items():
        cells = []
        for noise in (1.0, 2.0):
            cases = [_healthy_case(SEED * 1000 + size * 10 + k + int(noise) * 5, lay, noise)
                     for k, lay in enumerate(layouts)]
            scores = _suite(cases)
            n_false, n_it, rate = false_incidents_per_1000(scores)
            cells += [str(n_false), _fmt(rate)]
            found += [f"{size} ranks {s.case.data['topology']} noise x{noise:g} seed {s.case.seed}: "
                      + ", ".join(f"{f.cls.value} {f.ranks}" for f in s.false_incidents)
                      for s in scores if s.false_incidents]
        shapes = ", ".join(f"{t}x{p}x{d}" for t, p, d, _, _ in layouts)
        rows.append(f"| {size} | {shapes} | {n_it:,} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    return rows, found


def _read_cost(store, world_topo: dict, label: str) -> str:
    sc = Scenario.from_dict({"topology": world_topo, "run": {"job": "read", "iterations": READ_ITERATIONS,
                                                            "seed": 1}, "model": COLLECTOR_SHAPES})
    simulate(sc, store, start_ms=T0, progress=False)
    svc = AnalyzerService(store)
    t0 = time.perf_counter()
    rep = svc.cycle(final=True)
    took = time.perf_counter() - t0
    n = rep.iterations.get("read", 0)
    return (f"| {label} | {sc.topology.world:,} | {n} | {rep.read_s / max(n, 1) * 1000:,.0f} ms | "
            f"{took / max(n, 1) * 1000:,.0f} ms |")


def _stragglers() -> list[str]:
    from collector.ops_cli import load, read_meta
    from collector.ops_import import stage_frame

    rows = ["| trace | what the paper says | rankscope's incidents |", "|---|---|---|"]
    said = {"AR": "an injected slow worker", "ST": "a long last pipeline stage", "SE": "sequence-length imbalance "
            "over all workers: no culprit (second to it, a long last stage)"}
    for name in ("AR", "ST", "SE"):
        meta = read_meta(DATA / f"meta-{name}.yaml")
        ops, _ = load([DATA / f"trace-{name}.parquet"])
        with tempfile.TemporaryDirectory() as d, EmbeddedStore(Path(d) / "s.db") as st:
            frame, _ = stage_frame(ops, name.lower(), T0, ranks_per_worker=meta["tp_size"] * meta["dsp_size"])
            st.write_stage_latency(frame)
            incs = run_once(st, name.lower())
        text = "; ".join(f"{i['class']} ranks {i['ranks']} ({i['stage']}, {i['ratio']:.1f}x)" for i in incs) or "none"
        rows.append(f"| {name} | {said[name]} | {text} |")
    return rows


def _small_section(s_small) -> list[str]:
    """Small jobs: the random fault cases' table, and healthy jobs' false incidents by size."""
    sm_false, sm_it, sm_rate = false_incidents_per_1000(s_small)
    false_small = [f"seed {s.case.seed}: " + ", ".join(f"{f.cls.value} {f.ranks}" for f in s.false_incidents)
                   for s in s_small if s.false_incidents]
    by_size, found = _healthy_by_size()
    return [
        f"### {SMALL} random small cases (128-512 ranks), shapes on",
        "",
        *_kind_table(s_small),
        "",
        f"False incidents on the small cases' healthy iterations: {sm_false} in {sm_it:,} ({_fmt(sm_rate)} per "
        "1,000).",
        *(["", "Incidents matching no fault (small cases): " + "; ".join(false_small)] if false_small else []),
        "",
        "### Healthy jobs of 8-512 ranks, shapes on: false incidents per 1,000 iterations by size",
        "",
        f"Three layouts a size, {HEALTHY_SMALL_ITERATIONS} iterations each, at noise x1 and x2 (iterations per "
        "noise level). A sporadic one-iteration 1.5-3x stall costs a job of 8-64 GPUs 20-40% of that "
        "iteration and a 12,960-rank job nothing (it waits for some rank's stall every iteration): noise, "
        "counted in `job_health`. A transient stall is an incident when the job lost half an iteration to it "
        "(`stall_min_excess`, its own iteration's share: the same at every size), or when it repeats, or is "
        "wider or longer than the job's own stall rate explains by chance on any rank of the job "
        "(`stall_repeat_alpha`).",
        "",
        *by_size,
        *(["", "False incidents (healthy jobs by size): " + "; ".join(found)] if found else []),
    ]


def run(ctx) -> str:
    t0 = time.perf_counter()
    healthy = [generate_case(SEED * 20 + i, healthy_share=1.0, big=True, iterations=n, noise=noise)
               for i, (noise, n) in enumerate(HEALTHY_BIG)]
    big = [generate_case(SEED * 10 + i, kinds=(k,), healthy_share=0.0, overlap_share=0.0, big=True,
                         iterations=BIG_ITERATIONS, noise=1.0) for i, k in enumerate(FAULT_KINDS)]
    s_h, s_big = _suite(healthy), _suite(big)
    small = _small_section(_suite(generate_cases(SEED, SMALL)))
    t_acc = time.perf_counter() - t0
    h_false, h_it, h_rate = false_incidents_per_1000(s_h)
    reads = ["| store | ranks | iterations | read per iteration | whole cycle per iteration |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as d:
        reads.append(_read_cost(EmbeddedStore(Path(d) / "s.db"), {"tp": 1, "pp": 9, "dp": 1440, "ep": 32,
                                                                  "gpus_per_node": 8}, "embedded"))
    for topo in ({"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8},
                 {"tp": 1, "pp": 10, "dp": 10000, "ep": 16, "gpus_per_node": 8}):
        st = InfluxStore(ctx.influx_url, bucket=f"shapes_{uuid.uuid4().hex[:8]}", api="v1")
        try:
            reads.append(_read_cost(st, topo, "InfluxDB 1.6.7"))
        finally:
            st.drop_database()
            st.close()
    straggler_rows = _stragglers()
    shapes = ", ".join(f"{k} {v:g}" for k, v in COLLECTOR_SHAPES.items())
    return "\n".join([
        "## Real collectors' data and real traces",
        "",
        f"Collector shapes on ({shapes}): each rank stamps its own clock, host clocks up to 2 s apart, "
        "1% of points dropped, 0.2% of rank-iterations stalled 1.5-3x in attention for one iteration, "
        "MoE expert load imbalance and per-GPU speed bias. Every case runs through the points as written "
        "(`evaluation.accuracy.run_case_written`: a reader sees the points stamped up to each iteration's "
        "time; the cycle's `IterationAssembler` hands on whole iterations).",
        "",
        f"**False incidents per 1,000 healthy iterations at 12,960 ranks with the shapes on: {_fmt(h_rate)}** "
        f"({h_false} in {h_it:,} iterations, noise x1 and x2). Target 0.",
        "",
        "### 12,960 ranks, one case per fault kind, shapes on",
        "",
        *_kind_table(s_big),
        "",
        *small,
        "",
        "### Read cost of the cycle per iteration, per-rank stamps on",
        "",
        f"{READ_ITERATIONS} iterations written by the simulator with the shapes on, one `cycle(final=True)`; "
        "read = the store's `next_times` (one probe series) and the contiguous time ranges.",
        "",
        *reads,
        "",
        "### StragglerAnalysis traces (ByteDance-Seed, Apache-2.0; vendored slices)",
        "",
        *straggler_rows,
        "",
        f"Accuracy part {t_acc:.0f} s.",
    ])
