"""Collector overhead: what the stage timer and the writer add to a training step.

Three measurements:

1. The hot-path cost in isolation (one process, the real writer on the real
   InfluxDB behind it): a timed region (``with timer.stage(...)``), and a whole
   instrumented iteration's bookkeeping (the demo's 7 intervals + ``step()`` +
   ``put()``), against the demo's step time; and the module hooks on the demo
   model (forward, forward+backward) against the bare model.
2. One real 8-process gloo DDP run on CPU whose timer is paused (module hooks
   removed, no regions, no points) in every other block of 5 iterations: the
   median step of the instrumented blocks against the paused ones, per rank.
   Neighbouring blocks share the machine's state, so this is the tightest
   end-to-end figure; it leaves out only the switch from DDP's built-in C++
   all-reduce hook to the Python timing hook (which stays installed).
3. Whole runs instrumented and not, alternated (a, b, a, b, ...): everything
   included, but on 2 shared cores the run-to-run spread is several percent.
"""

from __future__ import annotations

import statistics
import time
import uuid

from collector.coordinates import RankCoordinates
from collector.stage_timer import StageTimer
from collector.writer import BackgroundWriter
from evaluation.torch_demo import DemoConfig, run_demo
from rankscope.store import InfluxStore
from rankscope.topology import Topology

PAIRS = 2
ITERATIONS = 50
AB_ITERATIONS, AB_BLOCK, AB_RUNS = 160, 5, 3


