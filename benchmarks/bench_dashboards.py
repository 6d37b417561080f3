"""Dashboards: what row aggregation saves a heatmap at 12,960 ranks, generation, the report."""

from __future__ import annotations

import tempfile
import time
import uuid

from dashboards import provisioning
from dashboards.report import write_report
from rankscope.store import InfluxStore
from tests.grafana_macros import influx_query
from tests.il0477_store import ITERATIONS, write_schema_points


def run(ctx) -> str:
    db = f"bench_dash_{uuid.uuid4().hex[:8]}"
    store = InfluxStore(ctx.influx_url, bucket=db, api="v1")
    start = (int(time.time() * 1000) - 3 * 3600_000) // 60_000 * 60_000
    try:
        t0 = time.perf_counter()
        write_schema_points(store, "il-0477", start)
        fill_s = time.perf_counter() - t0
        tf = f"time >= {start}ms and time <= {start + ITERATIONS * 60_000}ms"
        base = f"SELECT mean(\"mlp\") FROM \"stage_latency\" WHERE \"job\" = 'il-0477' AND {tf} GROUP BY time(10s), "
        queries = {
            "per node (1,620 rows, the overview panel)": base + "\"node\" fill(none)",
            "per rank, whole job (12,960 rows, not drawable)": base + "\"rank\" fill(none)",
            "per rank, 3 dp ranges (96 rows, the drill-down)":
                base.replace("AND time", "AND \"ep_group\" =~ /^(322|323|324)$/ AND time") + "\"rank\" fill(none)",
        }
        series = {k: len(influx_query(ctx.influx_url, db, q).series) for k, q in queries.items()}
        times = ctx.side_by_side({k: (lambda q=q: influx_query(ctx.influx_url, db, q)) for k, q in queries.items()},
                                 repeat=min(ctx.repeat, 3))
        gen_s = ctx.median_s(provisioning.render_all, repeat=3)
        with tempfile.TemporaryDirectory() as out:
            report_s = ctx.median_s(lambda: write_report(store, "il-0477", out), repeat=1, warmup=0)
    finally:
        store.drop_database()
        store.close()
    naive = times["per rank, whole job (12,960 rows, not drawable)"]
    lines = ["## Dashboards", "",
             f"IL-0477 at full scale (12,960 ranks x {ITERATIONS} iterations, written in {fill_s:.1f} s) on "
             "the test InfluxDB 1.6.7; heatmap queries of `mlp` as Grafana sends them (`$__interval` = 10s), "
             "measured side by side:", "",
             "| heatmap query | series (rows drawn) | median | vs per rank, whole job |",
             "| --- | --- | --- | --- |"]
    for k, s in times.items():
        lines.append(f"| {k} | {series[k]:,} | {s * 1000:.0f} ms | {s / naive:.3f}x |")
    lines += ["", f"- `rankscope dashboards generate` (render all 7 files): {gen_s * 1000:.0f} ms median.",
              f"- `rankscope report` for the IL-0477 incident (read ~20 iterations of every rank either side "
              f"of the onset, draw 5 figures): {report_s:.1f} s."]
    return "\n".join(lines)
