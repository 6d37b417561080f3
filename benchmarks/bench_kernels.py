"""Kernel-level diagnosis (L3): the compression and the analysis at fleet scale, without the database.

1. Compression (``collector.kernel_modes.compress``): time for 10^5 events of one kernel, the
   modes kept, and how far the rebuilt p50 and p99 are from the raw ones on three shapes.
2. Bytes per rank and window: a ``kernel_stats`` point of 16 kernels + other as line protocol,
   against the window's events as a Chrome trace (torch.profiler's export, ~250 bytes an event).
3. The analysis (``analyzer.score.kernel_scores.kernel_findings``) on one window of 12,960 ranks
   (IL-0477's layout, DP groups of 1,440) x 200 kernels, half of them bimodal, one rank's
   kernel made 1.5x slow: median time of 3, and what it found.

The overhead of the channel on a GPU (CUPTI/Kineto windows) is not measured here: no GPU.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd

from analyzer.score.kernel_scores import kernel_findings
from collector.kernel_channel import KernelChannel
from collector.kernel_modes import compress
from rankscope import schema
from rankscope.kernel_mixture import rebuild_quantiles
from rankscope.lineprotocol import encode_frame
from rankscope.topology import Topology

TOPO = Topology(tp=1, pp=9, dp=1440, ep=32, gpus_per_node=8)
KERNELS, SLOW_RANK, SLOW_KERNEL = 200, 10352, 17
TAGS = {"job": "il0477-pretrain", "rank": SLOW_RANK, "pp": 7, "dp": 256, "tp": 0, "ep_group": 8, "node": 1294,
        "host": "gpu-node-01294", "gpu": 0}


def _shapes(rng) -> dict[str, np.ndarray]:
    return {
        "one mode (GEMM)": rng.lognormal(np.log(1200), 0.04, 100_000),
        "two modes 9:1 (collective that waits)": np.r_[rng.lognormal(np.log(800), 0.05, 90_000),
                                                      rng.lognormal(np.log(2400), 0.08, 10_000)],
        "long tail (elementwise)": rng.gamma(2.0, 15.0, 100_000) + 5.0,
    }


def _compression(ctx) -> list[str]:
    rng = np.random.default_rng(7)
    rows = ["| shape | events | modes | compress (median of 5) | p50 raw -> rebuilt | p99 raw -> rebuilt |",
            "|---|---:|---:|---:|---|---|"]
    for name, d in _shapes(rng).items():
        t = ctx.median_s(lambda d=d: compress(d), repeat=5)
        modes = compress(d)
        raw = np.quantile(d, [0.5, 0.99])
        rebuilt = rebuild_quantiles(modes, [0.5, 0.99])
        err = np.abs(rebuilt / raw - 1) * 100
        rows.append(f"| {name} | {len(d):,} | {len(modes)} | {t * 1000:.1f} ms | {raw[0]:.0f} -> {rebuilt[0]:.0f} us "
                    f"({err[0]:.1f}%) | {raw[1]:.0f} -> {rebuilt[1]:.0f} us ({err[1]:.1f}%) |")
    return rows


def _bytes() -> list[str]:
    rng = np.random.default_rng(0)
    events = []
    for k in range(40):
        name = f"void at::native::vectorized_elementwise_kernel<4, at::native::kernel_{k}>(int, T, Arr)"
        d = np.r_[rng.lognormal(np.log(50 * (k + 1)), 0.05, 200), rng.lognormal(np.log(150 * (k + 1)), 0.05, 50)]
        events += [(name, float(x)) for x in d]
    point, names = KernelChannel(TAGS).window(1234, 1_770_000_000_000, events)
    m = schema.MEASUREMENTS[schema.KERNEL_STATS]
    frame = pd.DataFrame([point])
    fields = [c for c in frame.columns if c not in m.tags and c != "time"]
    size = sum(len(line) for line in encode_frame(schema.KERNEL_STATS, frame, list(m.tags), fields))
    trace = sum(len(json.dumps({"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 7, "ts": 1.7e15 + i,
                                "dur": round(d, 3), "args": {"stream": 7, "device": 0, "correlation": i}}))
                for i, (n, d) in enumerate(events))
    return [f"One window of {len(events):,} kernel events over 40 kernels (names of ~80 characters), top 16 kept: "
            f"a `kernel_stats` point of {len(fields)} fields, **{size:,} bytes** of line protocol "
            f"({size / 2:,.0f} bytes per profiled step at 2 steps a window); the same events as Chrome trace "
            f"events: {trace / 1e6:.2f} MB, {trace / size:,.0f}x more. Names, once per kernel an hour: "
            f"{len(names)} `kernel_name` points."]


def _window(rng) -> tuple[pd.DataFrame, dict[str, tuple[str, str]]]:
    cols: dict[str, object] = {"rank": np.arange(TOPO.world), "iteration": 99}
    names = {}
    base = rng.lognormal(np.log(50), 1.0, KERNELS)
    for k in range(KERNELS):
        kid = f"k{k:010x}"
        names[kid] = (f"kernel_{k}", "comm" if k % 5 == 0 else "compute")
        med = base[k] * (1 + 0.3 * TOPO.pp_index) * rng.lognormal(0, 0.02, TOPO.world)
        if k == SLOW_KERNEL:
            med[SLOW_RANK] *= 1.5
        cols[f"{kid}_m0_n"], cols[f"{kid}_m0_p50"], cols[f"{kid}_m0_p99"] = np.full(TOPO.world, 900.0), med, med * 1.12
        if k % 2 == 0:
            cols[f"{kid}_m1_n"], cols[f"{kid}_m1_p50"] = np.full(TOPO.world, 100.0), med * 3
            cols[f"{kid}_m1_p99"] = med * 3.3
    return pd.DataFrame(cols), names


def _analysis(ctx) -> list[str]:
    frame, names = _window(np.random.default_rng(0))
    found = kernel_findings(frame, names, TOPO)
    t = ctx.median_s(lambda: kernel_findings(frame, names, TOPO), repeat=3)
    hit = found[["rank", "name"]].values.tolist()
    return ["| ranks | kernels (half bimodal) | L3 per window (median of 3) | target | found | other findings |",
            "|---:|---:|---:|---:|---|---:|",
            f"| {TOPO.world:,} | {KERNELS} | **{t:.2f} s** | 2 s | {hit[:1]} (1.5x) | {max(len(hit) - 1, 0)} |"]


def run(ctx) -> str:
    t0 = time.perf_counter()
    lines = ["## Kernels (L3)", "", "### Compression of one kernel's window (`collector/kernel_modes.py`)", "",
             *_compression(ctx), "", "### Bytes per rank and window", "", *_bytes(), "",
             "### The analysis at 12,960 ranks, without the database", "", *_analysis(ctx), "",
             "The channel's overhead on a GPU (CUPTI/Kineto windows): **not measured on GPU** (none here).",
             "", f"Run time {time.perf_counter() - t0:.0f} s."]
    return "\n".join(lines)