def _hot_path(ctx, store) -> tuple[float, float]:
    """(µs per timed region, µs per instrumented iteration's bookkeeping)."""
    coords = RankCoordinates.from_topology(Topology(dp=8, gpus_per_node=4), 0, "bench-collector")
    writer = BackgroundWriter(store, flush_interval_s=0.2, capacity=200_000)
    timer = StageTimer(coords, sink=writer.put)
    n = 20_000

    def regions() -> None:
        for _ in range(n):
            with timer.stage("mlp"):
                pass
        timer.reset()

    def iterations() -> None:
        for _ in range(n // 10):
            for name in ("dataloader", "attention", "mlp", "attention", "mlp", "reduce_scatter",
                         "optimizer"):
                with timer.stage(name):
                    pass
            timer.step()

    region_us = ctx.median_s(regions) / n * 1e6
    iteration_us = ctx.median_s(iterations) / (n // 10) * 1e6
    stats = writer.close()
    if stats.dropped or stats.failures:
        raise RuntimeError(f"benchmark writer lost points: {stats}")
    return region_us, iteration_us


def _module_hooks(n: int = 400) -> dict[str, float]:
    """Median seconds of the demo model's forward+backward in one process (1 thread),
    iteration by iteration in turn: no hooks, forward hooks, forward+backward timing
    (on ``attention`` and ``mlp``; timers paused and resumed between iterations)."""
    import torch

    from evaluation.torch_demo import build_model

    torch.set_num_threads(1)
    cfg = DemoConfig()
    model = build_model(cfg)
    x = torch.randn(cfg.batch, cfg.seq, cfg.d_model)
    coords = RankCoordinates.from_topology(Topology(dp=1, gpus_per_node=1), 0, "bench-hooks")
    timers = {}
    for key, backward in (("forward", False), ("forward+backward", True)):
        t = timers[key] = StageTimer(coords, sink=None)
        t.time_module(model.attention, "attention", backward=backward)
        t.time_module(model.mlp, "mlp", backward=backward)
        t.pause()
    samples: dict[str, list[float]] = {"bare": [], **{k: [] for k in timers}}
    for i in range(n):
        for key in samples:
            t = timers.get(key)
            if t is not None:
                t.resume()
            t0 = time.perf_counter()
            model(x).backward()
            if i >= 20:
                samples[key].append(time.perf_counter() - t0)
            if t is not None:
                t.step()
                t.pause()
    return {k: statistics.median(v) for k, v in samples.items()}


def _demo_step_s(cfg: DemoConfig) -> float:
    res = run_demo(cfg)
    # per rank: median step after the first 5; then the median over ranks
    return statistics.median(statistics.median(r.step_s[5:]) for r in res.ranks)


def run(ctx) -> str:
    bucket = f"bench_collector_{uuid.uuid4().hex[:6]}"
    store = InfluxStore(ctx.influx_url, bucket, api="v1", retries=0, timeout_s=10)
    try:
        region_us, iteration_us = _hot_path(ctx, store)
        hooks = _module_hooks()
        base = dict(store=ctx.influx_url, bucket=bucket, iterations=ITERATIONS, slow_rank=None)
        ab_on, ab_off, ab_ratios = [], [], []
        for k in range(AB_RUNS):
            ab = run_demo(DemoConfig(job=f"bench-ab-{k}", store=ctx.influx_url, bucket=bucket,
                                     iterations=AB_ITERATIONS, ab_block=AB_BLOCK, slow_rank=None))
            on = statistics.median(statistics.median(
                [s for s, i in list(zip(r.step_s, r.instrumented, strict=True))[2 * AB_BLOCK:] if i])
                for r in ab.ranks)
            off = statistics.median(statistics.median(
                [s for s, i in list(zip(r.step_s, r.instrumented, strict=True))[2 * AB_BLOCK:] if not i])
                for r in ab.ranks)
            ab_on.append(on)
            ab_off.append(off)
            ab_ratios.append(on / off)
            print(f"  A/B run {k + 1}/{AB_RUNS}: {ab_ratios[-1]:.3f}", flush=True)
        samples: dict[str, list[float]] = {"without": [], "with": []}
        t0 = time.perf_counter()
        for k in range(PAIRS):
            for label, instrument in (("without", False), ("with", True)):
                cfg = DemoConfig(job=f"bench-{label}-{k}", instrument=instrument, **base)
                samples[label].append(_demo_step_s(cfg))
            print(f"  pair {k + 1}/{PAIRS}: without {samples['without'][-1] * 1e3:.1f} ms, "
                  f"with {samples['with'][-1] * 1e3:.1f} ms ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
    finally:
        store.drop_database()
        store.close()
    without = statistics.median(samples["without"])
    with_ = statistics.median(samples["with"])
    ratios = [w / o for w, o in zip(samples["with"], samples["without"], strict=True)]
    pair_ratio = statistics.median(ratios)
    hot_pct = iteration_us / (without * 1e6) * 100
    return "\n".join([
        "## Collector overhead (stage timer + background writer)",
        "",
        "Target: instrumentation adds <= 1% to the step time (ARGUS reports < 2% always-on).",
        "",
        "| measurement | median |",
        "| --- | --- |",
        f"| one timed region (`with timer.stage(...)`) | {region_us:.2f} µs |",
        f"| one iteration's bookkeeping (7 intervals + `step()` + `put()`) | {iteration_us:.1f} µs |",
        f"| demo step time, uninstrumented (8 ranks, gloo, CPU) | {without * 1e3:.1f} ms |",
        f"| **hot-path share of the step** | **{hot_pct:.3f} %** |",
        "",
        "Module hooks on the demo model (`attention` and `mlp` blocks), one process, one thread, "
        "forward+backward, the three variants in turn iteration by iteration (380 each):",
        "",
        "| hooks | median | added per iteration | vs the demo step |",
        "| --- | --- | --- | --- |",
        *[f"| {k} | {v * 1e3:.2f} ms | {(v - hooks['bare']) * 1e3:+.3f} ms | "
          f"{(v - hooks['bare']) / without * 100:+.2f} % |" for k, v in hooks.items()],
        "",
        f"{AB_RUNS} real 8-process gloo DDP runs of {AB_ITERATIONS} iterations, timer paused in "
        f"every other block of {AB_BLOCK} (first {2 * AB_BLOCK} iterations left out; per run the "
        "median over ranks of each rank's median step):",
        "",
        "| blocks | median step time |",
        "| --- | --- |",
        f"| timer paused | {statistics.median(ab_off) * 1e3:.1f} ms |",
        f"| timer on (regions, module hooks, comm timing, points to InfluxDB) | "
        f"{statistics.median(ab_on) * 1e3:.1f} ms |",
        f"| **on / paused, median of the runs** | **{statistics.median(ab_ratios):.3f}** "
        f"(runs: {', '.join(f'{r:.3f}' for r in ab_ratios)}) |",
        "",
        f"Whole runs, {ITERATIONS} iterations each, {PAIRS} of each, alternated "
        "(median over ranks of each rank's median step):",
        "",
        "| run | median step time |",
        "| --- | --- |",
        f"| without instrumentation | {without * 1e3:.1f} ms |",
        f"| with stage timer, DDP comm hook and writer to InfluxDB | {with_ * 1e3:.1f} ms |",
        f"| ratio of the medians | {with_ / without:.3f} |",
        f"| **median of the per-pair ratios** | **{pair_ratio:.3f}** "
        f"(pairs: {', '.join(f'{r:.3f}' for r in ratios)}) |",
        "",
        "On 2 shared cores running 8 processes, end-to-end ratios move by about +-5% from run "
        "to run (an A/B run and the next one: 0.998 then 1.061, same code): they bound the "
        "overhead to a few percent; the in-process figures above resolve it.",
    ])
