"""NOC overview: the wall display. Big numbers, few panels, readable across the room.

Per-job iteration time (median and max over ranks), L1 change points and
incidents as annotations, the open incidents and the top suspect ranks.
"""

from __future__ import annotations

from dashboards.panels import (
    DashboardSpec,
    InfluxAnnotation,
    Layout,
    dashboard_link,
    stat,
    table,
    target,
    timeseries,
)
from dashboards.variables import job_variable

UID = "rankscope-noc"
JOB = "\"job\" =~ /^$job$/"
#: Open incidents are listed whatever the dashboard's time range (their onset may be older).
OPEN_WINDOW = "time > now() - 30d"


def spec() -> DashboardSpec:
    lay = Layout()
    open_count = stat(
        "Open incidents", [target(f"SELECT count(\"title\") FROM \"incident\" WHERE \"status\" = 'open' "
                                  f"AND {JOB} AND {OPEN_WINDOW}")],
        lay.place(4, 6), description="Incidents the analyzer has open now (any job selected).")
    worst = stat(
        "Slowest iteration (max over ranks)",
        [target(f"SELECT max(\"iteration_ms\") / 1000 FROM \"stage_latency\" WHERE {JOB} AND $timeFilter "
                f"GROUP BY time($__interval) fill(none)")],
        lay.place(4, 6), unit="s", calc="lastNotNull",
        thresholds=(("green", None), ("orange", 45), ("red", 60)),
        description="Iteration time of the slowest rank in the latest interval.")
    iteration = timeseries(
        "Iteration time per job (median and max over ranks)",
        [target(f"SELECT median(\"iteration_ms\") / 1000 AS \"median\", max(\"iteration_ms\") / 1000 AS \"max\" "
                f"FROM \"stage_latency\" WHERE {JOB} AND $timeFilter GROUP BY time($__interval), \"job\" fill(none)",
                alias="$tag_job $col")],
        lay.place(16, 12), unit="s", lineWidth=3,
        description="A step here is an L1 change point (red marks); a gap between median and max "
                    "points at stragglers.")
    lay.newline()
    incidents = table(
        "Open incidents",
        [target(f"SELECT \"class\", \"nodes\", \"ranks\", \"stage\", \"ratio\", \"onset_iteration\", \"title\" "
                f"FROM \"incident\" WHERE \"status\" = 'open' AND {JOB} AND {OPEN_WINDOW} GROUP BY \"job\"",
                table=True)],
        lay.place(14, 9), sort_by="Time",
        description="One row per open incident: fault class, culprit node and ranks, the stage and its "
                    "ratio to the group median, and since when (Time = onset).")
    suspects = table(
        "Top suspect ranks (ratio to group median)",
        [target(f"SELECT max(\"ratio\") AS \"ratio\", last(\"value\") AS \"ms\" FROM \"l2_rank\" WHERE {JOB} "
                f"AND $timeFilter GROUP BY \"job\", \"rank\", \"node\", \"stage\"", table=True)],
        lay.place(10, 9), sort_by="ratio",
        description="Ranks whose stage time is furthest from their group's median in the time range.")
    return DashboardSpec(
        uid=UID, title="rankscope / NOC overview",
        description="Iteration time of every job, open fail-slow incidents, top suspect ranks.",
        panels=[open_count, worst, iteration, incidents, suspects],
        variables=[job_variable(multi=True)],
        annotations=[
            InfluxAnnotation("L1 change points",
                             f"SELECT \"text\", \"magnitude\" FROM \"l1_changepoint\" WHERE {JOB} "
                             f"AND \"scope\" = 'job' AND $timeFilter", text_column="text", color="orange"),
            InfluxAnnotation("Incidents",
                             f"SELECT \"title\", \"text\", \"tags\" FROM \"incident\" WHERE {JOB} AND $timeFilter",
                             text_column="text", title_column="title", tags_column="tags", color="red"),
        ],
        time_from="now-3h", refresh="30s",
        links=[dashboard_link("Rank x stage heatmap", "rankscope-heatmap"),
               dashboard_link("L2 groups", "rankscope-l2"),
               dashboard_link("Incident drill-down", "rankscope-incident")],
    )
