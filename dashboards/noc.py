"""NOC overview: the wall display. Big numbers, few panels, readable across the room.

Per-job iteration time (median, p99 and max over ranks) and the slowest rank, L1 change
points and incidents as annotations, the open incidents with their hosts and cost, the top
suspect ranks, the hosts with the most incidents over 30 days (every job: the first to drain),
rankscope's actions (annotations and a table) and the times to detect and recover. Every panel reads the analyzer's rollups and outputs (kept long, a few points
per iteration), never the raw per-rank points, so a wall over hours answers at once.
"""

from __future__ import annotations

from dashboards.action_panels import action_annotation, actions_table, recovery_times
from dashboards.panels import (
    DashboardSpec,
    InfluxAnnotation,
    Layout,
    dashboard_link,
    source,
    stat,
    table,
    target,
    timeseries,
)
from dashboards.variables import job_variable
from rankscope import schema

UID = "rankscope-noc"
JOB = "\"job\" =~ /^$job$/"
#: Open incidents are listed whatever the dashboard's time range (their onset may be older).
OPEN_WINDOW = "time > now() - 30d"
ROLLUP_JOB = source(schema.ROLLUP_JOB)
INCIDENT = source(schema.INCIDENT)
#: Rows of the repeat offenders' table.
TOP_HOSTS = 20
#: ``incident_host`` rows that name a machine: not a pipeline imbalance's ``all``, nor ``node N``
#: (a job without host names: node numbers are the job's own, not machines across jobs).
MACHINES = "\"host\" != 'all' AND \"host\" !~ /^node [0-9]+$/"


def _headline(lay: Layout) -> list:
    """The top row: open incidents, the slowest iteration, completeness, the slowest rank per job."""
    open_count = stat(
        "Open incidents", [target(f"SELECT count(\"title\") FROM {INCIDENT} WHERE \"status\" = 'open' "
                                  f"AND {JOB} AND {OPEN_WINDOW}")],
        lay.place(4, 6), description="Incidents the analyzer has open now (any job selected).")
    worst = stat(
        "Slowest iteration (max over ranks)",
        [target(f"SELECT max(\"max_ms\") / 1000 FROM {ROLLUP_JOB} WHERE {JOB} AND $timeFilter "
                f"GROUP BY time($__interval) fill(none)")],
        lay.place(4, 6), unit="s", calc="lastNotNull",
        thresholds=(("green", None), ("orange", 45), ("red", 60)),
        description="Iteration time of the slowest rank in the latest interval.")
    complete = stat(
        "Data completeness (points received / expected)",
        [target(f"SELECT min(\"completeness\") * 100 FROM {source(schema.JOB_HEALTH)} WHERE {JOB} AND "
                f"$timeFilter GROUP BY time($__interval) fill(none)")],
        lay.place(4, 6), unit="percent", calc="lastNotNull",
        thresholds=(("red", None), ("orange", 95), ("green", 99)),
        description="Points the collectors delivered against those expected (every rank, every "
                    "iteration, since the analyzer started), worst job selected. Writers drop points "
                    "under back-pressure: a gap now and then is counted here, never an incident; a "
                    "rank that stops reporting is a silent_rank incident.")
    slowest = table(
        "Slowest rank per job (latest iteration)",
        [target(f"SELECT last(\"max_ms\") / 1000 AS \"slowest s\", last(\"median_ms\") / 1000 AS \"median s\", "
                f"last(\"slowest_rank\") AS \"rank\", last(\"slowest_host\") AS \"host\", "
                f"last(\"iteration\") AS \"iteration\" FROM {ROLLUP_JOB} WHERE {JOB} AND $timeFilter "
                f"GROUP BY \"job\"", table=True)],
        lay.place(12, 6), sort_by="slowest s",
        description="The rank that took longest in each job's latest iteration, the host it runs on, "
                    "and the job's median for comparison.")
    return [open_count, worst, complete, slowest]


def _iteration_time(lay: Layout):
    return timeseries(
        "Iteration time per job (median, p99 and max over ranks)",
        [target(f"SELECT mean(\"median_ms\") / 1000 AS \"median\", max(\"p99_ms\") / 1000 AS \"p99\", "
                f"max(\"max_ms\") / 1000 AS \"max\" FROM {ROLLUP_JOB} WHERE {JOB} AND $timeFilter "
                f"GROUP BY time($__interval), \"job\" fill(none)", alias="$tag_job $col")],
        lay.place(24, 11), unit="s", lineWidth=3,
        description="A step here is an L1 change point (orange marks); a gap between the median and "
                    "the p99 or max points at stragglers.")


