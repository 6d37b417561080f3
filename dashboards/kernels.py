"""L3 view: which ranks run which kernels slower than their group (``l3_kernel``).

The analyzer scores each rank's kernels against its data-parallel group's reference per window
of profiled steps (analyzer/score/kernel_scores.py) and writes the ranks that stand out. A
finding is confirmed once it holds two windows in a row. A collective slowed but hidden by
overlap (the iteration time flat) shows here and nowhere else: a warning to plan a drain, not a
page, since it costs nothing yet.
"""

from __future__ import annotations

from dashboards.panels import (
    DashboardSpec,
    HeatmapColor,
    Layout,
    dashboard_link,
    query_variable,
    rows_heatmap,
    source,
    table,
    target,
    timeseries,
)
from dashboards.variables import job_variable
from rankscope import schema

UID = "rankscope-kernels"
L3 = source(schema.L3_KERNEL)
#: Rows the heatmap may draw: ranks with a finding (the analyzer writes outliers only).
MAX_RANKS = 2000


def spec() -> DashboardSpec:
    lay = Layout()
    where = "\"job\" = '$job' AND \"kernel\" =~ /^$kernel$/ AND $timeFilter"
    heat = rows_heatmap(
        "Rank x kernel: ratio to the group's reference (ranks that stand out)",
        f"SELECT max(\"ratio\") FROM {L3} WHERE {where} GROUP BY time($__interval), \"rank\" fill(none)",
        lay.place(24, 10), row_tag="rank", max_rows=MAX_RANKS, unit="none",
        color=HeatmapColor(scheme="RdBu", scale="linear", min=0, max=6),
        description="Rows are the ranks the analyzer found slower than their data-parallel group in the "
                    "chosen kernels (all: the worst of them), columns the windows of profiled steps; 1 = "
                    "the group's reference. Ranks with no finding are not drawn.")
    lay.newline()
    confirmed = table(
        "Confirmed kernel findings (two windows in a row or more)",
        [target(f"SELECT last(\"name\") AS \"kernel\", last(\"kind\") AS \"kind\", last(\"cause\") AS \"cause\", "
                f"last(\"ratio\") AS \"ratio\", "
                f"last(\"w1_us\") AS \"W1 us\", last(\"shift_us\") AS \"slower by us\", "
                f"last(\"windows\") AS \"windows\", last(\"group_id\") AS \"dp group\" FROM {L3} "
                f"WHERE {where} AND \"confirmed\" = 1 GROUP BY \"host\", \"rank\", \"kernel\"", table=True)],
        lay.place(24, 9), sort_by="ratio",
        description="cause own: a compute kernel slow on the ranks of one host, that machine; link: a "
                    "collective slow on all members of its group (no one waited), the group's link degrading "
                    "behind overlap when the iteration time is flat: no cost yet, plan the repair.")
    lay.newline()
    trend = timeseries(
        "Trend of the confirmed findings (ratio per window)",
        [target(f"SELECT max(\"ratio\") FROM {L3} WHERE {where} AND \"confirmed\" = 1 "
                f"GROUP BY time($__interval), \"host\", \"kernel\" fill(none)", alias="$tag_host $tag_kernel")],
        lay.place(24, 8), unit="none",
        description="Growing: the kernel is degrading. The kernel ids are hashes of the names shown above.")
    return DashboardSpec(
        uid=UID, title="rankscope / L3 kernels",
        description="Kernel-level findings: rank x kernel ratio to the group, confirmed findings, trend.",
        panels=[heat, confirmed, trend],
        variables=[job_variable(), query_variable(
            "kernel", "kernel id", f"SHOW TAG VALUES FROM {L3} WITH KEY = \"kernel\" WHERE \"job\" = '$job'",
            multi=True, include_all=True, default="All", sort=1)],
        time_from="now-6h", refresh="1m",
        links=[dashboard_link("NOC overview", "rankscope-noc", include_vars=False),
               dashboard_link("L2 parallel groups", "rankscope-l2")],
    )