def _incidents_and_suspects(lay: Layout) -> list:
    """The open incidents and the top suspect ranks, side by side."""
    incidents = table(
        "Open incidents",
        [target(f"SELECT \"class\", \"hosts\", \"ranks\", \"stage\", \"ratio\", \"hardware_verdict\", "
                f"\"slowdown\", \"gpu_hours_lost\", \"onset_iteration\", \"time_to_detect_s\", \"title\" FROM {INCIDENT} "
                f"WHERE \"status\" = 'open' AND {JOB} AND {OPEN_WINDOW} GROUP BY \"job\"", table=True)],
        lay.place(14, 9), sort_by="GPU-hours lost",
        overrides=[{"matcher": {"id": "byName", "options": "gpu_hours_lost"},
                    "properties": [{"id": "displayName", "value": "GPU-hours lost"},
                                   {"id": "decimals", "value": 0}]},
                   {"matcher": {"id": "byName", "options": "hardware_verdict"},
                    "properties": [{"id": "displayName", "value": "GPU telemetry"}]},
                   {"matcher": {"id": "byName", "options": "slowdown"},
                    "properties": [{"id": "unit", "value": "x"}, {"id": "decimals", "value": 2}]}],
        description="One row per open incident, costliest first: fault class, the hosts to drain, culprit "
                    "ranks, the stage and its ratio to the group median, what the culprit GPUs' own telemetry "
                    "says (hardware_fault and why, no_hardware_signal, no_data, unavailable), how much slower the job runs "
                    "and the GPU-hours lost so far, and since when (Time = onset).")
    suspects = table(
        "Top suspect ranks (ratio to group median)",
        [target(f"SELECT max(\"ratio\") AS \"ratio\", last(\"value\") AS \"ms\" FROM {source(schema.L2_RANK)} "
                f"WHERE {JOB} AND $timeFilter GROUP BY \"job\", \"rank\", \"node\", \"stage\"", table=True)],
        lay.place(10, 9), sort_by="ratio",
        description="Ranks whose stage time is furthest from their group's median in the time range.")
    return [incidents, suspects]


def _repeat_offenders(lay: Layout):
    """The hosts that were culprits most often over 30 days, every job: the first to drain. Each
    incident (``job`` + ``id``) counts once per host, whatever points it left (innermost query)."""
    return table(
        "Hosts with the most incidents, 30 days",
        [target(f"SELECT top(\"incidents\", \"host\", {TOP_HOSTS}) AS \"incidents\", \"gpu_hours_lost\" FROM ("
                f"SELECT count(\"n\") AS \"incidents\", sum(\"gpu_hours_lost\") AS \"gpu_hours_lost\" FROM ("
                f"SELECT count(\"status\") AS \"n\", max(\"gpu_hours_lost\") AS \"gpu_hours_lost\" "
                f"FROM {source(schema.INCIDENT_HOST)} WHERE {MACHINES} AND {OPEN_WINDOW} "
                f"GROUP BY \"host\", \"job\", \"id\") GROUP BY \"host\")",
                table=True)],
        lay.place(10, 9), sort_by="incidents",
        transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True}, "indexByName": {
            "host": 0, "incidents": 1, "gpu_hours_lost": 2}}}],
        overrides=[{"matcher": {"id": "byName", "options": "gpu_hours_lost"},
                    "properties": [{"id": "displayName", "value": "GPU-hours lost"},
                                   {"id": "decimals", "value": 0}]}],
        description=f"The {TOP_HOSTS} hosts named culprit in the most incidents (open or resolved) whose onset "
                    "is in the last 30 days, in every job whichever is selected, and the GPU-hours those "
                    "incidents cost their jobs. A host that slows again in another job is the first to drain; "
                    "the incident's verdict says the same (its record).")


def _actions_and_recovery(lay: Layout) -> list:
    """What rankscope did (the actions' latest states), then the times to detect and recover."""
    lay.newline()
    actions = actions_table(lay, JOB)
    lay.newline()
    return [actions, *recovery_times(lay, JOB)]


def _annotations() -> list[InfluxAnnotation]:
    return [
        InfluxAnnotation("L1 change points",
                         f"SELECT \"text\", \"magnitude\" FROM {source(schema.L1_CHANGEPOINT)} WHERE {JOB} "
                         f"AND \"scope\" = 'job' AND $timeFilter", text_column="text", color="orange"),
        InfluxAnnotation("Incidents",
                         f"SELECT \"title\", \"text\", \"tags\" FROM {INCIDENT} WHERE {JOB} AND $timeFilter",
                         text_column="text", title_column="title", tags_column="tags", color="red"),
        InfluxAnnotation("Restarts and job ends",
                         f"SELECT \"text\", \"event\" FROM {source(schema.JOB_LIFECYCLE)} WHERE {JOB} AND $timeFilter",
                         text_column="text", tags_column="event", color="blue"),
        action_annotation(JOB),
    ]


def spec() -> DashboardSpec:
    lay = Layout()
    headline = _headline(lay)
    lay.newline()
    iteration = _iteration_time(lay)
    lay.newline()
    return DashboardSpec(
        uid=UID, title="rankscope / NOC overview",
        description="Iteration time of every job, open fail-slow incidents and their cost, top suspect ranks.",
        panels=[*headline, iteration, *_incidents_and_suspects(lay), _repeat_offenders(lay),
                *_actions_and_recovery(lay)],
        variables=[job_variable(multi=True)],
        annotations=_annotations(),
        time_from="now-6h", refresh="30s",
        links=[dashboard_link("Rank x stage heatmap", "rankscope-heatmap"),
               dashboard_link("L2 groups", "rankscope-l2"),
               dashboard_link("Incident drill-down", "rankscope-incident")],
    )
